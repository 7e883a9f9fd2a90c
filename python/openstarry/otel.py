"""OpenTelemetry spans of an agent's runs, read from its bus (the ``[otel]`` extra).

    from opentelemetry.sdk.trace import TracerProvider
    from openstarry.otel import instrument

    agent = agent_from_manifest("agent.json")
    tracing = instrument(agent, TracerProvider())   # before the agent starts

Needs ``pip install 'openstarry[otel]'``; without it importing this module
raises an :class:`ImportError` saying so, and nothing else in openstarry
imports OpenTelemetry. The agent itself knows nothing of it: :class:`BusTracer`
subscribes to the bus and turns the events of each run into spans.

- **One trace per run.** The trace id is the run's openstarry ``traceId``
  (its 128 bits; :func:`openstarry.tracecontext.w3c_trace_id`), the same one
  MCP calls carry in ``traceparent`` beside ``X-OpenStarry-Trace-ID``.
- ``openstarry.turn``: from the ``INPUT:USER_MESSAGE`` to the run's return
  to ``IDLE`` (or the API's ``API:RESPONSE_END``); the root of the trace.
- ``openstarry.provider``: each provider call, from its round's
  ``KERNEL:TICK_START`` to what the answer caused first (the
  ``OUTPUT:AGENT_MESSAGE``, the first ``EXEC:TOOL_CALL``, a ``KERNEL:ERROR``);
  a child of the turn, with the tokens of ``metadata.usage`` when reported.
- ``openstarry.tool``: each ``EXEC:TOOL_CALL`` to its ``EXEC:TOOL_RESULT``, a
  child of the span of the call's parent event (the turn's); failed results
  set the span's status to error. A tool of a remote MCP server (named
  ``<server>.<tool>``, with ``<server>`` among ``mcp_servers``) is an
  ``openstarry.mcp.call`` span of kind ``CLIENT``; a call served for another
  agent over MCP (a tool call with no parent) is the root ``openstarry.tool``
  span of kind ``SERVER``, in the caller's trace.

Parents follow ``parentId``: each event belongs to the span of its nearest
ancestor that opened one. Spans still open are bounded (``max_open``); past it
the oldest are ended with ``openstarry.evicted = true``.

**Span ids are the events'.** The span an event opens has the span id
:func:`openstarry.tracecontext.event_span_id` of the event's id, so the agent
names it without OpenTelemetry: the HTTP providers send the round's span as
their ``traceparent`` (a model gateway's spans nest under
``openstarry.provider``), and an MCP call sends its ``openstarry.mcp.call``
span (the called agent's spans nest under it). A run or a served call whose
payload carries the caller's ``traceparent`` (``POST /process`` with that
header, an MCP ``tools/call``) is a child of the caller's span, not only in
its trace.

**From the environment** (``openstarry serve --otel``, ``worker --otel``,
``mcp --otel``): :func:`configure_from_env` builds a ``TracerProvider`` as the
standard ``OTEL_*`` variables say and makes it OpenTelemetry's global one (so
the MCP SDK's own spans go there too):

- ``OTEL_TRACES_EXPORTER``: the exporters, comma-separated (default ``otlp``;
  ``none``: no export), looked up among the installed packages by the name
  they register (the ``opentelemetry_traces_exporter`` entry points, as
  ``opentelemetry-instrument`` does): ``console`` (JSON spans on stdout; on
  stderr for ``openstarry mcp`` over stdio) comes with the SDK; ``otlp`` is
  OTLP over gRPC (``opentelemetry-exporter-otlp-proto-grpc``), or over HTTP
  (``opentelemetry-exporter-otlp-proto-http``) when
  ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` or ``OTEL_EXPORTER_OTLP_PROTOCOL`` is
  ``http/protobuf``, as the SDK reads them. An exporter that is not installed
  is a :class:`ValueError` of one line naming the package to install.
- The exporters read their own variables (``OTEL_EXPORTER_OTLP_ENDPOINT``,
  ``OTEL_EXPORTER_OTLP_HEADERS``, ...); the SDK reads ``OTEL_SERVICE_NAME`` and
  ``OTEL_RESOURCE_ATTRIBUTES`` (the service name is the agent's name when
  neither gives one), ``OTEL_TRACES_SAMPLER`` and the batching ``OTEL_BSP_*``.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Iterable
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, TextIO

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import (
        NonRecordingSpan,
        SpanContext,
        SpanKind,
        Status,
        StatusCode,
        TraceFlags,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "openstarry.otel needs OpenTelemetry: pip install 'openstarry[otel]'"
    ) from exc

from openstarry._core import __version__
from openstarry.core import Event
from openstarry.events import OUTPUT_AGENT_MESSAGE, EventType
from openstarry.tracecontext import event_span_id, parse_traceparent, w3c_trace_id

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from openstarry.bus import EventBus, Subscription

__all__ = ["BusTracer", "configure_from_env", "instrument", "tracer_provider_from_env"]

_USER_MESSAGE = EventType.USER_MESSAGE.value
_TICK = EventType.TICK_START.value
_STATE = EventType.STATE_CHANGE.value
_ERROR = EventType.ERROR.value
_CALL = EventType.TOOL_CALL.value
_RESULT = EventType.TOOL_RESULT.value
_RESPONSE_END = "API:RESPONSE_END"


class _SeededIds:
    """The tracer's id generator, except that a span takes the ids it is told."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.next_trace: int | None = None
        self.next_span: int | None = None

    def generate_span_id(self) -> int:
        if self.next_span is not None:
            return self.next_span
        span_id: int = self.inner.generate_span_id()
        return span_id

    def generate_trace_id(self) -> int:
        if self.next_trace is not None:
            return self.next_trace
        trace_id: int = self.inner.generate_trace_id()
        return trace_id

    def is_trace_id_random(self) -> bool:
        # A seeded id is a UUID4's bits: random, but not as W3C level 2 defines it.
        return self.next_trace is None and bool(
            getattr(self.inner, "is_trace_id_random", lambda: False)()
        )


