"""The Lua scripts of the Redis bus, loaded from the ``.lua`` files beside this module.

- ``flush.lua``: one call per flush of a producer or worker: publishes, commits
  (an entry's acknowledgement with the effects of its handling), acknowledgements
  and dead letters, in order, atomically, with the duplicate window and the
  streams' bound (see the comment at its top);
- ``take.lua``: take a free lease, for a new epoch;
- ``renew.lua``: renew a partition's lease (or take it back when it lapsed and
  nobody took it since);
- ``free.lua``: free a lease this consumer owns;
- ``journal.lua``: record a completed step of a run, while its lease holds.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

__all__ = ["FLUSH", "FREE", "JOURNAL", "RENEW", "TAKE", "script"]


@cache
def script(name: str) -> str:
    """The source of ``scripts/<name>.lua``, read from the package once."""
    return (resources.files(__package__) / "scripts" / f"{name}.lua").read_text("utf-8")


FLUSH = script("flush")
RENEW = script("renew")
FREE = script("free")
TAKE = script("take")
JOURNAL = script("journal")
