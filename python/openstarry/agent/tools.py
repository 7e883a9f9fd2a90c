"""The :func:`tool` decorator: a :class:`~openstarry.agent.interfaces.Tool` from a typed function.

::

    @tool
    def get_weather(location: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> dict:
        \"\"\"Get the current weather.

        Args:
            location: The city, such as "Taipei".
            unit: The temperature unit.
        \"\"\"

The tool's ``name`` is the function's name, its ``description`` the first
paragraph of the docstring, and its ``parameters`` a JSON Schema built by
pydantic from the type hints. A parameter's description comes from
``Annotated[T, Field(description=...)]`` or, failing that, from the docstring's
Google-style ``Args:`` section. A parameter annotated
:class:`~openstarry.agent.interfaces.AgentContext` is not an argument: the
loop's context is passed there.

Arguments are validated by pydantic in its default *lax* mode before the call:
``"3"`` is accepted for an ``int`` parameter and becomes ``3``, as pydantic
coerces it; unknown arguments are refused. A validated nested model arrives as
an instance of the model.

The decorated object is still callable like the function.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import types
import typing
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Generic, ParamSpec, TypeVar, overload

import pydantic
import pydantic_core
from pydantic.json_schema import PydanticJsonSchemaWarning

from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.errors import ToolArgumentsError

__all__ = ["AsyncFunctionTool", "FunctionTool", "tool"]

P = ParamSpec("P")
R = TypeVar("R")

# Docstring section headers that end the description's first paragraph.
_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Returns|Return|"
    r"Yields|Raises|Examples?|Notes?|Attributes|See Also|Warnings?|Todo):\s*$"
)
_ARGS_HEADER = re.compile(r"^(\s*)(Args|Arguments|Parameters|Params):\s*$")
_ARG_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
# Keys whose value is data, not a schema: never cleaned.
_DATA_KEYS = frozenset({"default", "const", "enum", "examples", "example"})
# Keys whose value maps names to schemas.
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties"})


class FunctionTool(Tool, Generic[P, R]):
    """A :class:`Tool` made by :func:`tool` from a synchronous function.

    Calling it calls the function. :meth:`run` is a plain ``def`` (the loop runs
    it in a worker thread); :class:`AsyncFunctionTool` is the ``async`` variant.

    Attributes:
        func: The decorated function.
        context_parameter: The name of the parameter that receives the
            :class:`AgentContext`, or ``None``.
    """

    func: Callable[P, R]
    context_parameter: str | None
    __name__: str
    __qualname__: str
    __wrapped__: Callable[P, R]

    def __init__(
        self,
        func: Callable[P, R],
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        functools.update_wrapper(self, func)  # __name__, __doc__, __wrapped__...
        self.func = func
        tool_name = name if name is not None else getattr(func, "__name__", None)
        if not isinstance(tool_name, str) or not tool_name or tool_name == "<lambda>":
            raise TypeError(f"@tool: cannot name the tool for {func!r}: pass name=...")
        self.name = tool_name
        if not hasattr(self, "__name__"):  # a callable object or a partial
            self.__name__ = self.__qualname__ = tool_name
        documented = func.func if isinstance(func, functools.partial) else func
        summary, arg_docs = _parse_docstring(inspect.getdoc(documented))
        self.description = description if description is not None else summary
        (
            self._model,
            self._fields,
            self._positional_only,
            self.context_parameter,
            self._no_default,
        ) = _build_model(tool_name, func, arg_docs)
        self.parameters = _json_schema(tool_name, self._model, arg_docs, self._fields)
        #: Every field is named as its parameter: a model with all of them
        #: given is its ``__dict__``.
        self._same_names = all(field == name for field, name in self._fields.items())
        #: Nothing to add or reorder for a call: ``func(**args)`` does.
        self._plain_call = self.context_parameter is None and not self._positional_only
        #: The function is a coroutine function that cannot wait (see
        #: :attr:`completes_at_once`).
        self._at_once = cannot_wait(func)
        #: The model's validator (what ``model_validate`` calls), looked up once.
        self._validate: Callable[[dict[str, Any]], pydantic.BaseModel] = (
            self._model.__pydantic_validator__.validate_python
            if self._model.__pydantic_complete__
            else self._model.model_validate
        )
        #: The validator of the model's fields alone, compiled once: it returns
        #: ``(values by field, None, fields given)`` without making a model.
        #: Its fields are named as the parameters: the values are the arguments.
        self._validate_fields = _fields_validator(self._model, self._fields)
        #: Whether every field is required (a valid call then gives each one),
        #: and the parameters whose model default is theirs.
        self._all_required = len(self._no_default) == len(self._fields)
        self._no_default_names = frozenset(self._fields[field] for field in self._no_default)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.func(*args, **kwargs)

    @functools.cached_property
    def output_schema(self) -> dict[str, Any] | None:
        """A JSON Schema of what the tool returns, from the function's return annotation,
        when that is an object (a ``TypedDict``, a pydantic model, a dataclass, a
        ``dict[str, ...]``); ``None`` otherwise (no annotation, a string, a list, a
        bare ``dict``). MCP declares it as the tool's ``outputSchema``. Made at first use."""
        return _output_schema(self.func)

    @property
    def completes_at_once(self) -> bool:
        """True for an ``async def`` whose body has no ``await``, ``async with`` nor ``async for``.

        Its call cannot wait for anything, so it finishes in one step: the loop
        runs it without the tool timeout's cancel scope, which could never fire.
        """
        return self._at_once and "run" not in self.__dict__

    def validate(self, args: Any) -> dict[str, Any]:
        """The arguments given, validated and converted by pydantic (lax mode).

        The arguments present in ``args`` are returned, and the model's default
        of a parameter the function gives none (``Annotated[list[str],
        Field(default_factory=list)]``); the function's own defaults apply to
        the others, as in a plain call.

        Raises:
            ToolArgumentsError: ``"<tool>: argument '<name>': <why>"`` for each
                missing, unknown or invalid argument, joined by ``"; "``.
        """
        if type(args) is not dict and not isinstance(args, Mapping):
            raise ToolArgumentsError(
                f"{self.name}: arguments must be an object, not {type(args).__name__}"
            )
        validate_fields = self._validate_fields
        if validate_fields is not None:
            try:
                values, _, given = validate_fields(args if type(args) is dict else dict(args))
            except pydantic.ValidationError as exc:
                raise ToolArgumentsError(_format_errors(self.name, exc)) from exc
            if self._all_required:
                return values  # valid: each argument was given (a new dict each call)
            kept = self._no_default_names
            return {name: value for name, value in values.items() if name in given or name in kept}
        try:
            model = self._validate(args if type(args) is dict else dict(args))
        except pydantic.ValidationError as exc:
            raise ToolArgumentsError(_format_errors(self.name, exc)) from exc
        # What was given, and what the model filled in for a parameter the
        # function has no default of its own for (Field(default_factory=...)).
        given = model.__pydantic_fields_set__
        if self._same_names and len(given) == len(self._fields):
            return dict(model.__dict__)
        no_default = self._no_default
        return {
            name: getattr(model, field)
            for field, name in self._fields.items()
            if field in given or field in no_default
        }

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        """Call the function with the validated ``args``, and ``context`` if it takes it."""
        if self._plain_call:
            return self.func(**args)  # type: ignore[call-arg]
        positional, keywords = self._call_arguments(args, context)
        return self.func(*positional, **keywords)

    def _call_arguments(
        self, args: Mapping[str, Any], context: AgentContext
    ) -> tuple[list[Any], dict[str, Any]]:
        keywords = dict(args)
        if self.context_parameter is not None:
            keywords[self.context_parameter] = context
        positional: list[Any] = []
        for parameter in self._positional_only:
            if parameter.name in keywords:
                positional.append(keywords.pop(parameter.name))
            elif parameter.default is not inspect.Parameter.empty:
                positional.append(parameter.default)
            else:
                raise ToolArgumentsError(f"{self.name}: argument {parameter.name!r}: missing")
        return positional, keywords

    def __repr__(self) -> str:
        return f"<FunctionTool {self.name!r} of {getattr(self.func, '__qualname__', self.func)!r}>"


