"""Hostile and unusual inputs for the models, tools, manifest and providers, found by review.

Each test guards one promise of the Python layer: @tool schemas and validation,
the confined fs.* tools, the protocol models' conversions to and from the core,
the manifest loader's errors, the default provider and the test providers, and
slash command parsing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field, ValidationError

from openstarry import protocol
from openstarry.agent.commands import parse_tool_args
from openstarry.agent.interfaces import AgentContext
from openstarry.agent.memory import Session
from openstarry.agent.tools import tool
from openstarry.core import Event, decode_event, decode_response
from openstarry.errors import DecodeError, ToolArgumentsError
from openstarry.providers.default import DefaultProvider
from openstarry.testing import FunctionProvider, ScriptedProvider
from openstarry.tools import resolve_tools
from openstarry.tools.fs import fs_tools


def context(tools: Any = None) -> AgentContext:
    return AgentContext(tools=tools or {}, session=Session("s"), trace_id="t", round=1)


def envelope_wire(**changes: Any) -> dict[str, Any]:
    wire: dict[str, Any] = {
        "id": "5f0c6f2e-8d1a-4a4b-9a39-0a3c1b2d3e4f",
        "timestamp": 1730000000000,
        "traceId": "t-1",
        "source": "src",
        "sessionId": "s-1",
        "priority": 2,
        "type": "INPUT:USER_MESSAGE",
        "payload": {"text": "hi"},
    }
    wire.update(changes)
    return wire


# ---------------------------------------------------------------- @tool


def test_tool_takes_an_optional_agent_context_as_the_context_parameter() -> None:
    """A parameter annotated ``AgentContext | None`` receives the loop's context.

    ``ctx: AgentContext | None = None`` is the natural way to keep a tool callable
    as a plain function (the decorated object still is one); @tool must treat it
    as the context parameter, not refuse the function at decoration with a
    confusing "no schema for Tool" error.
    """

    def where(path: str, ctx: AgentContext | None = None) -> str:
        return f"{path} in {ctx.session_id if ctx is not None else 'nowhere'}"

    wrapped = tool(where)
    assert wrapped.context_parameter == "ctx"
    assert set(wrapped.parameters["properties"]) == {"path"}
    assert wrapped.run(wrapped.validate({"path": "a"}), context()) == "a in s"


def test_tool_keeps_the_promise_of_its_schema_for_an_annotated_default_factory() -> None:
    """An argument the schema does not require can be left out, and the call then works.

    ``Annotated[list[str], Field(default_factory=list)]`` is pydantic's way to give
    a default inside ``Annotated``; the schema then marks the argument optional and
    ``validate({})`` passes, so the tool must be called with that default (or the
    argument must be required): a validated call must never fail with
    "missing 1 required positional argument".
    """

    def count(tags: Annotated[list[str], Field(default_factory=list)]) -> int:
        return len(tags)

    wrapped = tool(count)
    if "tags" in wrapped.parameters.get("required", []):
        with pytest.raises(ToolArgumentsError):
            wrapped.validate({})
    else:
        assert wrapped.run(wrapped.validate({}), context()) == 0


# ---------------------------------------------------------------- fs.*


def test_fs_list_of_a_directory_with_a_non_utf8_name_can_be_reported(tmp_path: Path) -> None:
    """fs.list returns text that JSON and the core can carry, whatever the file names' bytes.

    A single file name that is not UTF-8 must not make the whole directory
    unlistable: its name comes back with replacement characters (as fs.read
    decodes content), not as lone surrogates that no event can encode.
    """
    try:
        fd = os.open(os.path.join(os.fsencode(tmp_path), b"bad\xff.txt"), os.O_CREAT | os.O_WRONLY)
    except OSError:
        pytest.skip("this file system refuses file names that are not UTF-8")
    os.close(fd)
    (tmp_path / "good.txt").write_text("x")
    listing = next(t for t in fs_tools([tmp_path]) if t.name == "fs.list")

    entries: Any = listing.run(listing.validate({}), context())

    assert len(entries) == 2
    assert "good.txt" in [entry["name"] for entry in entries]
    payload = {"toolCallId": "c-1", "name": "fs.list", "success": True, "result": entries}
    event = Event.new("EXEC:TOOL_RESULT", payload, source="test", session_id="s")
    assert len(event.payload["result"]) == 2


# ---------------------------------------------------------------- protocol


def test_envelope_without_payload_is_refused_as_the_core_and_spec_002_refuse_it() -> None:
    """``payload`` is a required envelope field: the model and its JSON Schema say so.

    Spec 002 declares ``payload`` without ``?`` and ``decode_event`` refuses an
    envelope without it; a model that accepts it, and a schema other languages
    validate against that does not require it, let producers emit events the
    core then rejects.
    """
    wire = envelope_wire()
    del wire["payload"]
    raw = json.dumps(wire).encode()
    with pytest.raises(DecodeError):
        decode_event(raw)

    with pytest.raises(ValidationError):
        protocol.EventEnvelope.model_validate_json(raw)
    assert "payload" in protocol.json_schema()["$defs"]["EventEnvelope"]["required"]


NON_FINITE_MODELS: dict[str, Callable[[], Any]] = {
    "tool call args NaN": lambda: protocol.ToolCall.model_validate(
        {"name": "w", "args": {"x": float("nan")}}
    ),
    "ui segment inf": lambda: protocol.ContentSegment.model_validate(
        {"type": "ui", "ui": {"x": float("inf")}}
    ),
    "response metadata -inf": lambda: protocol.ProviderResponse.model_validate(
        {"segments": [], "metadata": float("-inf")}
    ),
    "envelope payload NaN": lambda: protocol.EventEnvelope.model_validate(
        envelope_wire(payload={"x": float("nan")})
    ),
}


@pytest.mark.parametrize("build", list(NON_FINITE_MODELS.values()), ids=list(NON_FINITE_MODELS))
def test_to_core_refuses_a_non_finite_number_instead_of_turning_it_into_null(
    build: Callable[[], Any],
) -> None:
    """A NaN or infinity in a model is refused (``ValueError``), as the core's own classes do.

    ``core.ToolCall("w", {"x": nan})`` raises; the pydantic model must not
    silently convert the same value into ``null`` on its way to the core, which
    changes the data a tool or a transport receives.
    """
    with pytest.raises(ValueError):  # noqa: PT011 - a ValidationError or the core's ValueError
        build().to_core()


def test_a_number_beyond_a_64_bit_float_is_refused_where_it_is_decoded() -> None:
    """``1e400`` cannot be a float and be written back as JSON, so the core refuses it.

    Read as infinity, it would turn into ``null`` (or an encoding error) on the
    way out; refused at decode time, the error names where it is.
    """
    raw = json.dumps(envelope_wire(payload="@@")).encode().replace(b'"@@"', b'{"n": 1e400}')
    with pytest.raises(DecodeError, match="out of range"):
        decode_event(raw)


def test_provider_response_from_core_converts_every_response_the_core_decodes() -> None:
    """A response ``decode_response`` accepts converts to the model with ``from_core``.

    ``1e400`` is valid JSON: the core must either refuse it when decoding (a
    ``DecodeError`` naming the field) or produce a response that converts;
    today it decodes it as infinity, which ``encode_response`` and therefore
    ``ProviderResponse.from_core`` then fail on with a bare ``ValueError``.
    """
    raw = b'{"segments":[{"type":"text","text":"a"}],"metadata":{"n":1e400}}'
    try:
        response = decode_response(raw)
    except DecodeError:
        return
    model = protocol.ProviderResponse.from_core(response)
    assert model.metadata == response.metadata


# ---------------------------------------------------------------- manifest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_AS as Linux has it")
def test_load_manifest_of_a_huge_file_is_a_manifest_error_naming_the_file(tmp_path: Path) -> None:
    """A manifest file far too large to be one gets a ``ManifestError`` that names the file.

    ``load_manifest`` reads the whole file first; a (sparse) 1 TiB file then
    ends in a bare ``MemoryError`` that names nothing. The check runs in a child
    process with a bounded address space, so it costs no real memory.
    """
    path = tmp_path / "agent.json"
    try:
        with path.open("wb") as f:
            f.write(b'{"identity": {"name": "a"}}')
            f.truncate(1 << 40)
    except OSError:
        pytest.skip("this file system cannot hold a sparse 1 TiB file")
    code = textwrap.dedent(
        """
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))
        from openstarry.errors import ManifestError
        from openstarry.manifest import load_manifest
        try:
            load_manifest(sys.argv[1])
        except ManifestError as exc:
            print("ManifestError", sys.argv[1] in str(exc))
        except BaseException as exc:
            print("other", type(exc).__name__)
        else:
            print("accepted")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split() == ["ManifestError", "True"], done.stderr