class BusTracer:
    """Spans from one bus's events. :func:`instrument` builds one for an agent.

    Args:
        bus: The bus to follow (subscribed at once).
        tracer_provider: Where spans go (default: OpenTelemetry's global one).
        provider_name: The provider's name, as the ``gen_ai.system`` attribute.
        mcp_servers: Names of the agent's remote MCP servers (``mcp.servers``).
        max_open: Spans open at once, at most.
    """

    def __init__(
        self,
        bus: EventBus,
        tracer_provider: TracerProvider | None = None,
        *,
        provider_name: str | None = None,
        mcp_servers: Iterable[str] = (),
        max_open: int = 10_000,
    ) -> None:
        provider = tracer_provider or otel_trace.get_tracer_provider()
        self.tracer: Tracer = provider.get_tracer("openstarry", __version__)
        # The SDK's tracer draws trace ids from its id_generator: a root span
        # takes the run's traceId instead (an API-only tracer records nothing).
        self._ids: _SeededIds | None = None
        generator = getattr(self.tracer, "id_generator", None)
        if isinstance(generator, _SeededIds):
            self._ids = generator  # the provider's tracer, already seeded by another BusTracer
        elif generator is not None:
            self._ids = _SeededIds(generator)
            self.tracer.id_generator = self._ids  # type: ignore[attr-defined]
        self.provider_name = provider_name
        self.mcp_servers = frozenset(mcp_servers)
        self.max_open = max_open
        #: The span each event belongs to, by event id (bounded).
        self._owner: OrderedDict[str, Span] = OrderedDict()
        #: Open spans by the id of the event that opened them.
        self._open: OrderedDict[str, Span] = OrderedDict()
        #: The turn span and the open provider span of each trace.
        self._turns: dict[str, tuple[str, Span]] = {}
        self._provider: dict[str, Span] = {}
        self.subscription: Subscription = bus.subscribe("*", self._on_event)

    def close(self) -> None:
        """Stop following the bus and end every span still open."""
        self.subscription.cancel()
        for span in list(self._open.values()):
            span.end()
        self._open.clear()
        self._owner.clear()
        self._turns.clear()
        self._provider.clear()

    # -- spans -------------------------------------------------------------

    def _start(
        self,
        name: str,
        event: Event,
        parent: Span | None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: dict[str, Any] | None = None,
    ) -> Span:
        attrs = {
            "openstarry.event_id": event.id,
            "openstarry.trace_id": event.trace_id,
            "openstarry.session_id": event.session_id,
            **(attributes or {}),
        }
        now = time.time_ns()
        ids = self._ids
        if ids is not None:
            # The span id the agent already named (tracecontext.event_span_id).
            ids.next_span = int(event_span_id(event.id), 16)
        try:
            if parent is not None:
                ctx = otel_trace.set_span_in_context(parent)
                return self.tracer.start_span(name, ctx, kind, attrs, start_time=now)
            caller = _caller_of(event)
            if caller is not None:
                # A run or a served call made by a span elsewhere: its child.
                ctx = otel_trace.set_span_in_context(NonRecordingSpan(caller))
                return self.tracer.start_span(name, ctx, kind, attrs, start_time=now)
            if ids is not None:
                ids.next_trace = int(w3c_trace_id(event.trace_id), 16)
            return self.tracer.start_span(name, otel_context.Context(), kind, attrs, start_time=now)
        finally:
            if ids is not None:
                ids.next_trace = None
                ids.next_span = None

    def _remember(self, key: str, span: Span, *, opened: bool) -> None:
        owner = self._owner
        owner[key] = span
        while len(owner) > 4 * self.max_open:
            owner.popitem(last=False)
        if opened:
            self._open[key] = span
            while len(self._open) > self.max_open:
                _, old = self._open.popitem(last=False)
                old.set_attribute("openstarry.evicted", True)
                old.end()

    def _end(self, key: str, error: str | None = None) -> None:
        span = self._open.pop(key, None)
        if span is None:
            return
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    # -- events ------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        kind = event.type
        parent_id = event.parent_id
        parent = self._owner.get(parent_id) if parent_id is not None else None
        if kind == _USER_MESSAGE and parent is None:
            self._turn(event)
        elif kind == _TICK:
            self._provider_starts(event, parent)
        elif kind == _CALL:
            self._provider_ends(event)
            self._tool_call(event, parent)
        elif kind == _RESULT and parent_id is not None:
            payload = event.payload
            failed = isinstance(payload, dict) and payload.get("success") is False
            error = payload.get("error") if failed and isinstance(payload, dict) else None
            message = error.get("message") if isinstance(error, dict) else None
            self._end(parent_id, str(message or "the tool failed") if failed else None)
        elif kind == OUTPUT_AGENT_MESSAGE:
            self._provider_ends(event)
        elif kind == _ERROR:
            payload = event.payload
            code = payload.get("code") if isinstance(payload, dict) else None
            self._provider_ends(event, error=str(code or "error"))
        elif kind == _STATE:
            payload = event.payload
            if isinstance(payload, dict) and payload.get("to") == "IDLE":
                self._run_ends(event)
        elif kind == _RESPONSE_END:
            self._run_ends(event)
        if parent is not None and event.id not in self._owner:
            self._remember(event.id, parent, opened=False)

    def _turn(self, event: Event) -> None:
        payload = event.payload
        text = payload.get("text") if isinstance(payload, dict) else None
        attributes: dict[str, Any] = {}
        if isinstance(text, str):
            attributes["openstarry.input.chars"] = len(text)
        span = self._start("openstarry.turn", event, None, SpanKind.INTERNAL, attributes)
        self._remember(event.id, span, opened=True)
        self._turns[event.trace_id] = (event.id, span)

    def _provider_starts(self, event: Event, parent: Span | None) -> None:
        self._provider_ends(event)
        payload = event.payload
        attributes: dict[str, Any] = {}
        if isinstance(payload, dict) and isinstance(payload.get("round"), int):
            attributes["openstarry.round"] = payload["round"]
        if self.provider_name is not None:
            attributes["gen_ai.system"] = self.provider_name
        span = self._start("openstarry.provider", event, parent, SpanKind.CLIENT, attributes)
        self._provider[event.trace_id] = span
        self._remember(f"provider:{event.id}", span, opened=True)
        if parent is not None:
            self._remember(event.id, parent, opened=False)

    def _provider_ends(self, event: Event, error: str | None = None) -> None:
        span = self._provider.pop(event.trace_id, None)
        if span is None:
            return
        if event.type == OUTPUT_AGENT_MESSAGE:
            payload = event.payload
            metadata = payload.get("metadata") if isinstance(payload, dict) else None
            usage = metadata.get("usage") if isinstance(metadata, dict) else None
            if isinstance(usage, dict):
                for kind in ("input", "output"):
                    value = usage.get(f"{kind}_tokens")
                    if isinstance(value, int) and not isinstance(value, bool):
                        span.set_attribute(f"gen_ai.usage.{kind}_tokens", value)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        for key, open_span in list(self._open.items()):
            if open_span is span:
                del self._open[key]
                break
        span.end()

    def _tool_call(self, event: Event, parent: Span | None) -> None:
        payload = event.payload
        name = payload.get("name") if isinstance(payload, dict) else None
        name = name if isinstance(name, str) else "?"
        attributes: dict[str, Any] = {"openstarry.tool.name": name}
        call_id = payload.get("toolCallId") if isinstance(payload, dict) else None
        if isinstance(call_id, str):
            attributes["openstarry.tool.call_id"] = call_id
        server, dot, _ = name.partition(".")
        if dot and server in self.mcp_servers:
            attributes["rpc.system"] = "mcp"
            attributes["openstarry.mcp.server"] = server
            span = self._start("openstarry.mcp.call", event, parent, SpanKind.CLIENT, attributes)
        elif parent is None:
            # A call served for another agent (MCP tools/call): its own root.
            span = self._start("openstarry.tool", event, None, SpanKind.SERVER, attributes)
        else:
            span = self._start("openstarry.tool", event, parent, SpanKind.INTERNAL, attributes)
        self._remember(event.id, span, opened=True)

    def _run_ends(self, event: Event) -> None:
        self._provider_ends(event)
        turn = self._turns.pop(event.trace_id, None)
        if turn is not None:
            self._end(turn[0])


