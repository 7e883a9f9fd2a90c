"""The wire under :class:`~openstarry.providers.http.HTTPProvider`: one attempt, and what it reads.

The provider (:mod:`openstarry.providers.http`) builds the request, keeps the
httpx client, and decides whether to try again; this module makes one attempt
and says how it went. :class:`Exchange` sends the request and reads the answer
whole or as server-sent events (:class:`SSEDecoder`), passing streamed text on
as it arrives; a failure worth another attempt (a 429, a 5xx, a connection
that broke) comes out as :class:`Retry`, one that is not as a
:class:`~openstarry.errors.ProviderError`. :class:`TransportOptions` are the
``provider.options`` that shape all this (``stream``, ``timeout``,
``maxRetries``...). Nothing here stores or logs the API key: messages pass
through :func:`redact`.
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Final, cast

from openstarry import core, sse
from openstarry.errors import AgentPainException, ManifestError, ProviderError
from openstarry.providers._common import TransientProviderError, loads
from openstarry.providers.transport import (
    ConnectError,
    ConnectTimeout,
    ReadTimeout,
    RemoteProtocolError,
    Request,
    Response,
    ResponseTooLarge,
    Transport,
    TransportError,
    display_url,
)

if TYPE_CHECKING:
    from openstarry.agent.interfaces import AgentContext
    from openstarry.protocol import ProviderResponse
    from openstarry.providers.wire import StreamAssembler, ToolNameMap, WireAPI

__all__ = [
    "MAX_ERROR_BODY",
    "MAX_SSE_EVENT",
    "MAX_SSE_LINE",
    "Exchange",
    "Retry",
    "SSEDecoder",
    "SSEError",
    "StreamCut",
    "TransportOptions",
    "redact",
]

#: The provider's logger: the warnings of a stream that broke off go there.
logger = logging.getLogger("openstarry.providers.http")

#: The most of an error response read for its message.
MAX_ERROR_BODY: Final = 64 * 1024
#: The longest line of a server-sent event stream, in characters.
MAX_SSE_LINE: Final = sse.MAX_LINE
#: The most data one server-sent event may carry, in characters.
MAX_SSE_EVENT: Final = sse.MAX_EVENT
_REDACTED: Final = "[redacted]"


# --- options -------------------------------------------------------------------------------------


#: Each transport option's name in ``agent.json``, and its snake_case alias.
_OPTION_NAMES: Final = {
    "stream": "stream",
    "timeout": "timeout",
    "maxRetries": "max_retries",
    "retryBackoff": "retry_backoff",
    "maxResponseBytes": "max_response_bytes",
    "streamReadInterval": "stream_read_interval",
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
        stream_read_interval: The least time between two reads of a stream, in seconds.
    """

    stream: bool = True
    timeout: float = 60.0
    max_retries: int = 3
    retry_backoff: float = 0.5
    max_response_bytes: int = 16 * 1024 * 1024
    stream_read_interval: float = 0.001

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
    elif name == "streamReadInterval":
        ok = type(value) in (int, float) and math.isfinite(value) and 0 <= value <= 1
        expected = "a number of seconds from 0 to 1"
        value = float(value) if ok else value
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

    The Rust core splits the stream (``openstarry.core.SseDecoder``), by the
    rules :mod:`openstarry.sse` states (lines end in CRLF, LF or CR only;
    several ``data:`` lines make one multi-line value; comments, ``id:``,
    ``retry:`` and unknown fields are ignored here; an event without data is
    not dispatched; an event still open when the stream ends is dropped). The
    API translators need only each event's name and data.

    Args:
        max_line: The longest line, in characters.
        max_event: The most data one event may carry, in characters.
        text: ``"openai-chat"``: a run of Chat Completions chunks that carry
            text alone, once an earlier chunk named the answer's id and model,
            comes back as one ``str`` (their texts joined) among the
            ``(event, data)`` pairs; the assembler's ``text`` method takes it.

    Raises:
        SSEError: from :meth:`feed`, for a line or an event beyond the bounds.
    """

    __slots__ = ("_decoder",)

    def __init__(
        self,
        max_line: int = MAX_SSE_LINE,
        max_event: int = MAX_SSE_EVENT,
        *,
        text: str | None = None,
    ) -> None:
        self._decoder = core.SseDecoder(max_line, max_event, text)

    @property
    def max_line(self) -> int:
        """The longest line, in characters."""
        return self._decoder.max_line

    @property
    def max_event(self) -> int:
        """The most data one event may carry, in characters."""
        return self._decoder.max_event

    def feed(self, chunk: bytes) -> list[tuple[str | None, str]]:
        """The events that ``chunk`` completes, in order: ``(event name or None, data)``
        (for a decoder made with ``text``, use :meth:`read`)."""
        return cast("list[tuple[str | None, str]]", self.read(chunk))

    def read(self, chunk: bytes) -> list[tuple[str | None, str] | str]:
        """What ``chunk`` completes, in order: events, and (with ``text``) joined text."""
        try:
            return self._decoder.feed(chunk)
        except OverflowError as exc:
            raise SSEError(str(exc)) from None

    def close(self) -> list[tuple[str | None, str]]:
        """The end of the stream: an event or a line still open is dropped."""
        self._decoder.close()  # an open event or line is dropped: nothing is left to complete
        return []


class Retry(Exception):
    """An attempt failed in a way worth another attempt."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class StreamCut(Retry):
    """A stream broke off before any of its text was passed on (finished if it was the last try)."""

    def __init__(self, message: str, assembler: StreamAssembler) -> None:
        super().__init__(message)
        self.assembler = assembler


