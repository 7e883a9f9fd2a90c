"""The HTTP providers: one transport for every LLM API openstarry speaks.

:class:`HTTPProvider` does the I/O for a :class:`~openstarry.providers.wire.WireAPI`
(OpenAI Chat Completions, OpenAI Responses, Anthropic Messages, Gemini): it
sends the request the API's translator builds, with httpx, retries what is
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
one httpx client, and its pooled connections, for every call made meanwhile;
outside it each call opens a client and closes it before returning, so a
provider that nobody closes leaks no socket.
"""

from __future__ import annotations

try:
    import httpx
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without httpx
    raise ImportError(
        "openstarry's HTTP providers need httpx: pip install 'openstarry[http]'"
    ) from exc

import contextlib
import dataclasses
import email.utils
import functools
import json
import logging
import math
import os
import random
import re
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Final

import anyio

from openstarry import core, protocol, sse
from openstarry.agent.registry import SchemaCache
from openstarry.core import __version__
from openstarry.errors import AgentPainException, ManifestError, ProviderError
from openstarry.providers._common import TransientProviderError
from openstarry.providers.wire import ToolNameMap
from openstarry.tracecontext import current_traceparent

if TYPE_CHECKING:
    from types import TracebackType

    from openstarry.agent.interfaces import AgentContext, Tool
    from openstarry.protocol import ProviderResponse
    from openstarry.providers import ProviderConfigLike
    from openstarry.providers.wire import StreamAssembler, WireAPI