def _caller_of(event: Event) -> SpanContext | None:
    """The caller's span named by the payload's ``traceparent``, when it is in the event's trace."""
    payload = event.payload
    value = payload.get("traceparent") if isinstance(payload, dict) else None
    parsed = parse_traceparent(value)
    if parsed is None:
        return None
    trace = w3c_trace_id(event.trace_id)
    if w3c_trace_id(parsed[0]) != trace:
        return None
    return SpanContext(
        int(trace, 16),
        int(parsed[1], 16),
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )


def instrument(
    agent: Any, tracer_provider: TracerProvider | None = None, *, max_open: int = 10_000
) -> BusTracer:
    """Trace ``agent``'s runs (an :class:`~openstarry.agent.runtime.Agent`) as OpenTelemetry spans.

    Call it before the agent starts, or at least before the runs to trace.
    ``BusTracer.close()`` stops it.
    """
    servers: list[str] = []
    manifest = getattr(agent, "manifest", None)
    mcp = getattr(manifest, "mcp", None)
    for server in getattr(mcp, "servers", None) or ():
        name = getattr(server, "name", None)
        if isinstance(name, str):
            servers.append(name)
    for toolset in getattr(agent, "toolsets", ()):
        # An agent built in code: its MCP toolsets' servers (McpToolset.connections).
        servers.extend(
            name for name in getattr(toolset, "connections", {}) if isinstance(name, str)
        )
    return BusTracer(
        agent.bus,
        tracer_provider,
        provider_name=getattr(agent.provider, "name", None),
        mcp_servers=servers,
        max_open=max_open,
    )