# --- one attempt ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Exchange:
    """One provider's side of an attempt: what it sends with, and how it reads the answer.

    Attributes:
        name: The API's name, which every message starts with.
        api: The API's translator: it parses the answer and its errors.
        transport: The timeout and the size bound of an answer.
        api_key_envs: The variables the key comes from (named when a 401 or 403 comes back).
    """

    name: str
    api: WireAPI
    transport: TransportOptions
    api_key_envs: tuple[str, ...]

    async def attempt(
        self,
        sender: Transport,
        request: Request,
        context: AgentContext,
        names: ToolNameMap,
        key: str | None,
        *,
        stream: bool,
    ) -> ProviderResponse:
        where = display_url(request.url)
        timeout = self.transport.timeout
        try:
            response = await sender.send(request)
        except ConnectTimeout:
            raise Retry(f"could not connect to {where} within {timeout:g} s") from None
        except ReadTimeout:
            raise ProviderError(
                f"{self.name}: no answer from {where} within {timeout:g} s "
                "(provider.options.timeout)"
            ) from None
        except (ConnectError, RemoteProtocolError) as exc:
            # Refused, reset, or closed before any answer: the request was not served.
            raise Retry(f"connection to {where} failed: {exc}") from None
        except TransportError as exc:
            raise ProviderError(
                f"{self.name}: request to {where} failed: {redact(str(exc), key)}"
            ) from None
        try:
            status = response.status
            if status >= 400:
                raise await self._error(response, where, key)
            if status >= 300:
                raise self._redirected(response, request.url, where)
            content_type = response.headers.get("content-type", "")
            if stream and content_type.split(";")[0].strip().lower() == "text/event-stream":
                return await self._read_stream(response, context, names, where)
            raw = await self._read_body(response, where, self.transport.max_response_bytes)
            try:
                body = loads(raw, constants=True)
            except ValueError:
                raise AgentPainException(
                    f"{self.name}: the answer from {where} is not JSON "
                    f"({content_type or 'no content type'}, {len(raw)} bytes)"
                ) from None
            return self.api.parse_response(body, names)
        finally:
            await response.aclose()

    def _redirected(self, response: Response, url: str, where: str) -> ProviderError:
        """A 3xx answer: redirects are not followed (the key would go along), so say where to."""
        location = response.headers.get("location", "")
        target = ""
        if location:
            try:
                target = display_url(urllib.parse.urljoin(url, location))
            except ValueError:
                target = ""
        to = f" to {target}" if target else ""
        return ProviderError(
            f"{self.name}: HTTP {response.status} from {where}: the server redirects{to}; "
            "openstarry does not follow redirects: set provider.baseUrl to the address it names"
        )

    async def _error(self, response: Response, where: str, key: str | None) -> Exception:
        """An error answer as a ``Retry`` (429 and 5xx) or a ``ProviderError`` (the rest)."""
        status = response.status
        try:
            raw = await response.read(MAX_ERROR_BODY)
        except ResponseTooLarge as exc:
            raw = exc.partial
        except TransportError:
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
        said = redact(" ".join(str(said).split())[:2000], key) or response.reason
        message = f"HTTP {status} from {where}: {said}"
        if (status == 429 and not _out_of_quota(body)) or status >= 500:
            return Retry(message, _retry_after(response.headers))
        if status in (401, 403):
            message += f" (the key comes from {' or '.join(self.api_key_envs)})"
        return ProviderError(f"{self.name}: {message}")

    async def _read_body(self, response: Response, where: str, limit: int) -> bytes:
        declared = response.headers.get("content-length", "")
        too_large = (
            f"{self.name}: the answer from {where} is more than {limit} "
            "bytes (provider.options.maxResponseBytes)"
        )
        if declared.isdigit() and int(declared) > limit:
            raise ProviderError(
                f"{self.name}: the answer from {where} is {declared} bytes: "
                f"more than {limit} bytes (provider.options.maxResponseBytes)"
            )
        try:
            return await response.read(limit)
        except ResponseTooLarge:
            raise ProviderError(too_large) from None
        except ReadTimeout:
            raise ProviderError(
                f"{self.name}: the answer from {where} stalled for "
                f"{self.transport.timeout:g} s (provider.options.timeout)"
            ) from None
        except TransportError as exc:
            raise Retry(f"the answer from {where} broke off: {exc}") from None

    async def _read_stream(
        self,
        response: Response,
        context: AgentContext,
        names: ToolNameMap,
        where: str,
    ) -> ProviderResponse:
        assembler = self.api.stream(names)
        decoder = SSEDecoder(text=getattr(assembler, "text_dialect", None))
        relay = _Relay(assembler, context)
        limit = self.transport.max_response_bytes
        size = 0
        broke: str | None = None
        try:
            while chunk := await response.receive():
                size += len(chunk)
                if size > limit:
                    raise ProviderError(
                        f"{self.name}: the stream from {where} is more than {limit} bytes "
                        "(provider.options.maxResponseBytes)"
                    )
                relay.pass_on(decoder.read(chunk))
            relay.pass_on(decoder.close())
        except (ProviderError, AgentPainException) as exc:
            # The stream refused (its size, an event the assembler cannot take, an
            # error the API reported): stop reading.
            await response.aclose()
            if isinstance(exc, TransientProviderError) and not relay.emitted:
                # Overloaded, say, before anything was passed on: worth another attempt.
                raise Retry(str(exc)) from None
            raise
        except ReadTimeout:
            if not relay.emitted and not assembler.done:
                raise ProviderError(
                    f"{self.name}: the stream from {where} stalled for "
                    f"{self.transport.timeout:g} s (provider.options.timeout)"
                ) from None
            broke = f"stalled for {self.transport.timeout:g} s"
        except TransportError as exc:
            broke = f"broke off: {exc}"
        if not assembler.done:
            why = broke or "ended before the answer was complete"
            if not relay.emitted:
                raise StreamCut(f"the stream from {where} {why}", assembler)
            logger.warning("%s: the stream from %s %s", self.name, where, why)
        return assembler.finish()


