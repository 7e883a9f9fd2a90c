"""The built-in tools and :func:`resolve_tools`, which turns a manifest's ``tools`` list into tools.

Built-in tools:

- ``fs.read``, ``fs.write``, ``fs.list``: files, confined to the allowed
  directories (:mod:`openstarry.tools.fs`).
- ``get_weather``: offline, deterministic weather (:mod:`openstarry.tools.weather`).

Any other entry of a manifest's ``tools`` list is an import reference,
``"package.module:attribute"`` (the attribute may be dotted), naming a
:class:`~openstarry.agent.interfaces.Tool` instance, a ``Tool`` subclass
(instantiated without arguments), a :func:`~openstarry.agent.tools.tool`-decorated
function, or a plain typed function (decorated here).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

from openstarry.agent.interfaces import Tool
from openstarry.agent.tools import tool
from openstarry.errors import ManifestError
from openstarry.tools.fs import DEFAULT_MAX_BYTES, FS_TOOL_NAMES, FsSandbox, fs_tools
from openstarry.tools.weather import get_weather

__all__ = [
    "BUILTIN_TOOLS",
    "DEFAULT_MAX_BYTES",
    "FsSandbox",
    "fs_tools",
    "get_weather",
    "resolve_tools",
    "tool_name",
]

#: The names of the built-in tools a manifest may list.
BUILTIN_TOOLS: tuple[str, ...] = (*FS_TOOL_NAMES, "get_weather")


def resolve_tools(
    names: Sequence[str],
    *,
    allowed_paths: Sequence[str | os.PathLike[str]] = (),
) -> dict[str, Tool]:
    """The tools a manifest's ``tools`` list names, by tool name, in the list's order.

    Args:
        names: Built-in names (:data:`BUILTIN_TOOLS`) or ``"module:attribute"``
            import references.
        allowed_paths: The directories the ``fs.*`` tools may touch; relative
            paths are relative to the first. Empty: the ``fs.*`` tools refuse
            every path.

    Raises:
        ManifestError: with ``field="tools[i]"``, for an entry that is not a
            string, an unknown built-in, a module that cannot be imported, a
            missing attribute, an object that is not a tool, or a tool whose
            name an earlier entry already gave.
    """
    resolved: dict[str, Tool] = {}
    origin: dict[str, int] = {}
    fs: dict[str, Tool] | None = None
    for index, entry in enumerate(names):
        field = f"tools[{index}]"
        if not isinstance(entry, str):
            raise ManifestError(
                f"tools[{index}] must be a string, not {type(entry).__name__}", field=field
            )
        if ":" in entry:
            found = _import_tool(entry, field)
        elif entry in FS_TOOL_NAMES:
            if fs is None:
                fs = {item.name: item for item in fs_tools(allowed_paths)}
            found = fs[entry]
        elif entry == "get_weather":
            found = get_weather
        else:
            raise ManifestError(
                f"unknown built-in tool {entry!r} (built-ins: {', '.join(BUILTIN_TOOLS)};"
                " or use 'package.module:attribute')",
                field=field,
            )
        if found.name in resolved:
            raise ManifestError(
                f"duplicate tool name {found.name!r}: {entry!r} repeats"
                f" tools[{origin[found.name]}]",
                field=field,
            )
        resolved[found.name] = found
        origin[found.name] = index
    return resolved


def import_reference(reference: str, field: str, what: str = "tool") -> Any:
    """The object a ``"package.module:attribute"`` reference names.

    Raises:
        ManifestError: for a malformed reference, a module that does not
            import or a missing attribute, naming ``field``.
    """
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ManifestError(
            f"invalid {what} reference {reference!r}: expected 'package.module:attribute'",
            field=field,
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ManifestError(
            f"{what} {reference!r}: cannot import module {module_name!r}:"
            f" {type(exc).__name__}: {exc}",
            field=field,
        ) from exc
    obj: Any = module
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ManifestError(
                f"{what} {reference!r}: {module_name!r} has no attribute {attribute!r}",
                field=field,
            ) from None
    return obj


def _import_tool(reference: str, field: str) -> Tool:
    obj = import_reference(reference, field)
    if isinstance(obj, Tool):
        return obj
    if isinstance(obj, type):
        if not issubclass(obj, Tool):
            raise ManifestError(
                f"tool {reference!r}: class {obj.__qualname__} is not a Tool subclass",
                field=field,
            )
        try:
            instance = obj()
        except Exception as exc:
            raise ManifestError(
                f"tool {reference!r}: cannot instantiate {obj.__qualname__}():"
                f" {type(exc).__name__}: {exc}",
                field=field,
            ) from exc
        return instance
    if callable(obj):
        try:
            wrapped: Tool = tool(obj)
        except TypeError as exc:
            raise ManifestError(f"tool {reference!r}: not a tool: {exc}", field=field) from exc
        return wrapped
    raise ManifestError(
        f"tool {reference!r}: not a tool: {type(obj).__name__} is neither a Tool nor a function",
        field=field,
    )


def tool_name(entry: str) -> str:
    """The name of the tool a manifest's ``tools`` entry gives.

    A built-in or remote name is the tool's name; an import reference
    (``package.module:attribute``) names the tool it imports, such as
    ``search`` for ``my_package.tools:search``. An entry that does not resolve
    stays as it is (and so matches no tool).
    """
    if ":" not in entry:
        return entry
    try:
        resolved = resolve_tools([entry])
    except Exception:
        return entry
    return next(iter(resolved), entry)