class AsyncFunctionTool(FunctionTool[P, R]):
    """A :class:`FunctionTool` of an ``async def`` function: its :meth:`run` is a coroutine."""

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        if self._plain_call:
            return await self.func(**args)  # type: ignore[call-arg, misc]
        positional, keywords = self._call_arguments(args, context)
        return await self.func(*positional, **keywords)  # type: ignore[misc]


@overload
def tool(
    func: Callable[P, R], /, *, name: str | None = None, description: str | None = None
) -> FunctionTool[P, R]: ...


@overload
def tool(
    func: None = None, /, *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[P, R]], FunctionTool[P, R]]: ...


def tool(
    func: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
) -> FunctionTool[P, R] | Callable[[Callable[P, R]], FunctionTool[P, R]]:
    """Make a :class:`~openstarry.agent.interfaces.Tool` of a typed function, sync or async.

    Use it bare (``@tool``) or with overrides (``@tool(name="fs.read",
    description="...")``). Every parameter needs a type hint pydantic can
    describe in JSON Schema; a parameter annotated ``AgentContext`` receives
    the loop's context and is not part of the schema.

    Returns:
        A :class:`FunctionTool` (:class:`AsyncFunctionTool` for an ``async def``
        function), still callable like the function.

    Raises:
        TypeError: at decoration, for ``*args``/``**kwargs``, a parameter
            without a type hint, a hint that cannot be resolved or described,
            or a tool without a name.
    """

    def decorate(function: Callable[P, R]) -> FunctionTool[P, R]:
        if not callable(function):
            raise TypeError(f"@tool: expected a function, not {type(function).__name__}")
        cls: type[FunctionTool[P, R]] = AsyncFunctionTool if _is_async(function) else FunctionTool
        return cls(function, name=name, description=description)

    if func is None:
        return decorate
    return decorate(func)