# --- helpers -------------------------------------------------------------------------------------


class _Relay:
    """Feeds a stream's events to its assembler and their text to the context, and knows
    whether any text went (also when an event after it, in the same read, fails)."""

    __slots__ = ("assembler", "context", "emitted")

    def __init__(self, assembler: StreamAssembler, context: AgentContext) -> None:
        self.assembler = assembler
        self.context = context
        self.emitted = False

    def pass_on(self, events: Sequence[tuple[str | None, str] | str]) -> None:
        """Feed one read's events; their text goes on as one delta, for the whole read.

        A ``str`` among them is text the Rust core read from chunks that carry
        nothing else (see :class:`SSEDecoder`): the assembler's ``text`` takes it.
        """
        assembler = self.assembler
        feed = assembler.feed
        said: list[str] = []
        try:
            for item in events:
                if isinstance(item, str):
                    said.append(assembler.text(item))  # type: ignore[attr-defined]
                    continue
                event, data = item
                delta = feed(event, data)
                if delta:
                    said.append(delta)
        finally:
            if said:
                self.context.emit_text_delta("".join(said))
                self.emitted = True


def redact(text: str, key: str | None) -> str:
    return text.replace(key, _REDACTED) if key else text


def _retry_after(headers: Mapping[str, str]) -> float | None:
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


#: Error codes of a 429 that waiting does not cure: the account is out of credit
#: (OpenAI's ``insufficient_quota``), not sending too fast.
_QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached"})


def _out_of_quota(body: Any) -> bool:
    """Whether an error body says the account's quota is spent (not worth a retry)."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return False
    return any(error.get(key) in _QUOTA_CODES for key in ("code", "type"))
