"""The resources an agent exposes over MCP (spec 004 section 1): files and Python functions.

The manifest's ``mcp.expose_resources`` lists them::

    "fs": {"allowedPaths": ["workspace"]},
    "mcp": {"expose_resources": ["workspace/", "notes.md", "my_pkg.res:today"],
            "private_resources": ["workspace/secret.txt"]}

- **A path** (relative to the manifest's folder) inside ``fs.allowedPaths``: a
  file, or a folder (its files, in every subfolder, are each a resource). Each
  file is a ``file://`` resource named by its path relative to the manifest's
  folder. A path outside ``fs.allowedPaths`` is a :class:`ManifestError`.
- **An import reference** ``module:attribute`` to a function decorated with
  :func:`resource`, which gives its URI template: a URI without ``{...}`` is a
  plain resource (listed), one with variables a template (in
  ``resources/templates/list``); reading a URI that matches calls the function
  with the variables as keyword arguments; it returns ``str`` or ``bytes``
  (sync or async).

Rules the catalog keeps:

- **Confinement as the fs tools'.** A ``file://`` URI is read only when its
  real path (links resolved) is an exposed file or inside an exposed folder,
  inside ``fs.allowedPaths``, and not at or under a ``private_resources``
  path. A private path is never listed, and reading it gets the same
  "unknown resource" answer as a path that does not exist.
- **Bounded.** At most :data:`MAX_LISTED` files are listed; a file larger than
  :data:`MAX_READ_BYTES` is refused.
"""

from __future__ import annotations

import base64
import inspect
import mimetypes
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, unquote, urlsplit

import anyio.to_thread
import mcp.types as types

from openstarry.errors import ManifestError

__all__ = ["MAX_LISTED", "MAX_READ_BYTES", "ResourceCatalog", "UnknownResource", "resource"]

#: Files listed at most (the first ones, in path order).
MAX_LISTED = 1000
#: The largest file read, in bytes.
MAX_READ_BYTES = 8 * 1024 * 1024

_F = TypeVar("_F", bound=Callable[..., Any])
_VARIABLE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class UnknownResource(LookupError):
    """No exposed resource has that URI (or it is private: the answer is the same)."""


def resource(
    uri_template: str,
    *,
    name: str | None = None,
    description: str | None = None,
    mime_type: str = "text/plain",
) -> Callable[[_F], _F]:
    """Mark a function as an MCP resource at ``uri_template`` (``"notes://{day}"``).

    Name it in ``mcp.expose_resources`` as ``"package.module:function"``.
    """

    def mark(function: _F) -> _F:
        function.__openstarry_resource__ = _PyResource(  # type: ignore[attr-defined]
            uri_template,
            name or function.__name__,
            description or inspect.getdoc(function),
            mime_type,
            function,
        )
        return function

    return mark


@dataclass(frozen=True, slots=True)
class _PyResource:
    uri_template: str
    name: str
    description: str | None
    mime_type: str
    function: Callable[..., Any]

    @property
    def is_template(self) -> bool:
        return _VARIABLE.search(self.uri_template) is not None

    def match(self, uri: str) -> dict[str, str] | None:
        pattern = "".join(
            f"(?P<{part[1:-1]}>[^/]+)" if _VARIABLE.fullmatch(part) else re.escape(part)
            for part in re.split(r"(\{[A-Za-z_][A-Za-z0-9_]*\})", self.uri_template)
        )
        found = re.fullmatch(pattern, uri)
        return {k: unquote(v) for k, v in found.groupdict().items()} if found else None


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