__all__ = [
    "MAX_RETRY_AFTER",
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
#: The most of an error response read for its message.
MAX_ERROR_BODY: Final = 64 * 1024
#: The longest line of a server-sent event stream, in characters.
MAX_SSE_LINE: Final = sse.MAX_LINE
#: The most data one server-sent event may carry, in characters.
MAX_SSE_EVENT: Final = sse.MAX_EVENT
#: Tool sets whose translated declarations a provider keeps.
TOOL_SET_CACHE: Final = 64

_REDACTED: Final = "[redacted]"
#: What an API key may hold: visible ASCII characters, as a header value carries them.
_KEY_CHARS: Final = re.compile(r"[\x21-\x7e]+")


# --- options -------------------------------------------------------------------------------------


#: Each transport option's name in ``agent.json``, and its snake_case alias.
_OPTION_NAMES: Final = {
    "stream": "stream",
    "timeout": "timeout",
    "maxRetries": "max_retries",
    "retryBackoff": "retry_backoff",
    "maxResponseBytes": "max_response_bytes",
}


@dataclass(frozen=True, slots=True)
class TransportOptions:
    """How :class:`HTTPProvider` talks to its server (see the module's documentation).

    Attributes:
        stream: Ask for a streamed response.
        timeout: Seconds to connect, and seconds the server may stay silent.
        max_retries: Further attempts after a failed one.
        retry_backoff: The first wait between attempts, in seconds.
        max_response_bytes: The largest response read.
    """

    stream: bool = True
    timeout: float = 60.0
    max_retries: int = 3
    retry_backoff: float = 0.5
    max_response_bytes: int = 16 * 1024 * 1024

    @classmethod
    def split(cls, options: Mapping[str, Any] | None) -> tuple[TransportOptions, dict[str, Any]]:
        """The transport options of ``options``, and what is left for the translator.

        Raises:
            ManifestError: for a bad value, with ``field="provider.options.<name>"``.
        """
        rest = dict(options or {})
        values: dict[str, Any] = {}
        for camel, snake in _OPTION_NAMES.items():
            given = [name for name in dict.fromkeys((camel, snake)) if name in rest]
            if len(given) > 1:
                raise ManifestError(
                    f"give {camel!r} or {snake!r}, not both", field=f"provider.options.{camel}"
                )
            if given:
                values[snake] = _check_option(camel, rest.pop(given[0]))
        return cls(**values), rest


def _check_option(name: str, value: Any) -> Any:
    """``value`` of transport option ``name``, checked (seconds as a float)."""
    if name == "stream":
        ok, expected = isinstance(value, bool), "true or false"
    elif name in ("maxRetries", "maxResponseBytes"):
        low, high = (0, 10) if name == "maxRetries" else (1024, 1 << 30)
        ok = type(value) is int and low <= value <= high
        expected = f"an integer from {low} to {high}"
    else:  # timeout, retryBackoff
        low_f = 0.0 if name == "retryBackoff" else 0.001
        ok = type(value) in (int, float) and math.isfinite(value) and low_f <= value <= 3600
        expected = f"a number of seconds from {low_f:g} to 3600"
        value = float(value) if ok else value
    if not ok:
        raise ManifestError(
            f"provider option {name!r} must be {expected}, not {value!r}",
            field=f"provider.options.{name}",
        )
    return value


# --- server-sent events --------------------------------------------------------------------------


class SSEError(ProviderError):
    """A server-sent event stream that breaks the size bounds."""


class SSEDecoder:
    """Server-sent events from a byte stream, as ``(event name or None, data)`` pairs.

    The stream is read by :class:`openstarry.sse.SSEReader`, by the rules that
    module states (lines end in CRLF, LF or CR only; several ``data:`` lines
    make one multi-line value; comments, ``id:``, ``retry:`` and unknown fields
    are ignored here; an event without data is not dispatched; an event still
    open when the stream ends is dropped). The API translators need only each
    event's name and data.

    Args:
        max_line: The longest line, in characters.
        max_event: The most data one event may carry, in characters.

    Raises:
        SSEError: from :meth:`feed` and :meth:`close`, for a line or an event beyond the bounds.
    """

    __slots__ = ("_reader",)

    def __init__(self, max_line: int = MAX_SSE_LINE, max_event: int = MAX_SSE_EVENT) -> None:
        self._reader = sse.SSEReader(max_line, max_event, error=SSEError)

    @property
    def max_line(self) -> int:
        """The longest line, in characters."""
        return self._reader.lines.max_line

    @property
    def max_event(self) -> int:
        """The most data one event may carry, in characters."""
        return self._reader.parser.max_event

    def feed(self, chunk: bytes) -> list[tuple[str | None, str]]:
        """The events that ``chunk`` completes, in order: ``(event name or None, data)``."""
        return [(event.event, event.data) for event in self._reader.feed(chunk)]

    def close(self) -> list[tuple[str | None, str]]:
        """The end of the stream: complete what the last bytes held (an open event is dropped)."""
        return [(event.event, event.data) for event in self._reader.close()]


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


class _Retry(Exception):
    """An attempt failed in a way worth another attempt."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class _StreamCut(_Retry):
    """A stream broke off before any of its text was passed on (finished if it was the last try)."""

    def __init__(self, message: str, assembler: StreamAssembler) -> None:
        super().__init__(message)
        self.assembler = assembler


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One TLS context for every client: loading the CA bundle takes milliseconds."""
    return httpx.create_ssl_context()


class HTTPProvider:
    """A provider that calls an LLM API over HTTP (see the module's documentation).

    Args:
        api: The API's translator.
        model: The model to ask for.
        base_url: The server's base URL (``https://host/v1``); by default the API's own.
        api_key_env: The environment variable holding the key; by default the API's.
        options: ``provider.options``: the transport's options, and the
            translator's (``temperature``, ``max_tokens``...).

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
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise ManifestError(
                f"provider {api.name!r} needs a model (provider.model)", field="provider.model"
            )
        if base_url is not None:
            url = httpx.URL(base_url) if _is_http_url(base_url) else None
            if url is None or not url.host:
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
        self._client: httpx.AsyncClient | None = None
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
        except Exception:
            return

    @classmethod
    def from_config(cls, api: WireAPI, config: ProviderConfigLike) -> HTTPProvider:
        """The provider a manifest's ``provider`` section describes, for ``api``."""
        return cls(
            api,
            config.model,
            base_url=config.base_url,
            api_key_env=config.api_key_env,
            options=config.options,
        )

    def __repr__(self) -> str:
        return f"<HTTPProvider {self.name} model={self.model!r} base_url={self.base_url!r}>"

    # -- connections --

    async def __aenter__(self) -> HTTPProvider:
        if self._client is None:
            self._client = self._new_client()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the kept client and its connections (calls afterwards open their own)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _new_client(self) -> httpx.AsyncClient:
        timeout = self.transport.timeout
        verify: ssl.SSLContext | bool = (
            _ssl_context() if self.base_url.startswith("https:") else True
        )
        return httpx.AsyncClient(
            timeout=httpx.Timeout(timeout),
            verify=verify,
            follow_redirects=False,
            headers={"user-agent": f"openstarry/{__version__}"},
        )

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[httpx.AsyncClient]:
        if self._client is not None:
            yield self._client
            return
        async with self._new_client() as client:
            yield client

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
        headers = {k.lower(): v for k, v in self.api.headers(key).items()}
        headers.setdefault("content-type", "application/json")
        parent = current_traceparent()
        if parent is not None:
            headers.setdefault("traceparent", parent)
        if stream:
            headers.setdefault("accept", "text/event-stream")
        try:
            content = json.dumps(
                body, ensure_ascii=False, allow_nan=False, separators=(",", ":")
            ).encode()
        except (TypeError, ValueError) as exc:
            raise ProviderError(f"{self.name}: the request cannot be sent as JSON: {exc}") from None
        attempts = self.transport.max_retries + 1
        async with self._session() as client:
            attempt = 0
            while True:
                attempt += 1
                try:
                    response = await self._attempt(
                        client, url, headers, content, context, tool_set.names, key, stream=stream
                    )
                    break
                except _Retry as failure:
                    message = _redact(failure.message, key)
                    if attempt >= attempts:
                        if isinstance(failure, _StreamCut):
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
                # httpx and h11 would refuse the header with a message quoting it.
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

    async def _attempt(
        self,
        client: httpx.AsyncClient,
        url: str,
        headers: Mapping[str, str],
        content: bytes,
        context: AgentContext,
        names: ToolNameMap,
        key: str | None,
        *,
        stream: bool,
    ) -> ProviderResponse:
        where = _display_url(url)
        timeout = self.transport.timeout
        request = client.build_request("POST", url, content=content, headers=headers)
        try:
            response = await client.send(request, stream=True)
        except httpx.ConnectTimeout:
            raise _Retry(f"could not connect to {where} within {timeout:g} s") from None
        except httpx.TimeoutException:
            raise ProviderError(
                f"{self.name}: no answer from {where} within {timeout:g} s "
                "(provider.options.timeout)"
            ) from None
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            # Refused, reset, or closed before any answer: the request was not served.
            raise _Retry(f"connection to {where} failed: {_describe(exc)}") from None
        except httpx.HTTPError as exc:
            raise ProviderError(
                f"{self.name}: request to {where} failed: {_redact(_describe(exc), key)}"
            ) from None
        try:
            status = response.status_code
            if status >= 400:
                raise await self._error(response, where, key)
            if status >= 300:
                raise self._redirected(response, where)
            content_type = response.headers.get("content-type", "")
            if stream and content_type.split(";")[0].strip().lower() == "text/event-stream":
                return await self._read_stream(response, context, names, where)
            raw = await self._read_body(response, where, self.transport.max_response_bytes)
            try:
                body = json.loads(raw)
            except ValueError:
                raise AgentPainException(
                    f"{self.name}: the answer from {where} is not JSON "
                    f"({content_type or 'no content type'}, {len(raw)} bytes)"
                ) from None
            return self.api.parse_response(body, names)
        finally:
            await response.aclose()

    def _redirected(self, response: httpx.Response, where: str) -> ProviderError:
        """A 3xx answer: redirects are not followed (the key would go along), so say where to."""
        location = response.headers.get("location", "")
        target = ""
        if location:
            try:
                target = _display_url(str(response.url.join(location)))
            except (httpx.InvalidURL, ValueError):
                target = ""
        to = f" to {target}" if target else ""
        return ProviderError(
            f"{self.name}: HTTP {response.status_code} from {where}: the server redirects{to}; "
            "openstarry does not follow redirects: set provider.baseUrl to the address it names"
        )

    async def _error(self, response: httpx.Response, where: str, key: str | None) -> Exception:
        """An error answer as a ``_Retry`` (429 and 5xx) or a ``ProviderError`` (the rest)."""
        status = response.status_code
        try:
            raw = await self._read_body(response, where, MAX_ERROR_BODY, truncate=True)
        except (_Retry, ProviderError):
            raw = b""
        text = raw.decode("utf-8", errors="replace")
        body: Any
        try:
            body = json.loads(text)
        except ValueError:
            body = text
        try:
            said = self.api.error_message(status, body)
        except Exception:
            said = ""
        said = _redact(" ".join(str(said).split())[:2000], key) or response.reason_phrase
        message = f"HTTP {status} from {where}: {said}"
        if (status == 429 and not _out_of_quota(body)) or status >= 500:
            return _Retry(message, _retry_after(response.headers))
        if status in (401, 403):
            message += f" (the key comes from {' or '.join(self.api_key_envs)})"
        return ProviderError(f"{self.name}: {message}")

    async def _read_body(
        self, response: httpx.Response, where: str, limit: int, *, truncate: bool = False
    ) -> bytes:
        declared = response.headers.get("content-length", "")
        if not truncate and declared.isdigit() and int(declared) > limit:
            raise ProviderError(
                f"{self.name}: the answer from {where} is {declared} bytes: "
                f"more than {limit} bytes (provider.options.maxResponseBytes)"
            )
        chunks: list[bytes] = []
        size = 0
        try:
            pieces = response.aiter_bytes()
            async for chunk in pieces:
                size += len(chunk)
                if size > limit:
                    await _abandon(response, pieces)
                    if not truncate:
                        raise ProviderError(
                            f"{self.name}: the answer from {where} is more than {limit} "
                            "bytes (provider.options.maxResponseBytes)"
                        )
                    chunks.append(chunk[: len(chunk) - (size - limit)])
                    break
                chunks.append(chunk)
        except httpx.TimeoutException:
            raise ProviderError(
                f"{self.name}: the answer from {where} stalled for "
                f"{self.transport.timeout:g} s (provider.options.timeout)"
            ) from None
        except httpx.TransportError as exc:
            raise _Retry(f"the answer from {where} broke off: {_describe(exc)}") from None
        return b"".join(chunks)

    async def _read_stream(
        self,
        response: httpx.Response,
        context: AgentContext,
        names: ToolNameMap,
        where: str,
    ) -> ProviderResponse:
        assembler = self.api.stream(names)
        decoder = SSEDecoder()
        limit = self.transport.max_response_bytes
        emitted = False
        size = 0
        broke: str | None = None
        pieces = response.aiter_bytes()
        try:
            async for chunk in pieces:
                size += len(chunk)
                if size > limit:
                    raise ProviderError(
                        f"{self.name}: the stream from {where} is more than {limit} bytes "
                        "(provider.options.maxResponseBytes)"
                    )
                emitted = _pass_on(decoder.feed(chunk), assembler, context) or emitted
            emitted = _pass_on(decoder.close(), assembler, context) or emitted
        except (ProviderError, AgentPainException) as exc:
            # The stream refused (its size, an event the assembler cannot take, an
            # error the API reported): stop reading first, so no half-read
            # generator is left behind (trio warns of one).
            await _abandon(response, pieces)
            if isinstance(exc, TransientProviderError) and not emitted:
                # Overloaded, say, before anything was passed on: worth another attempt.
                raise _Retry(str(exc)) from None
            raise
        except httpx.TimeoutException:
            if not emitted and not assembler.done:
                raise ProviderError(
                    f"{self.name}: the stream from {where} stalled for "
                    f"{self.transport.timeout:g} s (provider.options.timeout)"
                ) from None
            broke = f"stalled for {self.transport.timeout:g} s"
        except httpx.TransportError as exc:
            broke = f"broke off: {_describe(exc)}"
        if not assembler.done:
            why = broke or "ended before the answer was complete"
            if not emitted:
                raise _StreamCut(f"the stream from {where} {why}", assembler)
            logger.warning("%s: the stream from %s %s", self.name, where, why)
        return assembler.finish()


# --- helpers -------------------------------------------------------------------------------------


def _pass_on(
    events: list[tuple[str | None, str]], assembler: StreamAssembler, context: AgentContext
) -> bool:
    """Feed ``events`` to ``assembler``, their text to the context; whether any text went."""
    emitted = False
    for event, data in events:
        delta = assembler.feed(event, data)
        if delta:
            context.emit_text_delta(delta)
            emitted = True
    return emitted


async def _abandon(response: httpx.Response, pieces: AsyncIterator[bytes]) -> None:
    """Stop reading ``response`` half-way through ``pieces``, its ``aiter_bytes()``.

    httpx reads a body through a chain of async generators, and trio warns
    about any left half-done (httpx issue 3686); closing the generator we hold
    leaves the inner ones so. So the response is closed first, and ``pieces``
    then runs out: what was buffered, then an error from the closed connection.
    """
    await response.aclose()
    with contextlib.suppress(httpx.HTTPError):
        async for _ in pieces:
            pass


def _is_http_url(text: str) -> bool:
    return text.lower().startswith(("http://", "https://"))


def _display_url(url: str) -> str:
    """``url`` for messages: no user info, no query string."""
    parsed = httpx.URL(url)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}{parsed.path}"


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _redact(text: str, key: str | None) -> str:
    return text.replace(key, _REDACTED) if key else text


