"""The HTTP providers: one transport for every LLM API openstarry speaks.

:class:`HTTPProvider` does the I/O for a :class:`~openstarry.providers.wire.WireAPI`
(OpenAI Chat Completions, OpenAI Responses, Anthropic Messages, Gemini): it
sends the request the API's translator builds through its transport
(:mod:`openstarry.providers.transport`), retries what is
worth retrying, reads the answer whole or as a stream of server-sent events,
and hands it back to the translator. ``agent.json`` chooses one by name::

    "provider": {
        "name": "openai",                       // or openai-responses, anthropic, gemini
        "model": "gpt-4o-mini",
        "baseUrl": "http://127.0.0.1:11434/v1", // optional: Ollama, vLLM, llama.cpp's server...
        "apiKeyEnv": "OPENAI_API_KEY",          // optional: the variable's name, never the key
        "options": {"temperature": 0.2, "timeout": 30, "maxRetries": 2}
    }

The key is read from the environment variable at each call, so it can be set
after the agent starts; white space around it (the line break a file leaves)
is dropped, and a key with a space, a control character or a character
outside ASCII inside fails with a :class:`~openstarry.errors.ProviderError`
that names the variable. It goes into a request header and nowhere else: it is
never stored, logged, or put into an error message (where a server echoes it
in an error body, it is replaced by ``[redacted]``). Without a key, a provider
with the API's own base URL fails with a :class:`~openstarry.errors.ProviderError`
that names the variable; one with a ``baseUrl`` of its own sends no key, as
local servers need none.

Transport options, taken out of ``provider.options`` before the rest goes to
the translator (each also accepted in snake_case, ``max_retries``):

``stream`` (default ``true``)
    Ask for a streamed response: each piece of text reaches
    :meth:`~openstarry.agent.interfaces.AgentContext.emit_text_delta` as it
    arrives. A server that answers a streamed request with plain JSON is read
    as a whole response.
``timeout`` (default 60)
    Seconds to connect, and seconds the server may stay silent (before its
    answer starts, or between two pieces of a stream). The loop's
    ``limits.providerTimeout`` bounds the whole call, retries included.
``maxRetries`` (default 3)
    Further attempts after a failed one, 0 to 10.
``retryBackoff`` (default 0.5)
    The first wait between attempts, in seconds; it doubles at each retry
    (at most 8 s), with random jitter between half and all of it.
``maxResponseBytes`` (default 16 MiB)
    The largest response read; a longer one fails with a ``ProviderError``.
``streamReadInterval`` (default 0.001)
    The least time between two reads of a streamed answer, in seconds (0 to
    1): the text that arrives meanwhile is read, parsed and passed on at once,
    one wake-up of the event loop for many tokens instead of one each. A model
    that sends a token every few milliseconds is read token by token as
    before; a burst (a fast local model, a server that batches) costs a
    fraction of the CPU. 0 reads each piece as it arrives.

What is retried: a 429 (unless its error says the account is out of quota,
``insufficient_quota``), a 5xx, a connection that cannot be made or that
breaks before the answer is complete, a stream that breaks off before any of
its text was passed on, and a stream whose API reports, before any text, an
error that may pass (Anthropic's ``overloaded_error`` after a 200, say: a
:class:`~openstarry.providers._common.TransientProviderError`). A
``Retry-After`` (or ``retry-after-ms``) header sets the wait, up to 60 s; a
wait that would outlast the call's deadline fails at once instead. Other 4xx
answers are not retried (their message comes from the API's error body), nor
is a server that stays silent past ``timeout``.
A redirect (3xx) is not followed, as the key would go along to wherever it
points: it fails with a ``ProviderError`` that names the address (for
``provider.baseUrl``).
After the last attempt the call fails with a ``ProviderError`` that says why.

A stream that breaks off once some of its text was passed on is not retried
(the agent's listeners saw that text; a second answer would differ): the
translator's assembler decides what it was (spec 000 section 7: a text
segment saying the answer was cut short, or ``AgentPainException``). A stream
that breaks off before any text, on its last attempt, is decided the same way.

Tool declarations are translated once per tool set: the provider caches them
under the tool set's fingerprint
(:func:`openstarry.agent.registry.tool_set_fingerprint`), which each
response's ``metadata`` carries as ``tools_fingerprint``, with ``latency_ms``
(the call's duration, retries included).

Each request carries the W3C ``traceparent`` of the round that makes it (its
trace is the run's ``traceId``, its parent the round's ``openstarry.provider``
span: :mod:`openstarry.tracecontext`), so the spans of a model gateway or a
traced model server join the turn's trace; the API's own headers win.

Connections: ``async with provider:`` (or :meth:`HTTPProvider.aclose`) keeps
one transport, and its pooled keep-alive connections, for every call made
meanwhile; outside it each call opens a transport and closes it before
returning, so a provider that nobody closes leaks no socket. The transport is
openstarry's own HTTP/1.1 client, whose bytes the Rust core reads, or httpx's
where the environment names a proxy for the base URL; ``transport=`` gives a
provider one of your own (:mod:`openstarry.providers.transport`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import re
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import anyio

from openstarry import core, protocol
from openstarry.agent.registry import SchemaCache
from openstarry.core import __version__
from openstarry.errors import AgentPainException, ManifestError, ProviderError
from openstarry.providers._http_transport import (
    MAX_ERROR_BODY,
    MAX_SSE_EVENT,
    MAX_SSE_LINE,
    Exchange,
    Retry,
    SSEDecoder,
    SSEError,
    StreamCut,
    TransportOptions,
    redact,
)
from openstarry.providers.proxy import default_transport, proxied
from openstarry.providers.transport import Request, Transport
from openstarry.providers.wire import ToolNameMap
from openstarry.tracecontext import current_traceparent

if TYPE_CHECKING:
    from types import TracebackType

    from openstarry.agent.interfaces import AgentContext, Tool
    from openstarry.protocol import ProviderResponse
    from openstarry.providers._config import ProviderConfigLike
    from openstarry.providers.wire import WireAPI

__all__ = [
    "MAX_BACKOFF",
    "MAX_ERROR_BODY",
    "MAX_RETRY_AFTER",
    "MAX_SSE_EVENT",
    "MAX_SSE_LINE",
    "TOOL_SET_CACHE",
    "HTTPProvider",
    "SSEDecoder",
    "SSEError",
    "TransportOptions",
]

logger = logging.getLogger("openstarry.providers.http")

#: The longest wait a ``Retry-After`` header can impose, in seconds.
MAX_RETRY_AFTER: Final = 60.0
#: The longest exponential backoff between two attempts, in seconds.
MAX_BACKOFF: Final = 8.0
#: Tool sets whose translated declarations a provider keeps.
TOOL_SET_CACHE: Final = 64

#: What an API key may hold: visible ASCII characters, as a header value carries them.
_KEY_CHARS: Final = re.compile(r"[\x21-\x7e]+")


# --- the tool-set fingerprint and the declaration cache ------------------------------------------


@dataclass(slots=True)
class _ToolSet:
    """A tool set's wire names and, once known, the request keys that declare its tools."""

    fingerprint: str
    names: ToolNameMap
    #: The body keys the tools add (``tools``, ``tool_choice``...), or None before the first build.
    declarations: dict[str, Any] | None = None
    #: The translator's tool keys turned out to depend on more than the tools: build in full.
    uncacheable: bool = False


