"""What the Redis bus keeps in memory about its work in flight: a delivered entry,
an operation waiting for the next flush, and the answers an ``asend`` waits for."""

from __future__ import annotations

import anyio

__all__: list[str] = []


class Delivery:
    """One stream entry delivered to this consumer, until it is done."""

    __slots__ = ("attempts", "effects", "entry", "lease", "state", "stream", "twins")

    def __init__(self, stream: bytes, entry: bytes, lease: str | None) -> None:
        self.stream = stream
        self.entry = entry
        #: The value of its partition's lease when it was delivered (``consumer|epoch``):
        #: its commit is refused unless the lease still holds it. ``None``: the lease
        #: was lost since; it is dropped unanswered (its new owner runs it).
        self.lease = lease
        self.attempts = 0
        #: What its handling wrote, committed with it: ``(key, value)``, an empty
        #: value deleting the key (made on the first).
        self.state: list[tuple[str, bytes]] | None = None
        #: What its handling published, held back until its commit (made on the first).
        self.effects: list[Outgoing] | None = None
        #: Other entries that hold the same envelope, delivered while this one
        #: was held: the same event, acknowledged with this one once it is
        #: handled or dead-lettered (made on the first).
        self.twins: list[Delivery] | None = None


class Outgoing:
    """One operation waiting for the next flush: its code and its fields, encoded."""

    __slots__ = (
        "accepted",
        "blob",
        "delivery",
        "effects",
        "fields",
        "op",
        "relay",
        "settle",
        "waiter",
    )

    def __init__(self, op: str, blob: bytes, fields: int, effects: int = 0) -> None:
        self.op = op
        self.blob = blob
        #: The fields the blob holds.
        self.fields = fields
        #: The publishes a commit carries; the entries an acknowledgement carries;
        #: a publish's 1.
        self.effects = effects
        #: Who awaits the answer of a publish, and the answer.
        self.waiter: Answers | None = None
        self.accepted = False
        #: A publish by the relay (an effect committed in another partition, on a cluster).
        self.relay = False
        #: A commit's delivery, when it writes state (told how its commit went).
        self.delivery: Delivery | None = None
        #: An acknowledgement's, commit's or dead letter's number among its outbox's
        #: settles (the first of an acknowledgement's entries); 0 for a publish.
        self.settle = 0


class Answers:
    """The answers awaited by one ``asend`` or ``asend_many``: one signal for them all."""

    __slots__ = ("left", "signal")

    def __init__(self, left: int) -> None:
        self.left = left
        self.signal = anyio.Event()

    def answered(self) -> None:
        self.left -= 1
        if self.left <= 0:
            self.signal.set()