def _retry_after(headers: httpx.Headers) -> float | None:
    """The wait an answer asks for: ``retry-after-ms``, or ``Retry-After`` (seconds or a date)."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            value = float(millis) / 1000
        except ValueError:
            value = math.nan
        if math.isfinite(value):
            return max(value, 0.0)
    text = headers.get("retry-after")
    if text is None:
        return None
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        return max((when - datetime.now(timezone.utc)).total_seconds(), 0.0)
    return max(seconds, 0.0) if math.isfinite(seconds) else None


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

    Raises:
        AgentPainException: for a response the core refuses (nested too deep, say).
    """
    if isinstance(response, core.ProviderResponse):  # a translator may build the core's
        response = protocol.ProviderResponse.from_core(response)
    own = response.metadata
    merged: dict[str, Any] = (
        {} if own is None else dict(own) if isinstance(own, Mapping) else {"provider": own}
    )
    merged.update(metadata)
    try:
        return response.model_copy(update={"metadata": merged}).to_core()
    except ValueError as exc:
        raise AgentPainException(f"the API's answer cannot be carried: {exc}") from None


#: Error codes of a 429 that waiting does not cure: the account is out of credit
#: (OpenAI's ``insufficient_quota``), not sending too fast.
_QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached"})


def _out_of_quota(body: Any) -> bool:
    """Whether an error body says the account's quota is spent (not worth a retry)."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return False
    return any(error.get(key) in _QUOTA_CODES for key in ("code", "type"))