# ---------------------------------------------------------------- providers


@pytest.mark.anyio
@pytest.mark.parametrize(
    "prompt", ['"\xa0" weather', 'check "\u2003" forecast', '"\u3000"\'s weather'], ids=repr
)
async def test_default_provider_answers_a_quoted_unicode_space_before_weather(prompt: str) -> None:
    """The default provider answers every prompt, odd whitespace in quotes included.

    A quoted non-breaking or ideographic space where a place would be leaves a
    "location" of whitespace that ``str.strip`` with an ASCII set keeps; the
    provider must still answer (here: ask for a location) instead of raising
    ``IndexError`` from ``location.split()[0]``.
    """
    tools = resolve_tools(["get_weather"])
    response = await DefaultProvider().generate(prompt, context(tools))
    assert response.segments
    assert response.segments[0].text


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["scripted", "function"])
async def test_test_providers_accept_the_protocol_provider_response(kind: str) -> None:
    """ScriptedProvider and FunctionProvider take a pydantic ``protocol.ProviderResponse``.

    The loop accepts that model from any provider (it calls ``to_core()``), so
    the test providers must too, rather than fail with "an answer must be a
    ProviderResponse ..., not ProviderResponse".
    """
    answer: Any = protocol.ProviderResponse.model_validate(
        {"segments": [{"type": "text", "text": "hi"}]}
    )
    provider = (
        ScriptedProvider([answer]) if kind == "scripted" else FunctionProvider(lambda p, c: answer)
    )

    response = await provider.generate("x", context())

    assert response.segments[0].text == "hi"


