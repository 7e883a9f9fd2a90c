"""The @tool decorator: schemas, descriptions, validation, context injection, sync and async."""

from __future__ import annotations

import enum
import inspect
from typing import Annotated, Any, Literal

import anyio
import pytest
from pydantic import BaseModel, Field

from agent_harness import context
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.memory import Session
from openstarry.agent.tools import AsyncFunctionTool, FunctionTool, tool
from openstarry.errors import ToolArgumentsError, ToolError


def make_context() -> AgentContext:
    return AgentContext(tools={}, session=Session("s1"), agent_name="test")


def contains_key(value: Any, key: str) -> bool:
    """Whether ``key`` is a key of any dict in ``value``, at any depth."""
    if isinstance(value, dict):
        return key in value or any(contains_key(item, key) for item in value.values())
    if isinstance(value, list):
        return any(contains_key(item, key) for item in value)
    return False


@tool
def get_weather(location: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Get the current weather
    for a location.

    Longer explanation that is not part of the description.

    Args:
        location: The city, such as
            "Taipei", with more words.
        unit: The temperature unit.

    Returns:
        A summary.
    """
    return f"{location}:{unit}"


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Point(BaseModel):
    """A point on the map."""

    x: int
    y: int = 0
    title: str = "origin"


def test_bare_decorator_name_description_and_exact_schema() -> None:
    assert isinstance(get_weather, FunctionTool)
    assert isinstance(get_weather, Tool)
    assert get_weather.name == "get_weather"
    assert get_weather.description == "Get the current weather for a location."
    assert get_weather.parameters == {
        "type": "object",
        "properties": {
            "location": {
                "type": "string",
                "description": 'The city, such as "Taipei", with more words.',
            },
            "unit": {
                "type": "string",
                "enum": ["celsius", "fahrenheit"],
                "default": "celsius",
                "description": "The temperature unit.",
            },
        },
        "required": ["location"],
        "additionalProperties": False,
    }
    assert get_weather.describe() == {
        "name": "get_weather",
        "description": "Get the current weather for a location.",
        "parameters": get_weather.parameters,
    }


def test_still_callable_like_the_function() -> None:
    assert get_weather("Taipei") == "Taipei:celsius"
    assert get_weather("Oslo", unit="fahrenheit") == "Oslo:fahrenheit"
    assert get_weather.__name__ == "get_weather"
    assert get_weather.__doc__ is not None
    assert "Args:" in get_weather.__doc__
    assert list(inspect.signature(get_weather).parameters) == ["location", "unit"]


def test_overrides_and_field_description_beats_docstring() -> None:
    @tool(name="fs.read", description="Read a file.")
    def read(
        path: Annotated[str, Field(description="From Field.")],
        limit: Annotated[int, Field(ge=1)] = 10,
    ) -> str:
        """Ignored summary.

        Args:
            path: From the docstring.
            limit (int): At most this many lines.
        """
        return path

    assert read.name == "fs.read"
    assert read.description == "Read a file."
    assert read.parameters == {
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "From Field."},
            "limit": {
                "type": "integer",
                "minimum": 1,
                "default": 10,
                "description": "At most this many lines.",
            },
        },
        "required": ["path"],
        "additionalProperties": False,
    }


def test_rich_types_make_a_clean_schema() -> None:
    @tool
    def plot(
        points: list[Point],
        origin: Point | None,
        color: Color,
        weights: dict[str, float],
        tags: list[str] | None = None,
        mode: Literal["fast", "slow"] = "fast",
    ) -> int:
        return len(points)

    schema = plot.parameters
    assert plot.description == ""
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["points", "origin", "color", "weights"]
    props = schema["properties"]
    assert list(props) == ["points", "origin", "color", "weights", "tags", "mode"]
    assert props["points"] == {"type": "array", "items": {"$ref": "#/$defs/Point"}}
    assert props["origin"] == {"anyOf": [{"$ref": "#/$defs/Point"}, {"type": "null"}]}
    assert props["color"] == {"$ref": "#/$defs/Color"}
    assert props["weights"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert props["tags"] == {
        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
        "default": None,
    }
    assert props["mode"] == {"type": "string", "enum": ["fast", "slow"], "default": "fast"}
    assert schema["$defs"]["Color"] == {"type": "string", "enum": ["red", "green"]}
    # The nested model keeps its property named "title", but loses pydantic's titles.
    assert schema["$defs"]["Point"] == {
        "type": "object",
        "description": "A point on the map.",
        "properties": {
            "x": {"type": "integer"},
            "y": {"type": "integer", "default": 0},
            "title": {"type": "string", "default": "origin"},
        },
        "required": ["x"],
    }
    assert not contains_key({k: v for k, v in schema.items() if k != "$defs"}, "title")

    values = plot.validate(
        {
            "points": [{"x": 1}, {"x": "2", "y": 3}],
            "origin": None,
            "color": "green",
            "weights": {"a": 1},
        }
    )
    assert values == {
        "points": [Point(x=1), Point(x=2, y=3)],
        "origin": None,
        "color": Color.GREEN,
        "weights": {"a": 1.0},
    }
    assert plot.run(values, make_context()) == 2


def test_no_parameters_and_names_that_clash_with_pydantic() -> None:
    @tool
    def ping() -> str:
        """Ping."""
        return "pong"

    assert ping.parameters == {"type": "object", "properties": {}, "additionalProperties": False}
    assert ping.run(ping.validate({}), make_context()) == "pong"

    @tool
    def dump(json: str, copy: bool, model_config: int = 1) -> str:
        return f"{json}/{copy}/{model_config}"

    assert list(dump.parameters["properties"]) == ["json", "copy", "model_config"]
    assert dump.run(dump.validate({"json": "j", "copy": True}), make_context()) == "j/True/1"


_SENTINEL = object()


def test_a_default_that_is_not_json_is_left_out_of_the_schema() -> None:
    @tool
    def maybe(value: Any = _SENTINEL) -> bool:
        return value is _SENTINEL

    assert maybe.parameters == {
        "type": "object",
        "properties": {"value": {}},
        "additionalProperties": False,
    }
    assert maybe.run(maybe.validate({}), make_context()) is True
    assert maybe.run(maybe.validate({"value": 1}), make_context()) is False


def test_context_is_injected_and_not_in_the_schema() -> None:
    seen: list[AgentContext] = []

    @tool
    def remember(ctx: AgentContext, key: str) -> str:
        seen.append(ctx)
        return f"{ctx.agent_name}:{ctx.session_id}:{key}"

    assert remember.context_parameter == "ctx"
    assert remember.parameters["properties"] == {"key": {"type": "string"}}
    assert remember.parameters["required"] == ["key"]
    context = make_context()
    assert remember.run(remember.validate({"key": "k"}), context) == "test:s1:k"
    assert seen == [context]
    with pytest.raises(ToolArgumentsError, match=r"argument 'ctx': extra inputs are not permitted"):
        remember.validate({"key": "k", "ctx": {}})


def test_validation_errors_name_each_argument() -> None:
    with pytest.raises(ToolArgumentsError) as missing:
        get_weather.validate({})
    assert str(missing.value) == "get_weather: argument 'location': field required"

    with pytest.raises(ToolArgumentsError) as several:
        get_weather.validate({"location": 3, "unit": "kelvin", "when": "now"})
    assert str(several.value) == (
        "get_weather: argument 'location': input should be a valid string; "
        "argument 'unit': input should be 'celsius' or 'fahrenheit'; "
        "argument 'when': extra inputs are not permitted"
    )

    with pytest.raises(
        ToolArgumentsError, match=r"^get_weather: arguments must be an object, not list$"
    ):
        get_weather.validate(["Taipei"])


def test_nested_error_location_and_lax_coercion() -> None:
    @tool
    def total(points: list[Point], scale: int) -> int:
        return scale * sum(p.x for p in points)

    with pytest.raises(ToolArgumentsError) as info:
        total.validate({"points": [{"x": 1}, {"x": "one"}], "scale": 2})
    assert str(info.value) == (
        "total: argument 'points[1].x': input should be a valid integer,"
        " unable to parse string as an integer"
    )
    # pydantic's lax mode: a numeric string is an int.
    values = total.validate({"points": [{"x": 1}], "scale": "3"})
    assert values["scale"] == 3
    assert total.run(values, make_context()) == 3
    with pytest.raises(
        ToolArgumentsError, match=r"argument 'scale': input should be a valid integer"
    ):
        total.validate({"points": [], "scale": 1.5})


def test_validate_returns_only_given_arguments_and_defaults_apply() -> None:
    @tool
    def describe(item: int, label: str | None = None, flag: bool = True) -> str:
        return f"{item}/{label}/{flag}"

    values = describe.validate({"item": "7", "flag": "false"})
    assert values == {"item": 7, "flag": False}
    assert describe.run(values, make_context()) == "7/None/False"


def test_positional_only_parameters() -> None:
    @tool
    def join(first: str, second: str = "b", /, *, sep: str = "-") -> str:
        return first + sep + second

    assert join.parameters["required"] == ["first"]
    assert join.run(join.validate({"first": "a"}), make_context()) == "a-b"
    assert join.run(join.validate({"first": "a", "sep": "+"}), make_context()) == "a+b"
    assert join.run(join.validate({"second": "c", "first": "a"}), make_context()) == "a-c"


def test_sync_tool_runs_synchronously() -> None:
    assert type(get_weather) is FunctionTool
    assert get_weather.is_async is False
    assert not inspect.iscoroutinefunction(get_weather.run)
    args = get_weather.validate({"location": "Taipei"})
    assert get_weather.run(args, make_context()) == "Taipei:celsius"


def test_tool_errors_propagate() -> None:
    @tool
    def fail(reason: str) -> None:
        raise ToolError(reason, code="EBUSY")

    with pytest.raises(ToolError, match="busy") as info:
        fail.run(fail.validate({"reason": "busy"}), make_context())
    assert info.value.code == "EBUSY"


@pytest.mark.anyio
async def test_async_tool_run_is_a_coroutine() -> None:
    @tool(name="slow_echo")
    async def echo(text: str, context: AgentContext, times: int = 1) -> str:
        """Echo text after a pause."""
        await anyio.sleep(0)
        return f"{context.session_id}:" + text * times

    assert isinstance(echo, AsyncFunctionTool)
    assert isinstance(echo, FunctionTool)
    assert echo.is_async is True
    assert echo.name == "slow_echo"
    assert echo.description == "Echo text after a pause."
    assert echo.parameters["required"] == ["text"]
    assert "context" not in echo.parameters["properties"]
    result = echo.run(echo.validate({"text": "ab", "times": "2"}), make_context())
    assert inspect.isawaitable(result)
    assert await result == "s1:abab"
    # Calling the tool calls the function.
    assert await echo("x", make_context()) == "s1:x"


def test_decoration_type_errors() -> None:
    def star_args(*items: int) -> None: ...

    def star_kwargs(**options: str) -> None: ...

    def untyped(a: int, b) -> None:  # type: ignore[no-untyped-def]
        ...

    class Opaque:
        pass

    def opaque(value: Opaque) -> None: ...

    def two_contexts(a: AgentContext, b: AgentContext) -> None: ...

    with pytest.raises(TypeError, match=r"'star_args': \*items is not supported"):
        tool(star_args)
    with pytest.raises(TypeError, match=r"'star_kwargs': \*\*options is not supported"):
        tool(star_kwargs)
    with pytest.raises(TypeError, match=r"'untyped': parameter 'b' has no type hint"):
        tool(untyped)
    # Under `from __future__ import annotations`, a local class cannot be resolved.
    with pytest.raises(TypeError, match=r"'opaque': cannot resolve the type hints.*Opaque"):
        tool(opaque)
    with pytest.raises(TypeError, match=r"parameter 'b': only one parameter may take"):
        tool(two_contexts)
    with pytest.raises(TypeError, match=r"pass name="):
        tool(lambda: None)
    assert tool(name="noop")(lambda: None).name == "noop"


class Unsupported:
    pass


def takes_unsupported(value: Unsupported) -> None: ...


def test_a_type_pydantic_cannot_describe_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"'takes_unsupported': unsupported type hint"):
        tool(takes_unsupported)


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


def test_an_async_tool_that_cannot_wait_says_it_completes_at_once() -> None:
    @tool
    async def add(x: int) -> int:
        """Adds one."""
        return x + 1

    @tool
    async def naps(x: int) -> int:
        """Awaits."""
        await anyio.sleep(0)
        return x

    @tool
    async def locks(x: int) -> int:
        """Enters an async context."""
        async with anyio.Lock():
            return x

    async def numbers() -> Any:
        yield 1

    @tool
    async def iterates(x: int) -> int:
        """Iterates asynchronously."""
        async for n in numbers():
            x += n
        return x

    @tool
    def sync(x: int) -> int:
        """Runs in a thread."""
        return x

    assert add.completes_at_once is True
    assert [t.completes_at_once for t in (naps, locks, iterates, sync)] == [False] * 4
    # A run set on the instance is not the function that was read.
    add.run = naps.run  # type: ignore[method-assign]
    assert add.completes_at_once is False


@pytest.mark.anyio
async def test_a_tool_that_completes_at_once_runs_and_fails_as_any_other() -> None:
    from openstarry import Agent
    from openstarry.agent.memory import ToolOutcome
    from openstarry.testing import ScriptedProvider, tool_call

    @tool
    async def add(x: int) -> int:
        """Adds one."""
        return x + 1

    @tool
    async def broken(x: int) -> int:
        """Raises."""
        raise ToolError(f"no {x}", code="EBROKEN")

    assert add.completes_at_once
    assert broken.completes_at_once
    provider = ScriptedProvider(
        [
            tool_call("add", {"x": 1}),
            tool_call("broken", {"x": 2}),
            tool_call("add", {"x": "z"}),
            "done",
        ]
    )
    async with Agent(provider, [add, broken]) as agent:
        result = await agent.ask("go")
    assert result.replies == ["done"]
    outcomes = [e for e in provider.calls[-1].memory if isinstance(e, ToolOutcome)]
    assert [(o.success, o.result, o.error and o.error.code) for o in outcomes] == [
        (True, 2, None),
        (False, None, "EBROKEN"),
        (False, None, "INVALID_ARGUMENTS"),
    ]