# -- from the environment ---------------------------------------------------

#: What a traces exporter's name needs installed (the names the packages register).
_EXPORTER_PACKAGES = {
    "otlp_proto_grpc": "opentelemetry-exporter-otlp-proto-grpc",
    "otlp_proto_http": "opentelemetry-exporter-otlp-proto-http",
    "zipkin_json": "opentelemetry-exporter-zipkin-json",
    "zipkin_proto": "opentelemetry-exporter-zipkin-proto-http",
}
_OTLP_BY_PROTOCOL = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}


def _exporter_names() -> list[tuple[str, str]]:
    """``(as given, entry point name)`` of each exporter ``OTEL_TRACES_EXPORTER`` names."""
    given = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip() or "otlp"
    if given.lower() == "none":
        return []
    names = []
    for name in (part.strip() for part in given.split(",")):
        if not name:
            continue
        if name == "otlp":
            for variable in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
                protocol = os.environ.get(variable, "").strip()
                if protocol:
                    break
            if protocol and protocol not in _OTLP_BY_PROTOCOL:
                raise ValueError(
                    f"{variable}={protocol!r} is not an OTLP protocol openstarry can use "
                    f"(it takes {' or '.join(_OTLP_BY_PROTOCOL)})"
                )
            names.append((name, _OTLP_BY_PROTOCOL[protocol or "grpc"]))
        else:
            names.append((name, name))
    return names


