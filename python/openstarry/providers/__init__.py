"""Providers by name: the registry that turns a manifest's ``provider`` section into a provider.

``create_provider(config)`` looks ``config.name`` up among the registered
factories and calls that factory with the whole config. ``"default"`` (the
offline :class:`~openstarry.providers.default.DefaultProvider`) is always there;
adapters for hosted models register themselves with :func:`register_provider`::

    from openstarry.providers import register_provider

    def make_echo(config: ProviderConfigLike) -> Provider:
        return EchoProvider(model=config.model)

    register_provider("echo", make_echo)

Four names call hosted LLM APIs over HTTP (:class:`openstarry.providers.http.HTTPProvider`,
the ``[http]`` extra): ``openai`` (Chat Completions, and any server that speaks
it: Ollama, vLLM, llama.cpp's server), ``openai-responses``, ``anthropic`` and
``gemini``. They are registered here but load httpx only when one is created;
without it, creating one raises an ``ImportError`` that says
``pip install 'openstarry[http]'``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from openstarry.errors import ManifestError
from openstarry.providers._config import ProviderConfigLike, ProviderFactory
from openstarry.providers.default import DefaultProvider

if TYPE_CHECKING:
    from openstarry.agent.interfaces import Provider

__all__ = [
    "HTTP_PROVIDERS",
    "DefaultProvider",
    "ProviderConfigLike",
    "ProviderFactory",
    "create_provider",
    "provider_names",
    "register_provider",
]


_FACTORIES: dict[str, ProviderFactory] = {}


def register_provider(name: str, factory: ProviderFactory) -> None:
    """Make ``create_provider`` build providers called ``name`` with ``factory``.

    Registering a name again replaces its factory (the last registration wins).

    Raises:
        ValueError: for an empty name.
        TypeError: when ``factory`` is not callable.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a provider name must be a non-empty string, not {name!r}")
    if not callable(factory):
        raise TypeError(f"the factory of provider {name!r} must be callable, not {factory!r}")
    _FACTORIES[name] = factory


def provider_names() -> tuple[str, ...]:
    """The registered provider names, sorted."""
    return tuple(sorted(_FACTORIES))


def create_provider(config: ProviderConfigLike) -> Provider:
    """The provider ``config`` describes, made by the factory registered under ``config.name``.

    Raises:
        ManifestError: for a name nobody registered (``field="provider.name"``),
            or what the factory raises for a configuration it cannot use.
    """
    factory = _FACTORIES.get(config.name)
    if factory is None:
        known = ", ".join(provider_names()) or "none"
        raise ManifestError(
            f"unknown provider {config.name!r}; known: {known}", field="provider.name"
        )
    return factory(config)


def _default_factory(config: ProviderConfigLike) -> Provider:
    """The offline provider; ``base_url`` and ``api_key_env`` mean nothing to it and are ignored."""
    try:
        return DefaultProvider(config.model, config.options)
    except ValueError as exc:
        raise ManifestError(str(exc), field="provider.options") from exc


register_provider("default", _default_factory)


#: The HTTP providers by name: the module and class of each one's API translator.
HTTP_PROVIDERS: Mapping[str, tuple[str, str]] = {
    "openai": ("openstarry.providers.openai_chat", "OpenAIChatAPI"),
    "openai-responses": ("openstarry.providers.openai_responses", "OpenAIResponsesAPI"),
    "anthropic": ("openstarry.providers.anthropic", "AnthropicAPI"),
    "gemini": ("openstarry.providers.gemini", "GeminiAPI"),
}


def _http_factory(name: str) -> ProviderFactory:
    """The factory of HTTP provider ``name``: imports the transport and the translator when
    called (httpx only where the environment names a proxy for the base URL)."""
    module_name, class_name = HTTP_PROVIDERS[name]

    def factory(config: ProviderConfigLike) -> Provider:
        from openstarry.providers.http import HTTPProvider

        api = getattr(importlib.import_module(module_name), class_name)()
        try:
            return HTTPProvider.from_config(api, config)
        except ImportError as exc:
            raise ImportError(
                f"provider {name!r} reaches its server through a proxy (HTTPS_PROXY, "
                "HTTP_PROXY or ALL_PROXY), which needs httpx: pip install 'openstarry[http]'"
            ) from exc

    factory.__name__ = factory.__qualname__ = f"make_{name.replace('-', '_')}_provider"
    return factory


for _name in HTTP_PROVIDERS:
    register_provider(_name, _http_factory(_name))
del _name
