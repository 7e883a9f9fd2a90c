"""What one LLM API's translation looks like, both directions (spec 000 section 2).

Each API openstarry speaks (OpenAI Chat Completions, OpenAI Responses,
Anthropic Messages, Gemini ``generateContent``) is a :class:`WireAPI`: plain
functions from the agent's context to a request body, and from a response body
(or a stream of events) to a :class:`~openstarry.protocol.ProviderResponse`.
They do no I/O, so they are tested against fixture files alone;
:class:`openstarry.providers.http.HTTPProvider` does the I/O (httpx, retries,
timeouts, streaming) for all of them.

This module needs only the standard library and pydantic.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from openstarry.agent.interfaces import AgentContext, Tool
    from openstarry.protocol import ProviderResponse

__all__ = ["StreamAssembler", "ToolNameMap", "WireAPI"]

_WIRE_NAME = re.compile(r"[^A-Za-z0-9_-]")
#: The longest function name OpenAI, Anthropic and Gemini all accept.
MAX_WIRE_NAME = 64


class ToolNameMap:
    """Tool names as the APIs accept them (``[A-Za-z0-9_-]{1,64}``), and back.

    openstarry's tool names may hold dots or colons (``fs.read``,
    ``weather:get``); the APIs refuse those. Each name maps to a wire name
    (``fs_read``), made unique with a numeric suffix when two collide, and a
    wire name maps back to the agent's name when the model calls it. A wire
    name the map does not know comes back unchanged, so the loop reports an
    unknown tool as an observation (spec 000 section 7).
    """

    __slots__ = ("_to_local", "_to_wire")

    def __init__(self, names: Iterable[str]) -> None:
        self._to_wire: dict[str, str] = {}
        self._to_local: dict[str, str] = {}
        for name in names:
            base = _WIRE_NAME.sub("_", name)[:MAX_WIRE_NAME] or "tool"
            wire = base
            n = 1
            while wire in self._to_local:
                n += 1
                suffix = f"_{n}"
                wire = base[: MAX_WIRE_NAME - len(suffix)] + suffix
            self._to_wire[name] = wire
            self._to_local[wire] = name

    @classmethod
    def of(cls, tools: Mapping[str, Tool]) -> ToolNameMap:
        return cls(tools)

    def wire(self, name: str) -> str:
        """The name to send to the API for the agent's tool ``name``."""
        return self._to_wire.get(name) or _WIRE_NAME.sub("_", name)[:MAX_WIRE_NAME]

    def local(self, wire_name: str) -> str:
        """The agent's tool name for a name the API sent back."""
        return self._to_local.get(wire_name, wire_name)


class StreamAssembler(Protocol):
    """Assembles one streamed response from its events, in order.

    ``feed`` takes one server-sent event (its ``event:`` name, or ``None``, and
    its ``data:`` text) and returns the text it adds to what the agent says,
    if any, so the provider can pass it on as it arrives
    (:meth:`openstarry.agent.AgentContext.emit_text_delta`). ``finish`` returns
    the whole response; a stream that ended before the API said it was done,
    or whose tool-call arguments do not parse, follows spec 000 section 7 (a
    text segment that says what went wrong, or ``AgentPainException``).
    """

    def feed(self, event: str | None, data: str) -> str | None: ...

    @property
    def done(self) -> bool:
        """Whether the API has said the response is complete."""
        ...

    def finish(self) -> ProviderResponse: ...


class WireAPI(Protocol):
    """One LLM API: where to send a request, what to send, and how to read the answer."""

    #: The provider name in ``agent.json`` (``openai``, ``openai-responses``,
    #: ``anthropic``, ``gemini``).
    name: str
    #: The API's public base URL, used when ``provider.baseUrl`` is absent.
    default_base_url: str
    #: The environment variable holding the key when ``provider.apiKeyEnv`` is absent.
    default_api_key_env: str

    def path(self, model: str, *, stream: bool) -> str:
        """The request's path, relative to the base URL (``/chat/completions``)."""
        ...

    def headers(self, api_key: str | None) -> dict[str, str]:
        """The request's headers, the key among them (never in the URL)."""
        ...

    def build_request(
        self,
        prompt: str,
        context: AgentContext,
        *,
        model: str,
        options: Mapping[str, Any],
        stream: bool,
        names: ToolNameMap,
    ) -> dict[str, Any]:
        """The JSON body: ``context.instructions``, ``context.tools`` and
        ``context.memory`` translated into the API's shapes (upstream)."""
        ...

    def parse_response(self, body: Any, names: ToolNameMap) -> ProviderResponse:
        """A whole (non-streamed) response body as a ``ProviderResponse`` (downstream)."""
        ...

    def stream(self, names: ToolNameMap) -> StreamAssembler:
        """A fresh assembler for one streamed response."""
        ...

    def error_message(self, status: int, body: Any) -> str:
        """What an error response says, for people (no key, no request body)."""
        ...