def _exporter(given: str, name: str, console: TextIO | None) -> Any:
    """The exporter registered as ``name``, made as its package's defaults and variables say."""
    found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
    if not found:
        package = _EXPORTER_PACKAGES.get(name)
        what = f"{given!r} ({name})" if given != name else repr(given)
        install = (
            f"pip install {package}"
            if package is not None
            else f"install the package that provides the {name!r} traces exporter"
        )
        raise ValueError(
            f"OTEL_TRACES_EXPORTER names the exporter {what}, which is not installed: "
            f"{install} (or set OTEL_TRACES_EXPORTER=console, or none)"
        )
    try:
        cls = found[0].load()
        if name == "console" and console is not None:
            return cls(out=console)
        return cls()
    except Exception as exc:
        raise ValueError(f"the {given!r} traces exporter cannot be made: {exc}") from None


def tracer_provider_from_env(
    *, service_name: str = "openstarry", console: TextIO | None = None
) -> SdkTracerProvider:
    """A ``TracerProvider`` exporting as the ``OTEL_*`` variables say (see the module's text).

    Args:
        service_name: The resource's ``service.name`` when neither
            ``OTEL_SERVICE_NAME`` nor ``OTEL_RESOURCE_ATTRIBUTES`` gives one.
        console: Where the ``console`` exporter writes (default: stdout).

    Raises:
        ValueError: an exporter that is not installed or cannot be made, or an
            OTLP protocol that is not one; the message is one line that says
            which variable and what to do.
        ImportError: the OpenTelemetry SDK is not installed (``openstarry[otel]``).
    """
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "tracing from OTEL_* needs the OpenTelemetry SDK: pip install 'openstarry[otel]'"
        ) from exc
    exporters = [_exporter(given, name, console) for given, name in _exporter_names()]
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = SdkProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def configure_from_env(
    *, service_name: str = "openstarry", console: TextIO | None = None
) -> SdkTracerProvider:
    """What ``--otel`` does: :func:`tracer_provider_from_env`, made OpenTelemetry's global provider.

    Pass it to :func:`instrument` for each agent, and call its ``shutdown()``
    before the process ends (it exports the spans still waiting).

    Raises:
        ValueError: as :func:`tracer_provider_from_env`.
    """
    provider = tracer_provider_from_env(service_name=service_name, console=console)
    otel_trace.set_tracer_provider(provider)
    return provider
