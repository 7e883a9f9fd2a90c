"""What a provider factory is given and what it is: the types below the provider registry.

:class:`ProviderConfigLike` (a manifest's ``provider`` section, as a factory
reads it) and :data:`ProviderFactory` live here, under both the registry
(:mod:`openstarry.providers`) and the HTTP providers
(:mod:`openstarry.providers.http`, whose ``from_config`` takes one), so that
neither imports the other for them. Import them from :mod:`openstarry.providers`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from openstarry.agent.interfaces import Provider

__all__ = ["ProviderConfigLike", "ProviderFactory"]


class ProviderConfigLike(Protocol):
    """What a provider factory reads of a manifest's ``provider`` section.

    :class:`openstarry.manifest.ProviderConfig` has these attributes (snake_case
    in Python, camelCase in the manifest); so may any object a test builds (a
    ``types.SimpleNamespace`` does).
    """

    @property
    def name(self) -> str: ...
    @property
    def model(self) -> str | None: ...
    @property
    def options(self) -> Mapping[str, Any] | None: ...
    @property
    def base_url(self) -> str | None:
        """``baseUrl`` in ``agent.json``."""

    @property
    def api_key_env(self) -> str | None:
        """``apiKeyEnv`` in ``agent.json``: the variable's name, never the key."""


#: Makes a provider from its configuration. Raise :class:`~openstarry.errors.ManifestError`
#: (with ``field``) for a configuration it cannot use.
ProviderFactory = Callable[[ProviderConfigLike], "Provider"]