class ResourceCatalog:
    """What ``resources/list``, ``resources/templates/list`` and ``resources/read`` serve.

    Args:
        entries: ``mcp.expose_resources``.
        private: ``mcp.private_resources``.
        base_dir: The manifest's folder, which relative paths are relative to.
        allowed_paths: ``fs.allowedPaths``, resolved.

    Raises:
        ManifestError: a path outside ``fs.allowedPaths``, or a reference that
            is not a :func:`resource`.
    """

    def __init__(
        self,
        entries: Sequence[str],
        private: Sequence[str],
        base_dir: Path,
        allowed_paths: Sequence[Path],
    ) -> None:
        self.base_dir = Path(os.path.realpath(base_dir))
        self.allowed = [Path(os.path.realpath(p)) for p in allowed_paths]
        self.files: list[Path] = []
        self.folders: list[Path] = []
        self.functions: list[_PyResource] = []
        for index, entry in enumerate(entries):
            field = f"mcp.expose_resources[{index}]"
            if ":" in entry and not os.path.exists(self.base_dir / entry):
                self.functions.append(_imported(entry, field))
                continue
            path = Path(os.path.realpath(self.base_dir / entry))
            if not any(_inside(path, root) for root in self.allowed):
                raise ManifestError(
                    f"{field}: {entry!r} is outside fs.allowedPaths", field="mcp.expose_resources"
                )
            (self.folders if entry.endswith("/") or path.is_dir() else self.files).append(path)
        self.private = [Path(os.path.realpath(self.base_dir / p)) for p in private]

    def __bool__(self) -> bool:
        return bool(self.files or self.folders or self.functions)

    # -- files -----------------------------------------------------------

    def _visible(self, path: Path) -> bool:
        """Whether a real path is exposed, allowed and not private."""
        if any(_inside(path, p) for p in self.private):
            return False
        if not any(_inside(path, root) for root in self.allowed):
            return False
        return path in self.files or any(_inside(path, folder) for folder in self.folders)

    def exposed_files(self) -> list[Path]:
        """The exposed files that exist now, in path order, at most :data:`MAX_LISTED`."""
        found: set[Path] = {f for f in self.files if f.is_file() and self._visible(f)}
        for folder in self.folders:
            for top, dirs, names in os.walk(folder):
                dirs.sort()
                for name in names:
                    real = Path(os.path.realpath(Path(top) / name))
                    if real.is_file() and self._visible(real):
                        found.add(real)
                if len(found) > MAX_LISTED:
                    break
        return sorted(found)[:MAX_LISTED]

    def uri_of(self, path: Path) -> str:
        return "file://" + quote(path.as_posix())

    def _name_of(self, path: Path) -> str:
        return (
            path.relative_to(self.base_dir).as_posix()
            if path.is_relative_to(self.base_dir)
            else path.name
        )

    # -- the three requests -------------------------------------------------

    def listed(self) -> list[types.Resource]:
        """``resources/list``: the files, then the functions without variables."""
        listed = [
            types.Resource(
                uri=self.uri_of(path),
                name=self._name_of(path),
                mime_type=mimetypes.guess_type(path.name)[0] or "text/plain",
                size=path.stat().st_size,
            )
            for path in self.exposed_files()
        ]
        listed += [
            types.Resource(
                uri=r.uri_template, name=r.name, description=r.description, mime_type=r.mime_type
            )
            for r in self.functions
            if not r.is_template
        ]
        return listed

    def templates(self) -> list[types.ResourceTemplate]:
        """``resources/templates/list``: the functions with variables in their URI."""
        return [
            types.ResourceTemplate(
                uri_template=r.uri_template,
                name=r.name,
                description=r.description,
                mime_type=r.mime_type,
            )
            for r in self.functions
            if r.is_template
        ]

    def listing(self) -> tuple[str, ...]:
        """What :meth:`listed` would name now: compared to see whether the list changed."""
        return tuple(self.uri_of(p) for p in self.exposed_files())

    async def read(self, uri: str) -> list[types.TextResourceContents | types.BlobResourceContents]:
        """``resources/read``.

        Raises:
            UnknownResource: not exposed, private, or not there.
            ValueError: a file larger than :data:`MAX_READ_BYTES`.
        """
        for function in self.functions:
            variables = function.match(uri)
            if variables is not None:
                value = function.function(**variables)
                if inspect.isawaitable(value):
                    value = await value
                return [_contents(uri, value, function.mime_type)]
        parts = urlsplit(uri)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
            raise UnknownResource(uri)
        path = Path(os.path.realpath(unquote(parts.path)))
        if not self._visible(path) or not path.is_file():
            raise UnknownResource(uri)
        size = path.stat().st_size
        if size > MAX_READ_BYTES:
            raise ValueError(f"{uri}: {size} bytes, more than the {MAX_READ_BYTES} read at most")
        data = await anyio.to_thread.run_sync(path.read_bytes)
        mime = mimetypes.guess_type(path.name)[0] or "text/plain"
        return [_contents(uri, data, mime)]


def _contents(
    uri: str, value: Any, mime: str
) -> types.TextResourceContents | types.BlobResourceContents:
    if isinstance(value, bytes):
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            blob = base64.b64encode(value).decode("ascii")
            return types.BlobResourceContents(uri=uri, mime_type=mime, blob=blob)
        return types.TextResourceContents(uri=uri, mime_type=mime, text=text)
    return types.TextResourceContents(uri=uri, mime_type=mime, text=str(value))


def _imported(entry: str, field: str) -> _PyResource:
    from openstarry.tools import import_reference

    target: Any = import_reference(entry, "mcp.expose_resources", "resource")
    found = getattr(target, "__openstarry_resource__", None)
    if not isinstance(found, _PyResource):
        raise ManifestError(
            f"{field}: {entry!r} is not marked with @openstarry.mcp.resources.resource",
            field="mcp.expose_resources",
        )
    return found
