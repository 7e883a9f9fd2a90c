"""The Rust core of openstarry. Import it as :mod:`openstarry.core`, not from here."""

from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Sequence
from typing import Any, ClassVar, Final, Literal, final

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_PRIORITY",
    "MAX_DEPTH",
    "PRIORITY_HIGHEST",
    "PRIORITY_LOWEST",
    "ContentSegment",
    "DedupWindow",
    "Emitter",
    "Event",
    "EventRef",
    "EventQueue",
    "IngestResult",
    "Ingestor",
    "LatencyRecorder",
    "ProviderResponse",
    "Published",
    "ResponseDecoder",
    "SlotsMaker",
    "SseDecoder",
    "ToolCall",
    "ToolIndex",
    "__version__",
    "_event_from_wire",
    "_install_published_hooks",
    "decode_event",
    "decode_response",
    "encode_event",
    "encode_response",
    "json_dumps",
    "json_loads",
]

__version__: Final[str]

#: Highest (served first) and lowest priorities of an event.
PRIORITY_HIGHEST: Final[int]
PRIORITY_LOWEST: Final[int]
#: Priority given by ``Event.new`` when none is passed.
DEFAULT_PRIORITY: Final[int]
#: Default limits applied by the decoders.
DEFAULT_MAX_BYTES: Final[int]
DEFAULT_MAX_DEPTH: Final[int]
#: The largest ``max_depth`` any decoder accepts.
MAX_DEPTH: Final[int]