#: The instructions of an ``await``, ``async with`` or ``async for`` (Python 3.10 to 3.13).
_WAITING_OPS = frozenset(
    {
        "GET_AWAITABLE",
        "YIELD_VALUE",
        "YIELD_FROM",
        "SEND",
        "BEFORE_ASYNC_WITH",
        "GET_AITER",
        "GET_ANEXT",
    }
)


def cannot_wait(function: Callable[..., Any]) -> bool:
    """Whether ``function`` is an ``async def`` whose own code never suspends.

    Only a plain function is judged (its code is read once); a wrapper, a
    partial or a callable object is taken as able to wait.

    Why the function's bytecode is read (once, when the tool is made): an
    ``async def`` with no ``await`` is most quick tools people write, and its
    call can never be interrupted, so the loop runs it without the tool
    timeout's cancel scope and serves the run without entering its own (see
    :attr:`FunctionTool.completes_at_once`). That serves every provider, real
    or not. Measured under callgrind (the turn benchmark's agent, asyncio, the
    difference between 200 and 1,200 turns): 142,000 instructions a turn
    with it, 200,000 with every tool taken as able to wait. Nothing else
    tells a coroutine function that cannot wait from one that can: the
    alternative is to ask each tool's author to declare it.
    """
    if type(function) is not types.FunctionType or not inspect.iscoroutinefunction(function):
        return False
    if sys.version_info >= (3, 14):
        # The instructions are known for 3.10 to 3.13 only: a newer CPython
        # could wait with others, and a tool judged wrongly would lose its timeout.
        return False
    import dis  # only when a tool is made

    return not any(i.opname in _WAITING_OPS for i in dis.get_instructions(function))