# ---------------------------------------------------------------- slash commands


@pytest.mark.parametrize(
    ("tool_name", "argline", "expected"),
    [
        ("fs.read", "path=2024", {"path": "2024"}),
        ("fs.read", 'path="17"', {"path": "17"}),
        ("fs.write", "notes.txt content=true", {"path": "notes.txt", "content": "true"}),
    ],
    ids=["number-like path", "quoted number", "boolean-like content"],
)
def test_slash_named_string_argument_is_taken_as_written(
    tmp_path: Path, tool_name: str, argline: str, expected: dict[str, Any]
) -> None:
    """``key=value`` for a string parameter gives the text as typed, as a positional word does.

    ``/read 2024`` reads the file ``2024``; ``/read path=2024`` must too, not
    turn the value into the integer 2024 that the tool then refuses.
    """
    tools = resolve_tools(["fs.read", "fs.write"], allowed_paths=[tmp_path])
    target = tools[tool_name]
    assert target.validate(parse_tool_args(target, argline)) == expected


def test_slash_word_for_an_optional_string_parameter_is_taken_as_written() -> None:
    """A word for a ``str | None`` parameter stays text, as for a plain ``str`` one.

    The schema of an optional string is ``anyOf: [string, null]``, with no
    top-level ``"type": "string"``; ``/greet 123`` must still pass the name
    ``"123"``, not the integer 123 that validation then refuses.
    """

    def greet(name: str | None = None) -> str:
        return f"hello {name}"

    wrapped = tool(greet)
    assert wrapped.validate(parse_tool_args(wrapped, "123")) == {"name": "123"}
