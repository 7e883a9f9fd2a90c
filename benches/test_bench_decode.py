"""decode_event (payload left lazy) against typed decoders and plain JSON parsers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec
import orjson
import pytest

from benches.baselines import EnvelopeAny, EnvelopeModel, EnvelopeRaw
from benches.data import envelopes, user_messages
from benches.harness import Benchmark, measure
from openstarry.core import decode_event

N = 1000
ROUNDS = 200
CONTEXT = {"note": "Context: plain dicts, every field decoded, nothing validated; no target."}
GROUP = "envelope decode + validate, payload lazy (per envelope)"
NESTED = "envelope decode: USER_MESSAGE, payload with nested metadata (per envelope)"
FLAT = "envelope decode: USER_MESSAGE, flat payload (per envelope)"


@pytest.fixture(scope="module")
def blobs() -> list[bytes]:
    return envelopes(N, seed=5)


def _run(decode: Callable[[bytes], Any], blobs: list[bytes]) -> Any:
    result = None
    for blob in blobs:
        result = decode(blob)
    return result


def _check(decode: Callable[[bytes], Any], blobs: list[bytes]) -> None:
    for blob in blobs[:50]:
        decode(blob)
    # Each typed decoder must refuse what the core refuses.
    bad = orjson.loads(blobs[0])
    for change in ({"priority": 6}, {"priority": "2"}, {"priority": True}, {"type": "input:x"}):
        with pytest.raises(ValueError):  # noqa: PT011 - each library has its own subclass
            decode(orjson.dumps({**bad, **change}))


CASES: list[tuple[str, Callable[[bytes], Any], dict[str, Any]]] = [
    ("openstarry.core.decode_event", decode_event, {"role": "openstarry"}),
    (
        "msgspec Struct, payload: Any",
        msgspec.json.Decoder(EnvelopeAny).decode,
        {"target": 2.5, "note": "The target row: the payload decoded to Python objects."},
    ),
    (
        "msgspec Struct, payload: msgspec.Raw",
        msgspec.json.Decoder(EnvelopeRaw).decode,
        {
            "target": 3.0,
            "note": "Like for like: the payload kept as raw bytes, as openstarry's lazy "
            "payload is (medians of three runs: 5.2x to 6.3x).",
        },
    ),
    ("pydantic model_validate_json", EnvelopeModel.model_validate_json, {"target": 8.0}),
    (
        "json.loads (dict, no validation)",
        json.loads,
        CONTEXT,
    ),
    (
        "orjson.loads (dict, no validation)",
        orjson.loads,
        CONTEXT,
    ),
    (
        "the loop alone (C no-op decode: len)",
        len,
        {
            "role": "floor",
            "note": "The loop that drives one call per envelope, timed with a C no-op callee.",
        },
    ),
]


@pytest.mark.parametrize(("label", "decode", "options"), CASES, ids=[c[0] for c in CASES])
def test_decode(
    benchmark: Benchmark,
    blobs: list[bytes],
    label: str,
    decode: Callable[[bytes], Any],
    options: dict[str, Any],
) -> None:
    if options.get("role") != "floor" and "no validation" not in label:
        _check(decode, blobs)
    measure(
        benchmark,
        _run,
        group=GROUP,
        label=label,
        ops=N,
        rounds=ROUNDS,
        setup=lambda: ((decode, blobs), {}),
        **options,
    )


#: The decoders compared on one envelope shape: the target row and the like-for-like one.
SHAPE_CASES = [
    c for c in CASES if c[0] != "pydantic model_validate_json" and "no validation" not in c[0]
]


@pytest.mark.parametrize(
    ("label", "decode", "options"), SHAPE_CASES, ids=[c[0] for c in SHAPE_CASES]
)
@pytest.mark.parametrize("nested", [True, False], ids=["nested", "flat"])
def test_decode_one_shape(
    benchmark: Benchmark,
    nested: bool,
    label: str,
    decode: Callable[[bytes], Any],
    options: dict[str, Any],
) -> None:
    blobs = user_messages(N, seed=8, nested=nested)
    if options.get("role") != "floor":
        _check(decode, blobs)
    measure(
        benchmark,
        _run,
        group=NESTED if nested else FLAT,
        label=label,
        ops=N,
        rounds=ROUNDS,
        setup=lambda: ((decode, blobs), {}),
        **options,
    )