def _is_async(function: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(function):
        return True
    call = getattr(function, "__call__", None)  # noqa: B004 - an instance with an async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _build_model(
    tool_name: str, func: Callable[..., Any], arg_docs: Mapping[str, str]
) -> tuple[type[pydantic.BaseModel], dict[str, str], list[inspect.Parameter], str | None, set[str]]:
    """The pydantic model of the arguments, its field → parameter names, and more.

    The last item is the fields whose parameter has no default in the function.

    Fields are named ``p0``, ``p1``... with the parameter's name as alias, so a
    parameter may be called ``json`` or ``model_config`` without clashing with
    :class:`pydantic.BaseModel`.
    """
    try:
        signature = inspect.signature(func, eval_str=True)
    except (NameError, SyntaxError, TypeError) as exc:
        raise TypeError(f"@tool {tool_name!r}: cannot resolve the type hints: {exc}") from exc
    except ValueError as exc:
        raise TypeError(f"@tool {tool_name!r}: no signature for {func!r}: {exc}") from exc

    definitions: dict[str, Any] = {}
    fields: dict[str, str] = {}
    no_default: set[str] = set()
    positional_only: list[inspect.Parameter] = []
    context_parameter: str | None = None
    for parameter in signature.parameters.values():
        where = f"@tool {tool_name!r}: parameter {parameter.name!r}"
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            star = "*" if parameter.kind is inspect.Parameter.VAR_POSITIONAL else "**"
            raise TypeError(
                f"@tool {tool_name!r}: {star}{parameter.name} is not supported:"
                " a tool's arguments must be named parameters with type hints"
            )
        if parameter.annotation is inspect.Parameter.empty:
            raise TypeError(f"{where} has no type hint: every tool argument needs one")
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            positional_only.append(parameter)
        if _is_context(parameter.annotation):
            if context_parameter is not None:
                raise TypeError(
                    f"{where}: only one parameter may take the AgentContext"
                    f" (already {context_parameter!r})"
                )
            context_parameter = parameter.name
            continue
        field = f"p{len(fields)}"
        fields[field] = parameter.name
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        if default is ...:
            no_default.add(field)
        definitions[field] = (parameter.annotation, pydantic.Field(default, alias=parameter.name))

    try:
        model: type[pydantic.BaseModel] = pydantic.create_model(
            f"{_identifier(tool_name)}_arguments",
            __config__=pydantic.ConfigDict(extra="forbid"),
            **definitions,
        )
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError) as exc:
        raise TypeError(f"@tool {tool_name!r}: unsupported type hint: {exc}") from exc
    return model, fields, positional_only, context_parameter, no_default


def _fields_validator(
    model: type[pydantic.BaseModel], names: Mapping[str, str]
) -> Callable[[dict[str, Any]], tuple[dict[str, Any], Any, set[str]]] | None:
    """The validator of ``model``'s fields without the model, or ``None`` when it has more.

    A model of plain fields (no nested model's definitions, no validator of
    the whole model) validates its input as its ``model-fields`` schema does,
    with the same errors (each field is read from its alias, the
    parameter's name): only that schema is compiled, its fields renamed
    ``names[field]``, so a call makes no model instance and its values come
    out by parameter.
    """
    if not model.__pydantic_complete__:
        return None
    schema: Any = model.__pydantic_core_schema__
    if schema.get("type") != "model" or schema.get("custom_init") or schema.get("root_model"):
        return None
    fields = schema.get("schema")
    if not isinstance(fields, dict) or fields.get("type") != "model-fields":
        return None
    specs = fields.get("fields")
    if not isinstance(specs, dict) or set(specs) != set(names):
        return None
    renamed = {**fields, "fields": {names[field]: spec for field, spec in specs.items()}}
    try:
        validator = pydantic_core.SchemaValidator(renamed, schema.get("config"))
    except Exception:  # the model's own validator serves then
        return None
    validate: Callable[[dict[str, Any]], tuple[dict[str, Any], Any, set[str]]]
    validate = validator.validate_python
    return validate


