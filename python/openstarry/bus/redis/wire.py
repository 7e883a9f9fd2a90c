"""The flush script's blob: fields as msgpack strings, written without a msgpack library.

A flush carries its operations' fields in one argument, a msgpack array of
strings, which the script unpacks with one ``cmsgpack.unpack``: a few arguments
per flush instead of thousands (redis-py's per-argument encoding dominated).
"""

from __future__ import annotations

__all__: list[str] = []


#: msgpack's header of a string of each length up to 255 (fixstr, then str 8).
SHORT_STRINGS = [bytes((0xA0 | n,)) if n < 32 else bytes((0xD9, n)) for n in range(256)]


def msgpack_str_head(n: int) -> bytes:
    """msgpack's header of a string of ``n`` bytes."""
    if n < 256:
        return SHORT_STRINGS[n]
    if n < 65536:
        return b"\xda" + n.to_bytes(2, "big")
    return b"\xdb" + n.to_bytes(4, "big")


def msgpack_array(n: int) -> bytes:
    """msgpack's header of an array of ``n`` items."""
    return bytes((0x90 | n,)) if n < 16 else b"\xdd" + n.to_bytes(4, "big")


def msgpack_fields(*fields: bytes | str) -> bytes:
    """Fields for the flush script's blob: a msgpack string each."""
    out = []
    for f in fields:
        b = f.encode("utf-8", "surrogatepass") if isinstance(f, str) else f
        out.append(msgpack_str_head(len(b)))
        out.append(b)
    return b"".join(out)