@final
class Event:
    """The spec 002 event envelope: immutable, hashable by id.

    On the wire its fields are ``id``, ``timestamp``, ``traceId``, ``source``,
    ``sessionId``, ``priority``, ``type``, ``payload`` and, for an event caused
    by another one, ``parentId``. The event keeps its wire bytes: ``payload`` is
    decoded from them on first access, and :func:`encode_event` returns them
    unchanged.
    """

    def __new__(
        cls,
        *,
        id: str,
        timestamp: int,
        trace_id: str,
        source: str,
        session_id: str,
        priority: int,
        type: str,
        payload: Any = None,
        parent_id: str | None = None,
    ) -> Event:
        """Build an event from every field, validated as the decoder does."""

    @staticmethod
    def new(
        type: str,
        payload: Any = None,
        *,
        source: str,
        session_id: str,
        priority: int | None = None,
        trace_id: str | None = None,
        parent_id: str | None = None,
    ) -> Event:
        """A new event: a fresh UUID v4 id, the current time in ms, a fresh trace id unless given.

        ``priority`` defaults to :data:`DEFAULT_PRIORITY` (2).
        """

    def child(
        self,
        type: str,
        payload: Any = None,
        *,
        source: str | None = None,
        priority: int | None = None,
    ) -> Event:
        """A new event caused by this one: same trace and session, ``parent_id`` set to this id.

        ``source`` and ``priority`` default to this event's.
        """

    @property
    def id(self) -> str: ...
    @property
    def timestamp(self) -> int:
        """Unix time in milliseconds."""

    @property
    def trace_id(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def priority(self) -> int:
        """0 (highest, system-critical) to 5 (lowest, background)."""

    @property
    def type(self) -> str:
        """``NAMESPACE:NAME``, such as ``INPUT:USER_MESSAGE``."""

    @property
    def parent_id(self) -> str | None:
        """The id of the event that caused this one, or ``None``."""

    @property
    def payload(self) -> Any:
        """The payload, decoded from its JSON on first access and then cached.

        The cached object is shared by every access: mutating it does not change
        the event's wire bytes.
        """

    @property
    def payload_json(self) -> bytes:
        """The payload's raw JSON, exactly as on the wire."""

    @property
    def extra(self) -> dict[str, Any]:
        """Wire fields this version does not know, decoded (they are kept on re-encode)."""

    def to_dict(self) -> dict[str, Any]:
        """The envelope as a dict with its wire (camelCase) field names."""

    def __hash__(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __reduce__(self) -> tuple[Any, tuple[bytes]]: ...

def decode_event(
    data: bytes | bytearray | memoryview, *, max_bytes: int = ..., max_depth: int = ...
) -> Event:
    """Decode and validate one JSON envelope.

    Raises:
        openstarry.errors.DecodeError: naming the field or the byte offset.
    """

def _event_from_wire(data: bytes) -> Event:
    """Rebuild a pickled event (used by ``Event.__reduce__``)."""

def encode_event(event: Event) -> bytes:
    """The event's wire bytes; for a decoded event, the very bytes it came from."""

@final
class ToolCall:
    """An agent's intent to run a tool (spec 000 section 3A). Wire name ``toolCall``."""

    def __new__(cls, name: str, args: Any = None, id: str | None = None) -> ToolCall:
        """``args`` defaults to ``{}``; a string is parsed as JSON and must hold an object;
        a missing ``id`` gets a UUID v4.
        """

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def args(self) -> Any: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class ContentSegment:
    """One part of a provider response (spec 000 section 3B)."""

    def __new__(
        cls,
        type: Literal["text", "image", "audio", "video", "ui", "tool_call", "reasoning"],
        *,
        text: str | None = None,
        data: str | None = None,
        mime_type: str | None = None,
        tool_call: ToolCall | None = None,
        ui: Any = None,
        signature: str | None = None,
    ) -> ContentSegment:
        """Raises ``ValueError`` when the type's required field is missing."""

    @property
    def type(self) -> str: ...
    @property
    def text(self) -> str | None: ...
    @property
    def data(self) -> str | None: ...
    @property
    def mime_type(self) -> str | None: ...
    @property
    def signature(self) -> str | None:
        """A ``reasoning`` segment's opaque proof, sent back to its provider."""

    @property
    def tool_call(self) -> ToolCall | None: ...
    @property
    def ui(self) -> Any: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class ProviderResponse:
    """What a provider's ``generate`` returns: ordered segments and metadata."""

    def __new__(
        cls, segments: Sequence[ContentSegment], metadata: Any = None
    ) -> ProviderResponse: ...
    @staticmethod
    def of_text(text: str, metadata: Any = None) -> ProviderResponse:
        """``ProviderResponse([ContentSegment("text", text=text)], metadata)``, in one call."""
    @staticmethod
    def of_tool_call(
        name: str,
        args: Any = None,
        id: str | None = None,
        text: str | None = None,
        metadata: Any = None,
    ) -> ProviderResponse:
        """A response that calls one tool, after a text segment when ``text`` is
        given: ``ProviderResponse([ContentSegment("text", text=text),
        ContentSegment("tool_call", tool_call=ToolCall(name, args, id))],
        metadata)``, in one call."""
    @property
    def segments(self) -> list[ContentSegment]: ...
    @property
    def metadata(self) -> Any: ...
    def parts(
        self,
    ) -> tuple[
        tuple[ToolCall, ...],
        str,
        tuple[ContentSegment, ...],
        list[dict[str, Any]] | None,
        bool,
    ]:
        """The response as an agent's turn reads it: ``(calls, text, thought, said, plain)``.

        ``calls``: its tool calls in order; ``text``: the text of the segments
        that are neither tool calls nor reasoning, joined; ``thought``: its
        ``reasoning`` segments; ``said``: each segment that is not a tool call
        as the ``OUTPUT:AGENT_MESSAGE`` payload shows it (``None`` when there
        is none); ``plain``: ``said`` is one ``text`` segment of ASCII text
        under 1 MiB, with no other field and no metadata.
        """
    def __eq__(self, other: object, /) -> bool: ...

def decode_response(
    data: bytes | bytearray | memoryview, *, max_bytes: int = ..., max_depth: int = ...
) -> ProviderResponse:
    """Decode and validate a JSON ``ProviderResponse``."""

def encode_response(response: ProviderResponse) -> bytes:
    """Encode a ``ProviderResponse`` to JSON with the spec's wire field names."""

@final
class ResponseDecoder:
    """An HTTP/1.1 response read from a connection's bytes (heads by ``httparse``).

    ``feed`` returns 0 while the head is incomplete, 1 once it is read, 2 once
    the whole response is; ``ValueError`` for bytes that break HTTP/1.1,
    ``OverflowError`` for a body past ``limit`` bytes (the limit's worth is kept).
    """

    def __new__(cls, limit: int) -> ResponseDecoder: ...
    def feed(self, data: bytes) -> int: ...
    def eof(self) -> int:
        """The connection ended; ``ValueError`` when that cuts the response short."""
    def set_limit(self, limit: int) -> None: ...
    @property
    def status(self) -> int: ...
    @property
    def reason(self) -> str: ...
    @property
    def headers(self) -> list[tuple[str, str]]:
        """The header fields, ``(lower-cased name, value)`` in order."""
    @property
    def keep_alive(self) -> bool: ...
    @property
    def body_pending(self) -> bool: ...
    def take_body(self) -> bytes: ...
    def json(self) -> Any: ...

@final
class SseDecoder:
    """Server-sent events split from a body's bytes, by the rules of ``openstarry.sse``.

    ``feed`` returns the events a chunk completes as ``(event name or None,
    data)``; ``OverflowError`` for a line or an event past its bound.
    """

    def __new__(cls, max_line: int, max_event: int, text: str | None = None) -> SseDecoder: ...
    @property
    def max_line(self) -> int: ...
    @property
    def max_event(self) -> int: ...
    def feed(self, chunk: bytes) -> list[tuple[str | None, str] | str]:
        """With ``text="openai-chat"``, runs of Chat Completions chunks that carry text
        alone come back joined, as one ``str``."""
    def close(self) -> list[tuple[str | None, str]]: ...

def json_dumps(obj: Any) -> bytes:
    """``obj`` as compact JSON bytes (``ensure_ascii=False``, no NaN)."""

def json_loads(data: bytes) -> Any:
    """One JSON document as Python objects."""

@final
class EventRef:
    """An event emitted without being made (``Emitter.mark``): nobody could
    read it when it was emitted, so only what the events it causes need of it
    is kept: its id, trace, session, source, priority and type.

    Its id was minted, went through the bus's dedup window and the event was
    counted, as for any event emitted; :meth:`child` makes an event caused by
    it, as ``Event.child`` does.
    """

    def child(
        self,
        type: str,
        payload: Any = None,
        *,
        source: str | None = None,
        priority: int | None = None,
    ) -> Event:
        """A new event caused by this one: same trace and session, ``parent_id`` set to this id.

        ``source`` and ``priority`` default to this event's.
        """
    @property
    def id(self) -> str: ...
    @property
    def trace_id(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def priority(self) -> int: ...

@final
class SlotsMaker:
    """Makes instances of one slotted class whose constructor only stores its
    fields: ``maker(*values)`` is ``cls(*values)`` with the trailing fields it
    is not given set to ``defaults``.

    ``cls`` must use ``object.__new__`` and define ``__slots__`` holding every
    name of ``names`` (a dataclass with ``slots=True``, frozen or not); its
    ``__init__`` and ``__post_init__`` are not run, so it must do no more than
    store its arguments.

    Raises:
        TypeError: ``cls`` has a ``__new__`` of its own or no ``__slots__``,
            or a call gives more values than ``names`` or fewer than it
            needs.
        ValueError: more ``defaults`` than ``names``.
    """

    def __new__(
        cls, target: type, names: tuple[str, ...], defaults: tuple[Any, ...] | None = None
    ) -> SlotsMaker: ...
    def __call__(self, *values: Any) -> Any:
        """An instance of the class, its fields set to ``values`` and then the defaults."""

@final
class Emitter:
    """``EventBus.emit`` of a local bus, in one call into Rust.

    Made by the bus over its queue, its dedup window, its cache of routes by
    type and its ``publish``. :meth:`emit` looks up the event type's route
    (the bus's ``route_of`` fills a missing entry); an event nobody subscribes
    to (or only ``skip``) is admitted by the queue (:meth:`EventQueue.admit`)
    and counted in its route's entry, anything else goes to ``publish``.
    """

    def __new__(
        cls,
        queue: EventQueue,
        dedup: DedupWindow | None,
        by_type: dict[str, list[Any]],
        route_of: Callable[[str], list[Any]],
        publish: Callable[[Event], object],
    ) -> Emitter: ...
    def emit(self, event: Event, event_type: str, skip: object | None = None) -> bool:
        """Emit ``event``, whose type is ``event_type``: ``False`` for a duplicate id.

        Raises:
            TypeError: ``event`` is not an ``Event``.
            QueueClosed: the queue is closed.
            QueueFull: a routed event, and ``publish`` found the bus full.
        """
    def take(self, event: Event, event_type: str, subscription: object) -> bool | None:
        """Admit ``event`` (of type ``event_type``) for ``subscription`` to handle
        now, in the caller's task: when nothing could come before it (the
        dispatcher sleeps, nothing is queued) and ``subscription``, a plain
        function, is the type's only one. Its id goes through the window and it
        is counted as dispatched (``EventBus.deliver``).

        Returns ``True`` when admitted, ``False`` for a duplicate id, ``None``
        when it cannot be handled now (publish it).

        Raises:
            TypeError: ``event`` is not an ``Event``.
            ValueError: ``event_type`` is not the event's type.
            QueueClosed: the queue is closed.
        """
    def take_ref(
        self, event_type: str, session_id: str, source: str, subscription: object
    ) -> EventRef | None:
        """:meth:`take` of an event that is not made: a new event of type
        ``event_type`` (a new trace, session ``session_id``, ``source``, the
        default priority, no parent) for ``subscription`` to handle now, in the
        caller's task, on the same terms as :meth:`take`. Its id is minted,
        goes through the window and it is counted as dispatched; since its one
        subscriber is the caller, who holds its payload, an ``EventRef`` stands
        for it and is returned.

        Returns ``None`` when it cannot be handled now (make the event and
        publish it).

        Raises:
            DecodeError: a header an event cannot have (an empty ``source`` or
                ``session_id``, a malformed type).
            QueueClosed: the queue is closed.
        """
    def child(
        self,
        parent: Event | EventRef,
        event_type: str,
        payload: Any,
        source: str,
        skip: object | None = None,
    ) -> Event:
        """Make ``parent.child(event_type, payload, source=source)`` and :meth:`emit` it
        (with ``skip``); returns it. ``parent`` is an ``Event`` or an ``EventRef``.

        One call for what a producer of caused events does for each (an
        agent's ticks, state changes, tool calls and replies).

        Raises:
            TypeError, ValueError: as ``Event.child`` does (a payload that is
                not JSON, a bad type); nothing is emitted.
            QueueClosed: the queue is closed.
            QueueFull: a routed event, and ``publish`` found the bus full (the
                event was not published: make it again to wait for room).
        """
    def note(self, parent: Event | EventRef, event_type: str, payload: Any, source: str) -> bool:
        """:meth:`child` for a caller that has no use for the event: ``False`` for
        a duplicate id.

        An event nobody subscribes to, emitted while nothing could come before
        it, is dispatched at once: its id is minted, goes through the dedup
        window and it is counted, as :meth:`child` does, but no ``Event`` is
        made, nor is ``payload`` encoded, since nothing could read either. So
        ``payload`` must be one an event can carry (a constant, checked by
        its caller once). Otherwise the event is made and emitted as
        :meth:`child` does.

        Raises:
            QueueClosed: the queue is closed.
            QueueFull: a routed event, and ``publish`` found the bus full (the
                event was not published: make it to wait for room).
        """
    def mark(
        self,
        parent: Event | EventRef,
        event_type: str,
        payload: Any,
        source: str,
        skip: object | None = None,
    ) -> Event | EventRef:
        """:meth:`child` for a caller that needs the event only as the parent of
        the events it causes: returns the event emitted, an ``Event`` or an
        ``EventRef``.

        An event nobody subscribes to (or only ``skip``), emitted while
        nothing could come before it, is dispatched at once, as :meth:`note`
        does (its id minted, through the dedup window, counted), and an
        ``EventRef`` (its id, trace, session, source, priority and type) stands
        for it: no ``Event`` is made, nor is ``payload`` encoded, since nothing
        could read either. So ``payload`` must be one an event can carry.
        Otherwise the event is made and emitted as :meth:`child` does, and returned.

        Raises:
            TypeError: ``parent`` is neither an ``Event`` nor an ``EventRef``.
            QueueClosed: the queue is closed.
            QueueFull: a routed event, and ``publish`` found the bus full (the
                event was not published: make it to wait for room).
        """
    def mark_unread(
        self,
        parent: Event | EventRef,
        event_type: str,
        then_type: str | None,
        source: str,
        skip: object | None = None,
    ) -> EventRef | None:
        """:meth:`mark` and, under the event it stands for, :meth:`note`, for events
        nobody could read: both dispatched at once, unmade, in one call.

        When the bus is idle and nobody subscribes to ``event_type`` (or only
        ``skip``) nor to ``then_type``, an event of ``event_type`` is
        dispatched as :meth:`mark` dispatches it (its id minted, through the
        dedup window, counted) and, when ``then_type`` is given, one of
        ``then_type`` under it as :meth:`note` does; the first's ``EventRef``
        is returned. No payload is taken: nothing could read one. Otherwise
        nothing is emitted and ``None`` is returned: the caller emits the
        events with their payloads (:meth:`mark`, :meth:`note`).

        Raises:
            TypeError: ``parent`` is neither an ``Event`` nor an ``EventRef``.
            QueueClosed: the queue is closed.
        """
    def note_unread(self, event_type: str) -> bool:
        """:meth:`note` for an event nobody could read: dispatched at once, unmade.

        When the bus is idle and nobody subscribes to ``event_type``, an event
        of that type is dispatched as :meth:`note` dispatches it (its id
        minted, through the dedup window, counted) and ``True`` is returned.
        No parent nor payload is taken: nothing could read them. Otherwise
        nothing is emitted and ``False`` is returned: the caller emits the
        event with its payload.

        Raises:
            QueueClosed: the queue is closed.
        """
    @property
    def duplicates(self) -> int:
        """Events refused so far as duplicates by :meth:`emit` (not by ``publish``)."""
    @property
    def asleep(self) -> bool:
        """Whether the bus's dispatcher sleeps (the bus keeps it up to date)."""
    @asleep.setter
    def asleep(self, value: bool) -> None: ...

@final
class EventQueue:
    """A thread-safe priority queue: priorities 0..5, 0 served first, FIFO within a priority.

    Six FIFO lanes and a bitmask of the non-empty ones make push and pop O(1).
    Lines queued by an :class:`Ingestor` wait as Rust data; ``pop`` and
    ``pop_many`` make their :class:`Event` objects.
    """

    def __new__(
        cls,
        capacity: int | None = None,
        overflow: Literal["reject", "shed"] = "reject",
        starvation_limit: int | None = None,
    ) -> EventQueue:
        """
        Args:
            capacity: At most this many items; ``None`` for no bound.
            overflow: At capacity, ``"reject"`` raises ``QueueFull``; ``"shed"``
                drops the lowest-priority, newest item (possibly the one being
                pushed) and returns it from the push.
            starvation_limit: When set, a non-empty lane that has been passed
                over by this many consecutive pops is served next (aging).
        """

    @property
    def capacity(self) -> int | None: ...
    @property
    def overflow(self) -> str: ...
    @property
    def starvation_limit(self) -> int | None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def shed_count(self) -> int:
        """How many items the ``"shed"`` policy has dropped so far."""
    @property
    def unique_pushed(self) -> int:
        """How many events ``push_unique`` (and so ``publish``) has queued on this
        queue so far, and ``admit`` admitted."""

    def push(self, item: Any, priority: int | None = None) -> Any:
        """Queue ``item``; an ``Event`` takes its own priority when ``priority`` is ``None``.

        Returns:
            ``None``, or under the ``"shed"`` policy the item dropped to make room.

        Raises:
            QueueFull: at capacity under the ``"reject"`` policy.
            QueueClosed: after ``close()``.
        """

    def push_unique(self, item: Any, event: Event, dedup: DedupWindow | None = None) -> int:
        """Queue ``item`` at ``event``'s priority unless ``dedup`` has seen ``event``'s id.

        What a publisher does per event, in one call: the queue refuses first
        (closed, then at capacity, under either overflow policy), so a refused
        event leaves no id in the window; then the window checks and records
        the id (wall clock), and a duplicate is not queued; then ``item`` is
        queued. ``item`` is what pops: the event itself, or a wrapper of it.
        Another thread filling the queue between the check and the push makes
        the push raise with the id already recorded.

        Returns:
            How many items ``push_unique`` has queued on this queue, this one
            included (so a true value, counting from 1), or ``0`` for a
            duplicate. A publisher counts its events and samples every n-th
            one with it.

        Raises:
            TypeError: ``event`` is not an ``Event``, or ``item`` is ``None``.
            QueueFull: at capacity.
            QueueClosed: after ``close()``.
        """

    def publish(
        self, event: Event, dedup: DedupWindow | None = None, sample_every: int = 0
    ) -> Published | None:
        """Publish ``event``: :meth:`push_unique` with a new ``Published`` handle as the item.

        Returns the handle, or ``None`` for a duplicate (nothing queued). When
        ``sample_every`` divides the count ``push_unique`` would return, the
        handle's publish time is read from the clock the event bus installed
        (``openstarry.bus`` measures the dispatch latency of those events).

        Raises:
            TypeError: ``event`` is not an ``Event``.
            QueueFull: at capacity.
            QueueClosed: after ``close()``.
        """

    def admit(self, event: Event, dedup: DedupWindow | None = None) -> bool:
        """Admit ``event`` as :meth:`publish` would, without queueing it.

        For an event dispatched at its publish, which no handler waits for
        (the event bus's ``emit`` of an event nobody subscribes to): refused
        after ``close()``; then ``dedup`` checks and records its id (wall
        clock); a new id is counted in ``unique_pushed``. It takes no room, so
        it is never refused for being at capacity.

        Returns:
            ``False`` for a duplicate id (nothing counted), else ``True``.

        Raises:
            TypeError: ``event`` is not an ``Event``.
            QueueClosed: after ``close()``.
        """

    def push_many(self, items: Iterable[Any], priority: int | None = None) -> list[Any]:
        """Queue every item in one call (all or nothing under ``"reject"``).

        ``items`` is any iterable; a list or tuple is read without the iterator
        protocol, so it is the fastest. Every item is checked before any is
        queued, and the queue's lock is taken once.

        Returns:
            The items dropped by the ``"shed"`` policy (empty otherwise).
        """

    def pop(self, timeout: float | None = None) -> Any:
        """The next item, or ``None`` when empty.

        With ``timeout`` (seconds, ``math.inf`` for no limit), wait that long for
        an item with the GIL released. A closed queue still drains.
        """

    def pop_many(self, n: int, timeout: float | None = None) -> list[Any]:
        """Up to ``n`` items in priority order; with ``timeout``, wait for the first.

        The items come as a new list, taken under one lock.
        """

    def depths(self) -> list[int]:
        """How many items wait at each priority, 0..5."""

    def close(self) -> None:
        """Refuse further pushes and wake every waiting pop; what is queued can still be popped."""

    def __len__(self) -> int: ...
    def __bool__(self) -> bool: ...

@final
class Published:
    """What ``EventBus.publish`` and ``EventBus.apublish`` return: a handle on one event.

    Truthy when the bus accepted the event, falsy when it refused it as a
    duplicate. ``await handle`` (or ``await handle.handled()``) waits until the
    event's handlers have finished and answers the outcome: ``"handled"``
    (every handler returned), ``"failed"`` (a handler raised; the others still
    ran and the error became a ``KERNEL:ERROR``), ``"no_subscriber"`` (nothing
    was subscribed to its type when its turn came), ``"duplicate"`` (refused
    at publishing, answered at once) or ``"stopped"`` (the bus stopped
    without dispatching it; see ``openstarry.bus``). On a bus with a remote
    backend, awaiting an accepted event's handle raises ``RuntimeError``.

    A handle is one small object, untracked by the cycle collector until
    something awaits it; nothing is made for waiting until then.
    """

    def __new__(cls, event: Event) -> Published:
        """A pending handle on ``event`` (the bus makes them; this is for a bus of your own)."""

    @property
    def event(self) -> Event:
        """The event published."""
    #: ``perf_counter_ns`` at publishing, for an event whose latency is measured.
    _at: int | None
    #: ``None`` (pending), the signal an awaiter sleeps on, or the outcome (a str).
    _state: Any
    def _finish(self, outcome: str) -> None:
        """Set the outcome and wake the awaiters, if any (the dispatcher's one call per event)."""
    def __bool__(self) -> bool:
        """``True`` when the bus accepted the event, ``False`` for a duplicate."""
    @property
    def accepted(self) -> bool:
        """Whether the bus accepted the event (``False`` for a duplicate)."""
    @property
    def outcome(self) -> str | None:
        """The outcome once decided, else ``None`` (always ``None`` on a remote backend)."""
    def done(self) -> bool:
        """Whether :attr:`outcome` is decided: awaiting the handle now answers at once."""
    def handled(self) -> Coroutine[Any, Any, str]:
        """Wait until the event's handlers have finished; the outcome."""
    def __await__(self) -> Generator[Any, None, str]: ...

def _install_published_hooks(
    wait: Callable[[Published], Awaitable[str]], clock: Callable[[], int]
) -> None:
    """Install what a ``Published`` handle calls: ``wait(handle)``, the coroutine
    ``await handle`` runs, and ``clock()``, the ``perf_counter_ns`` of a measured
    publish. ``openstarry.bus`` installs them when it is imported."""

@final
class DedupWindow:
    """Exact sliding-window de-duplication of event ids.

    An id is a duplicate when it was first seen less than ``window_ms`` ago and
    is among the last ``max_entries`` ids seen (at most 2**30 whatever
    ``max_entries`` says). Canonical UUIDs are held as 128-bit integers
    (case-insensitive); other ids are held whole. A hash only narrows the
    search: every answer is confirmed on the id itself, so there are no false
    positives.
    """

    def __new__(cls, window_ms: int = 60000, max_entries: int = 1000000) -> DedupWindow: ...
    @property
    def window_ms(self) -> int: ...
    @property
    def max_entries(self) -> int: ...
    def check_and_insert(self, id: str, now_ms: int | None = None) -> bool:
        """True the first time ``id`` is seen within the window (keep it), False for a duplicate.

        ``now_ms`` defaults to the wall clock; time that goes backwards counts as
        no time passing.
        """

    def check_and_insert_many(self, ids: Iterable[str], now_ms: int | None = None) -> list[bool]:
        """``check_and_insert`` for each id in order, in one call.

        ``ids`` is any iterable of str; a list or tuple is read without the
        iterator protocol, so it is the fastest. Every id is checked to be a str
        before any is recorded; the window's lock is taken and the clock read
        once for the whole batch.

        Raises:
            TypeError: for an item that is not a str (nothing is recorded).
        """

    def __contains__(self, id: object, /) -> bool:
        """Whether ``id`` is in the window (without inserting it or expiring anything)."""

    def expire(self, now_ms: int | None = None) -> int:
        """Drop the entries older than the window; returns how many were dropped."""

    def clear(self) -> None: ...
    def memory_usage(self) -> int:
        """Bytes held by the window's tables."""

    def snapshot(self) -> bytes:
        """The window's state as bytes, for :meth:`restore`."""

    @staticmethod
    def restore(data: bytes) -> DedupWindow:
        """A window from :meth:`snapshot` bytes.

        Snapshots of every release so far (format version 1) restore.

        Raises:
            openstarry.errors.DecodeError: for bytes that are not a snapshot,
                or a snapshot of a format version this release cannot read
                (the message names the version).
        """

    def __len__(self) -> int: ...

@final
class IngestResult:
    """What one :meth:`Ingestor.ingest` call did."""

    @property
    def accepted(self) -> int:
        """Events decoded, new, and queued (the ``"shed"`` policy may have dropped
        some again at once: those are in :attr:`shed`)."""

    @property
    def duplicates(self) -> int:
        """Valid events dropped as already seen within the window."""

    @property
    def invalid(self) -> list[tuple[int, str]]:
        """(line index, message) for each line that could not be decoded."""

    @property
    def rejected(self) -> list[int]:
        """Line indexes of valid, new events the queue refused (full under ``"reject"``, or closed).

        The window records only what the queue took, so a refused line leaves it
        as it was (a retry is not a duplicate, and nothing was evicted for it).
        A later line of the batch with the id of a refused line is refused too.
        """

    @property
    def shed(self) -> list[Any]:
        """Items the queue dropped under the ``"shed"`` policy to make room.

        The ids of the shed events leave the dedup window: they were never
        processed, so a redelivery gets in.
        """

@final
class Ingestor:
    """Bytes to queue in one call: decode, validate, de-duplicate, enqueue."""

    def __new__(
        cls,
        queue: EventQueue,
        dedup: DedupWindow | None = None,
        *,
        max_line_bytes: int = ...,
        max_depth: int = ...,
    ) -> Ingestor: ...
    @property
    def queue(self) -> EventQueue: ...
    @property
    def dedup(self) -> DedupWindow | None: ...
    def ingest(
        self, data: bytes | bytearray | memoryview | Sequence[bytes], now_ms: int | None = None
    ) -> IngestResult:
        """Ingest NDJSON bytes (one envelope a line) or a sequence of byte strings.

        Every valid line is ingested even when other lines are invalid. A
        ``\\r\\n`` line ending is accepted; the empty piece after a final newline
        is not a line; any other empty line is reported invalid.

        The lines are decoded, validated, de-duplicated and queued with the GIL
        released: threads ingesting at once use as many cores. The queue holds
        each line decoded; its :class:`Event` is made when it is popped.
        """

@final
class LatencyRecorder:
    """Latencies in nanoseconds, counted in an HDR histogram (the ``hdrhistogram`` crate).

    Recording is one call into Rust with a fixed memory footprint, whatever the
    number of values. Values from 0 to ``highest_ns`` (one hour by default)
    are kept to ``significant_figures`` significant figures (3: percentiles
    within 0.1 %); a larger value is recorded as ``highest_ns`` and counted in
    :attr:`saturated`, so nothing is dropped.

    :meth:`now_ns` is the recorder's clock (monotonic; ``CLOCK_MONOTONIC`` on
    Linux, counted from the first read in the process): stamp intended times
    with it and :meth:`record_since` measures from them on the same clock.
    Safe to share between threads (one lock per call).

    Raises:
        ValueError: ``highest_ns`` below 2 or ``significant_figures`` outside 1..5.
    """

    def __new__(
        cls, highest_ns: int = 3600000000000, significant_figures: int = 3
    ) -> LatencyRecorder: ...
    @staticmethod
    def now_ns() -> int:
        """Nanoseconds on the recorder's monotonic clock (the same for every recorder)."""

    def record(self, ns: int) -> None:
        """Record one latency of ``ns`` nanoseconds.

        Raises:
            ValueError: ``ns`` is negative.
        """

    def record_since(self, intended_ns: int) -> int:
        """Record the time from ``intended_ns`` (a :meth:`now_ns` reading) to now; returns it.

        The clock is read in Rust, inside this call. An ``intended_ns`` still to
        come records 0.

        Raises:
            ValueError: ``intended_ns`` is negative.
        """

    def value_at_percentile(self, percentile: float) -> int:
        """The latency at ``percentile`` (0 to 100), in nanoseconds; 0 when nothing was recorded.

        It is the highest value equivalent to the exact one at the recorder's
        precision (never below it).

        Raises:
            ValueError: ``percentile`` is outside 0..100 or NaN.
        """

    @property
    def count(self) -> int:
        """How many latencies were recorded."""

    @property
    def min(self) -> int:
        """The smallest latency recorded, in nanoseconds; 0 when empty."""

    @property
    def max(self) -> int:
        """The largest latency recorded, in nanoseconds (at the precision); 0 when empty."""

    @property
    def mean(self) -> float:
        """The mean latency, in nanoseconds; 0.0 when empty."""

    @property
    def saturated(self) -> int:
        """How many latencies were above ``highest_ns`` (recorded as ``highest_ns``)."""

    @property
    def highest_ns(self) -> int:
        """The highest trackable latency, in nanoseconds."""

    @property
    def significant_figures(self) -> int:
        """The precision, in significant figures."""

    def reset(self) -> None:
        """Forget every recorded latency."""

    def __len__(self) -> int: ...

@final
class ToolIndex:
    """A lexical index of tools: which best match an input, scored by BM25F.

    Built once from ``(name, text)`` documents (a tool's name, and its
    description with its parameters' names and descriptions); immutable and
    safe to share between threads. A name counts three times as much as the
    text. Terms are split on anything but letters and digits and at camelCase
    boundaries (an acronym's plural, ``APIs``, stays one word, ``api``),
    lowercased, stripped of a few English stop words and of plural,
    ``-ing`` and ``-ed`` endings; a few verbs also count as the operation they
    name (``add`` as ``create``, ``remove`` as ``delete``, ``fetch`` as ``get``);
    Chinese and Japanese text becomes overlapping character pairs. A query
    word of three characters or more also matches the longer words it begins
    (at half weight), so ``auth`` finds ``authenticate``.

    Raises:
        ValueError: for more than ``MAX_DOCUMENTS`` documents, an empty,
            repeated or over-long name, or a text over ``MAX_TEXT_BYTES``.
        TypeError: for a document that is not a pair of str.
    """

    #: The most documents one index holds.
    MAX_DOCUMENTS: ClassVar[int]
    #: The longest name, in UTF-8 bytes.
    MAX_NAME_BYTES: ClassVar[int]
    #: The longest text, in UTF-8 bytes.
    MAX_TEXT_BYTES: ClassVar[int]
    #: The longest query, in UTF-8 bytes.
    MAX_QUERY_BYTES: ClassVar[int]

    def __new__(cls, documents: Iterable[tuple[str, str]]) -> ToolIndex: ...
    def search(self, query: str, limit: int = 10) -> list[tuple[str, float]]:
        """The ``limit`` best matches of ``query`` as ``(name, score)``, the best first.

        Ties are ordered by name; documents that share no term with the query
        are left out, so fewer than ``limit`` may come back (none for a query of
        stop words or punctuation alone).

        Raises:
            ValueError: for a negative ``limit`` or a query over ``MAX_QUERY_BYTES``.
        """

    @staticmethod
    def tokenize(text: str) -> list[str]:
        """The terms the index makes of ``text``, in order: what queries and documents match on.

        Raises:
            ValueError: for a text over ``MAX_TEXT_BYTES``.
        """

    @property
    def names(self) -> list[str]:
        """The documents' names, in the order given."""

    @property
    def term_count(self) -> int:
        """How many distinct terms the index holds."""

    def __len__(self) -> int: ...