def _is_context(annotation: Any) -> bool:
    """``AgentContext``, a subclass, ``Annotated[...]`` of one, or ``... | None``."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) != 1:
            return False
        return _is_context(members[0])
    return isinstance(annotation, type) and issubclass(annotation, AgentContext)


def _identifier(name: str) -> str:
    return re.sub(r"\W", "_", name) or "tool"


def _json_schema(
    tool_name: str,
    model: type[pydantic.BaseModel],
    arg_docs: Mapping[str, str],
    fields: Mapping[str, str],
) -> dict[str, Any]:
    """``{"type": "object", "properties", "required", "additionalProperties": false}``.

    pydantic's ``title`` keys are dropped; ``$defs`` (nested models) stay;
    ``required`` is left out when no argument is required.
    """
    try:
        with warnings.catch_warnings():
            # A default that is not JSON-serialisable is left out of the schema.
            warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
            raw = model.model_json_schema()
    except pydantic.PydanticUserError as exc:  # e.g. PydanticInvalidForJsonSchema
        raise TypeError(f"@tool {tool_name!r}: no JSON Schema for an argument: {exc}") from exc
    cleaned = _clean(raw)
    properties: dict[str, Any] = cleaned.get("properties", {})
    for parameter in fields.values():
        doc = arg_docs.get(parameter)
        prop = properties.get(parameter)
        if doc and isinstance(prop, dict) and "description" not in prop:
            prop["description"] = doc
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if cleaned.get("required"):
        schema["required"] = cleaned["required"]
    schema["additionalProperties"] = False
    if "$defs" in cleaned:
        schema["$defs"] = cleaned["$defs"]
    return schema


def _clean(schema: Any) -> Any:
    """``schema`` without pydantic's ``title`` annotations (a property named ``title`` stays)."""
    if isinstance(schema, list):
        return [_clean(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    cleaned: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _DATA_KEYS:
            cleaned[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            cleaned[key] = {name: _clean(sub) for name, sub in value.items()}
        else:
            cleaned[key] = _clean(value)
    return cleaned


def _format_errors(tool_name: str, exc: pydantic.ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        loc = error["loc"]
        where = str(loc[0]) if loc else ""
        for item in loc[1:]:
            where += f"[{item}]" if isinstance(item, int) else f".{item}"
        message = error["msg"]
        if len(message) > 1 and message[0].isupper() and message[1].islower():
            message = message[0].lower() + message[1:]
        parts.append(f"argument {where!r}: {message}" if where else message)
    return f"{tool_name}: " + "; ".join(parts)


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The first paragraph of ``doc`` (lines joined by spaces) and its ``Args:`` entries."""
    if not doc:
        return "", {}
    lines = doc.splitlines()
    summary: list[str] = []
    for line in lines:
        stripped = line.strip()
        if not stripped or _SECTION.match(stripped):
            if summary or _SECTION.match(stripped):
                break
            continue
        summary.append(stripped)

    arg_docs: dict[str, str] = {}
    index = 0
    while index < len(lines):
        header = _ARGS_HEADER.match(lines[index])
        index += 1
        if header is None:
            continue
        header_indent = len(header.group(1))
        entry_indent: int | None = None
        current: str | None = None
        while index < len(lines):
            line = lines[index]
            if not line.strip():
                index += 1
                continue
            indent = len(line) - len(line.lstrip())
            if indent <= header_indent:
                break
            index += 1
            if entry_indent is None:
                entry_indent = indent
            if indent <= entry_indent:
                entry = _ARG_ENTRY.match(line.strip())
                current = entry.group(1) if entry else None
                if current is not None and entry is not None:
                    arg_docs[current] = entry.group(2).strip()
            elif current is not None:
                arg_docs[current] = f"{arg_docs[current]} {line.strip()}".strip()
    return " ".join(summary), arg_docs


def _output_schema(func: Callable[..., Any]) -> dict[str, Any] | None:
    """:attr:`FunctionTool.output_schema` of ``func``."""
    target = func.func if isinstance(func, functools.partial) else func
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # an annotation that names what cannot be imported here
        return None
    returned = hints.get("return")
    if returned is None or returned is dict or returned is typing.Any:
        return None
    origin = typing.get_origin(returned)
    if origin in (typing.Union, types.UnionType) or returned in (str, int, float, bool, list):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
            schema: dict[str, Any] = pydantic.TypeAdapter(returned).json_schema()
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, TypeError):
        return None
    if schema.get("type") != "object":
        return None  # (MCP's outputSchema is an object's)
    return schema