# --- the provider ---------------------------------------------------------------------------------


class HTTPProvider:
    """A provider that calls an LLM API over HTTP (see the module's documentation).

    Args:
        api: The API's translator.
        model: The model to ask for.
        base_url: The server's base URL (``https://host/v1``); by default the API's own.
        api_key_env: The environment variable holding the key; by default the API's.
        options: ``provider.options``: the transport's options, and the
            translator's (``temperature``, ``max_tokens``...).
        transport: What the requests go through
            (:mod:`openstarry.providers.transport`): a transport of your own
            (recording, a proxy, a client certificate, or a
            :class:`~openstarry.providers.transport.MockTransport` in tests),
            which the provider uses and never closes. By default the provider
            makes the one :func:`~openstarry.providers.proxy.default_transport`
            gives for its base URL (:mod:`openstarry.providers.proxy`).

    Raises:
        ManifestError: for a missing model, a base URL that is not http(s), a
            bad transport option, or an option the API's translator refuses
            (checked by building a request for an empty session); ``field``
            names it.
    """

    def __init__(
        self,
        api: WireAPI,
        model: str | None,
        *,
        base_url: str | None = None,
        api_key_env: str | None = None,
        options: Mapping[str, Any] | None = None,
        transport: Transport | None = None,
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise ManifestError(
                f"provider {api.name!r} needs a model (provider.model)", field="provider.model"
            )
        if base_url is not None and (not _is_http_url(base_url) or not _host_of(base_url)):
            raise ManifestError(
                f"provider.baseUrl must be an http:// or https:// URL, not {base_url!r}",
                field="provider.baseUrl",
            )
        if api_key_env is not None and (not api_key_env or "=" in api_key_env):
            raise ManifestError(
                f"provider.apiKeyEnv must name an environment variable, not {api_key_env!r}",
                field="provider.apiKeyEnv",
            )
        self.api = api
        self.name = api.name
        self.model = model
        self.custom_base_url = base_url is not None
        self.base_url = (base_url or api.default_base_url).rstrip("/")
        #: The variables the key is read from, the first one set: ``apiKeyEnv``,
        #: or the API's own (its ``api_key_envs`` when it has several, such as
        #: ``GEMINI_API_KEY`` then ``GOOGLE_API_KEY``).
        self.api_key_envs: tuple[str, ...] = (
            (api_key_env,)
            if api_key_env
            else tuple(getattr(api, "api_key_envs", ())) or (api.default_api_key_env,)
        )
        self.transport, self.options = TransportOptions.split(options)
        #: Each tool set's wire names and translated declarations, by fingerprint.
        self.tool_sets: SchemaCache[_ToolSet] = SchemaCache(TOOL_SET_CACHE)
        self._last_tool_set: tuple[list[str], list[Tool], _ToolSet] | None = None
        #: Calls that found their tool set's declarations already translated.
        self.tool_set_reuses = 0
        #: The transport given, used as it is and never closed here.
        self.given_transport = transport
        self._transport: Transport | None = None
        self._exchange = Exchange(self.name, self.api, self.transport, self.api_key_envs)
        if transport is None and proxied(self.base_url):
            import httpx  # noqa: F401 - the proxy's transport needs it: fail now, not at a call
        self._check_configuration()

    def _check_configuration(self) -> None:
        """Build a request for an empty session once, so that ``provider.options`` the
        translator refuses (a key openstarry sets itself, a bad ``max_tokens``) fail when
        the agent starts, not at its first input.

        Raises:
            ManifestError: what the translator says of the configuration.
        """
        from openstarry.agent.interfaces import AgentContext
        from openstarry.agent.memory import Session

        context = AgentContext(tools={}, session=Session("openstarry-configuration-check"))
        stream = self.transport.stream
        try:
            self.api.path(self.model, stream=stream)
            self.api.build_request(
                "",
                context,
                model=self.model,
                options=self.options,
                stream=stream,
                names=ToolNameMap(()),
            )
        except ManifestError:
            raise
        except Exception as exc:  # a defect of the translator, not of the configuration
            logger.warning(
                "%s: the check of provider.options failed unexpectedly (%s); the options are "
                "sent as they are, and a call may fail on them",
                self.name,
                f"{type(exc).__name__}: {exc}",
            )

    @classmethod
    def from_config(
        cls, api: WireAPI, config: ProviderConfigLike, *, transport: Transport | None = None
    ) -> HTTPProvider:
        """The provider a manifest's ``provider`` section describes, for ``api``."""
        return cls(
            api,
            config.model,
            base_url=config.base_url,
            api_key_env=config.api_key_env,
            options=config.options,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"<HTTPProvider {self.name} model={self.model!r} base_url={self.base_url!r}>"

    # -- connections --

    async def __aenter__(self) -> HTTPProvider:
        if self.given_transport is None and self._transport is None:
            self._transport = default_transport(self.base_url)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the kept transport and its connections (calls afterwards open their own)."""
        transport, self._transport = self._transport, None
        if transport is not None:
            await transport.aclose()

    # -- the call --

    async def generate(self, prompt: str, context: AgentContext) -> core.ProviderResponse:
        """Ask the API, with retries, and return its answer as a ``ProviderResponse``.

        Raises:
            ProviderError: no key where one is needed, an error answer, a
                timeout, or retries exhausted; the message says which.
            AgentPainException: an answer that cannot be understood (spec 000 section 7).
        """
        started = time.monotonic()
        key = self._api_key()
        tool_set = self._tool_set(context.tools)
        stream = self.transport.stream
        options, dropped = generation_options(self.api, self.options, context.generation)
        body = self._build(prompt, context, tool_set, stream=stream, options=options)
        url = self.base_url + self.api.path(self.model, stream=stream)
        headers = {"user-agent": _USER_AGENT}
        for name, value in self.api.headers(key).items():
            headers[name.lower()] = value
        headers.setdefault("content-type", "application/json")
        parent = current_traceparent()
        if parent is not None:
            headers.setdefault("traceparent", parent)
        if stream:
            headers.setdefault("accept", "text/event-stream")
        try:
            content = core.json_dumps(body)
        except (TypeError, ValueError) as exc:
            raise ProviderError(f"{self.name}: the request cannot be sent as JSON: {exc}") from None
        attempts = self.transport.max_retries + 1
        exchange = self._exchange
        options_ = self.transport
        request = Request(
            "POST",
            url,
            headers,
            content,
            options_.timeout,
            options_.stream_read_interval if stream else 0.0,
        )
        sender = self.given_transport or self._transport
        own = sender is None
        if sender is None:  # outside `async with`: a transport for this call alone
            sender = default_transport(self.base_url)
        try:
            attempt = 0
            while True:
                attempt += 1
                try:
                    response = await exchange.attempt(
                        sender, request, context, tool_set.names, key, stream=stream
                    )
                    break
                except Retry as failure:
                    message = redact(failure.message, key)
                    if attempt >= attempts:
                        if isinstance(failure, StreamCut):
                            response = failure.assembler.finish()
                            break
                        raise ProviderError(
                            f"{self.name}: {message} (gave up after {attempts} attempts)"
                        ) from None
                    wait = self._wait(attempt, failure.retry_after)
                    deadline = anyio.current_effective_deadline()
                    if anyio.current_time() + wait >= deadline:
                        raise ProviderError(
                            f"{self.name}: {message}; the next attempt, in {wait:.3g} s, "
                            "would come after the provider's deadline"
                        ) from None
                    logger.warning(
                        "%s: %s; attempt %d of %d in %.3g s",
                        self.name,
                        message,
                        attempt + 1,
                        attempts,
                        wait,
                    )
                    await anyio.sleep(wait)
        finally:
            if own:
                await sender.aclose()
        latency_ms = round((time.monotonic() - started) * 1000, 1)
        if dropped:
            return _as_core(
                response,
                tools_fingerprint=tool_set.fingerprint,
                latency_ms=latency_ms,
                droppedParameters=dropped,
            )
        return _as_core(response, tools_fingerprint=tool_set.fingerprint, latency_ms=latency_ms)

    def _api_key(self) -> str | None:
        """The key, from the first variable set; white space around it is dropped.

        Raises:
            ProviderError: no key where one is needed, or a key that cannot go
                into a header (the message names the variable, never the key).
        """
        for variable in self.api_key_envs:
            key = os.environ.get(variable, "").strip()
            if not key:
                continue
            if not _KEY_CHARS.fullmatch(key):
                # A header cannot carry it (and an HTTP client's refusal would quote it).
                raise ProviderError(
                    f"{self.name}: the API key in {variable} holds a space, a control "
                    "character or a character outside ASCII; an API key has none"
                )
            return key
        if self.custom_base_url:
            return None
        raise ProviderError(
            f"{self.name}: no API key: set the environment variable "
            f"{' or '.join(self.api_key_envs)} (or name another one in provider.apiKeyEnv)"
        )

    def _wait(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), MAX_RETRY_AFTER)
        ceiling = min(self.transport.retry_backoff * 2.0 ** (attempt - 1), MAX_BACKOFF)
        jitter: float = random.uniform(0.5, 1.0)
        return ceiling * jitter

    def _tool_set(self, tools: Mapping[str, Tool]) -> _ToolSet:
        # The same tools as on the previous call (every round of a run, most
        # runs of an agent) are recognised by identity, without hashing their
        # schemas: a fingerprint of a thousand tools takes milliseconds.
        names, values = list(tools), list(tools.values())
        last = self._last_tool_set
        if (
            last is not None
            and last[0] == names
            and all(a is b for a, b in zip(last[1], values, strict=True))
        ):
            self.tool_set_reuses += 1
            return last[2]
        key = SchemaCache.key_for(self.name, tools)
        misses = self.tool_sets.misses
        found = self.tool_sets.get_or_create(key, lambda: _ToolSet(key[1], ToolNameMap.of(tools)))
        if self.tool_sets.misses == misses:
            self.tool_set_reuses += 1
        self._last_tool_set = (names, values, found)
        return found

    def _build(
        self,
        prompt: str,
        context: AgentContext,
        tool_set: _ToolSet,
        *,
        stream: bool,
        options: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The request body, with the tool declarations translated once per tool set.

        The translator builds the whole body; to reuse the declarations, the
        provider builds the first body of a tool set twice, with the tools and
        without, and keeps the keys the tools added (``tools``, ``tool_choice``,
        ``toolConfig``...). Later bodies are built without the tools and get
        those keys back. When the two first bodies differ in anything else,
        the translator's tool keys depend on more than the tools, and that
        tool set is always built in full.
        """

        def build(ctx: AgentContext) -> dict[str, Any]:
            return self.api.build_request(
                prompt,
                ctx,
                model=self.model,
                options=self.options if options is None else options,
                stream=stream,
                names=tool_set.names,
            )

        if not context.tools or tool_set.uncacheable:
            return build(context)
        bare_context = dataclasses.replace(context, tools={})
        if tool_set.declarations is not None:
            body = build(bare_context)
            body.update(tool_set.declarations)
            return body
        full = build(context)
        try:
            bare = build(bare_context)
        except Exception:
            bare = None
        if bare is None or any(key not in full or full[key] != bare[key] for key in bare):
            tool_set.uncacheable = True
        else:
            tool_set.declarations = {k: v for k, v in full.items() if k not in bare}
        return full


# --- helpers -------------------------------------------------------------------------------------


#: The ``user-agent`` of every request.
_USER_AGENT: Final = f"openstarry/{__version__}"


def _is_http_url(text: str) -> bool:
    return text.lower().startswith(("http://", "https://"))


def _host_of(url: str) -> str | None:
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError:
        return None
    return parts.hostname


def generation_options(
    api: Any, options: Mapping[str, Any], generation: Mapping[str, Any]
) -> tuple[Mapping[str, Any], list[str]]:
    """``provider.options`` with a request's generation parameters mapped over them.

    ``api.generation_options`` maps each parameter the API has (``temperature``,
    ``max_tokens``...) to its option key (``max_output_tokens``,
    ``maxOutputTokens``...); the others are returned as dropped (``model``
    always: the manifest chooses the model). A parameter named differently by
    the API replaces the manifest's option of the parameter's own name, and a
    ``stop`` string becomes a one-item list where the API takes a list.
    """
    if not generation:
        return options, []
    names: Mapping[str, str] = getattr(api, "generation_options", {})
    merged = dict(options)
    dropped: list[str] = []
    for name, value in generation.items():
        key = names.get(name)
        if key is None:
            dropped.append(name)
            continue
        if key != name:
            merged.pop(name, None)
        if name == "stop" and key != "stop" and isinstance(value, str):
            value = [value]
        merged[key] = value
    return merged, dropped


def _as_core(
    response: ProviderResponse | core.ProviderResponse, **metadata: Any
) -> core.ProviderResponse:
    """The translator's response as the core's, with ``metadata`` added to its own.

    Segments the core's constructors can take field by field (those without
    fields of their own beyond the protocol's) are built directly; the others
    go through the protocol's JSON.

    Raises:
        AgentPainException: for a response the core refuses (nested too deep, say).
    """
    own = response.metadata
    merged: dict[str, Any] = (
        {} if own is None else dict(own) if isinstance(own, Mapping) else {"provider": own}
    )
    merged.update(metadata)
    try:
        if isinstance(response, core.ProviderResponse):
            return core.ProviderResponse(response.segments, merged)
        if response.model_extra:
            return response.model_copy(update={"metadata": merged}).to_core()
        return core.ProviderResponse([_segment(s) for s in response.segments], merged)
    except (ValueError, TypeError) as exc:
        raise AgentPainException(f"the API's answer cannot be carried: {exc}") from None


def _segment(segment: protocol.ContentSegment) -> core.ContentSegment:
    """``segment`` as the core's, built field by field when it has no fields of its own."""
    call = segment.tool_call
    if segment.model_extra or (call is not None and call.model_extra):
        return segment.to_core()
    return core.ContentSegment(
        segment.type,
        text=segment.text,
        data=segment.data,
        mime_type=segment.mime_type,
        tool_call=None if call is None else core.ToolCall(call.name, call.args, call.id),
        ui=segment.ui,
        signature=segment.signature,
    )
