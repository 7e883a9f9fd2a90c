"""File-system tools confined to allowed directories: ``fs.read``, ``fs.write``, ``fs.list``.

:func:`fs_tools` makes the three tools for a list of allowed directories (the
*roots*). A relative ``path`` argument is relative to the first root; an
absolute one must lie inside one of them. Every path is resolved
(:func:`os.path.realpath`: ``..`` and symbolic links, in every component)
before the check, so ``../x``, ``a/../../x``, an absolute path elsewhere, a
symbolic link to a file outside the roots and a path through a symbolic link to
a directory outside them are all refused with a :class:`ToolError` of code
``"EPERM"``, as is every path when there are no roots.

The file is then opened by its *resolved* path, one component at a time from
the root with ``O_NOFOLLOW`` (``openat``), so a symbolic link swapped in after
the check is refused too (``EPERM``) instead of followed. On platforms without
``dir_fd`` support (Windows) the resolved path is opened directly.

Other failures carry the ``errno`` name as their code: ``ENOENT`` (missing file,
or a missing parent directory for ``fs.write``, which never creates
directories), ``EISDIR``, ``ENOTDIR``, ``EACCES``...; a file larger than
``max_bytes`` (or content that large for ``fs.write``) is ``EFBIG``, and a path
that is not a regular file (a FIFO, a device) is ``EINVAL``.

Text is UTF-8. ``fs.read`` decodes with ``errors="replace"``: bytes that are not
UTF-8 become U+FFFD rather than failing the call, so a mostly-text file stays
readable (a binary file reads as noise; ``max_bytes`` bounds it).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from openstarry.agent.interfaces import Tool
from openstarry.agent.tools import tool
from openstarry.errors import ToolError

__all__ = ["DEFAULT_MAX_BYTES", "FS_TOOL_NAMES", "FsSandbox", "fs_tools"]

#: The default size limit of ``fs.read``: 1 MiB.
DEFAULT_MAX_BYTES = 1024 * 1024
#: The names of the tools :func:`fs_tools` returns, in order.
FS_TOOL_NAMES = ("fs.read", "fs.write", "fs.list")

_O_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY: int = getattr(os, "O_DIRECTORY", 0)
_O_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK: int = getattr(os, "O_NONBLOCK", 0)
_O_BINARY: int = getattr(os, "O_BINARY", 0)
_WALK = bool(_O_NOFOLLOW and _O_DIRECTORY and os.open in os.supports_dir_fd)
# What O_NOFOLLOW reports for a symbolic link: ELOOP (Linux, macOS), EMLINK (FreeBSD).
_SYMLINK_ERRNOS = frozenset({errno.ELOOP, errno.EMLINK})


class FsSandbox:
    """The allowed directories and the path checks the ``fs.*`` tools share.

    Args:
        allowed_paths: The roots. Each is made absolute and resolved now
            (``~`` is expanded); it need not exist yet. Empty: every path is
            refused.
        max_bytes: The largest file ``fs.read`` returns and ``fs.write`` writes.
    """

    def __init__(
        self,
        allowed_paths: Sequence[str | os.PathLike[str]],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must not be negative, not {max_bytes}")
        self.roots: tuple[Path, ...] = tuple(
            Path(os.path.realpath(Path(root).expanduser())) for root in allowed_paths
        )
        self.max_bytes = max_bytes

    def resolve(self, tool_name: str, path: str) -> tuple[Path, Path]:
        """``(root, resolved)``: the resolved ``path`` and the root that contains it.

        Raises:
            ToolError: ``EPERM`` when ``path`` resolves outside every root, or
                there is no root; ``EINVAL`` for a path with a NUL character.
        """
        if not self.roots:
            raise ToolError(
                f"{tool_name}: {path!r}: access denied: no directory is allowed", code="EPERM"
            )
        if "\0" in path:
            raise ToolError(f"{tool_name}: {path!r}: a path cannot contain NUL", code="EINVAL")
        candidate = Path(path)
        if not candidate.is_absolute():
            candidate = self.roots[0] / candidate
        resolved = Path(os.path.realpath(candidate))
        for root in self.roots:
            if resolved.is_relative_to(root):
                return root, resolved
        raise ToolError(
            f"{tool_name}: {path!r}: access denied: outside the allowed directories",
            code="EPERM",
        )

    def display(self, resolved: Path) -> str:
        """``resolved`` as the tools accept it back: relative to the first root when inside it."""
        if resolved.is_relative_to(self.roots[0]):
            return resolved.relative_to(self.roots[0]).as_posix() or "."
        return str(resolved)

    @contextmanager
    def open(
        self, tool_name: str, path: str, flags: int, mode: int = 0o666
    ) -> Iterator[tuple[int, Path]]:
        """Check ``path``, open it with ``flags`` and yield ``(fd, resolved)``; closes the fd."""
        root, resolved = self.resolve(tool_name, path)
        flags |= _O_CLOEXEC | _O_NOFOLLOW | _O_BINARY
        try:
            fd = self._open_resolved(root, resolved, flags, mode)
        except OSError as exc:
            raise _os_error(tool_name, path, exc) from None
        try:
            yield fd, resolved
        finally:
            os.close(fd)

    @staticmethod
    def _open_resolved(root: Path, resolved: Path, flags: int, mode: int) -> int:
        if not _WALK:
            return os.open(resolved, flags, mode)
        parts = resolved.relative_to(root).parts
        if not parts:  # the root itself
            return os.open(root, flags & ~_O_NOFOLLOW, mode)
        directory = os.open(root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        try:
            for part in parts[:-1]:
                flags_dir = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
                child = _open_at(part, flags_dir, 0, directory)
                os.close(directory)
                directory = child
            return _open_at(parts[-1], flags, mode, directory)
        finally:
            os.close(directory)


def _open_at(name: str, flags: int, mode: int, directory: int) -> int:
    """``openat``; a symbolic link met under ``O_NOFOLLOW`` is always ``ELOOP``.

    (Linux says ``ENOTDIR`` for a link opened with ``O_DIRECTORY | O_NOFOLLOW``.)
    """
    try:
        return os.open(name, flags, mode, dir_fd=directory)
    except OSError as exc:
        if exc.errno in _SYMLINK_ERRNOS or exc.errno == errno.ENOTDIR:
            try:
                is_link = stat.S_ISLNK(os.lstat(name, dir_fd=directory).st_mode)
            except OSError:
                is_link = False
            if is_link:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from exc
        raise


def _os_error(tool_name: str, path: str, exc: OSError) -> ToolError:
    if exc.errno in _SYMLINK_ERRNOS:
        return ToolError(
            f"{tool_name}: {path!r}: access denied: a symbolic link in the path was not followed",
            code="EPERM",
        )
    code = errno.errorcode.get(exc.errno or 0, "EIO")
    reason = exc.strerror or str(exc)
    return ToolError(f"{tool_name}: {path!r}: {reason}", code=code)


def fs_tools(
    allowed_paths: Sequence[str | os.PathLike[str]],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> list[Tool]:
    """``[fs.read, fs.write, fs.list]`` confined to ``allowed_paths``.

    A relative ``path`` argument is relative to the first allowed path. With no
    allowed path, every call fails with ``EPERM``. ``fs.read`` refuses files
    larger than ``max_bytes``, and ``fs.write`` content larger than it (``EFBIG``).
    """
    sandbox = FsSandbox(allowed_paths, max_bytes=max_bytes)

    @tool(
        name="fs.read",
        description=(
            "Read a UTF-8 text file and return its content. A relative path is relative "
            "to the working directory; only the allowed directories are accessible."
        ),
    )
    def fs_read(
        path: Annotated[str, Field(description="The file to read.")],
    ) -> str:
        with sandbox.open("fs.read", path, os.O_RDONLY | _O_NONBLOCK) as (fd, _):
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise ToolError(f"fs.read: {path!r}: is a directory", code="EISDIR")
            if not stat.S_ISREG(info.st_mode):
                raise ToolError(f"fs.read: {path!r}: not a regular file", code="EINVAL")
            too_big = ToolError(
                f"fs.read: {path!r}: file too large (over {sandbox.max_bytes} bytes)",
                code="EFBIG",
            )
            if info.st_size > sandbox.max_bytes:
                raise too_big
            chunks: list[bytes] = []
            size = 0
            while size <= sandbox.max_bytes:  # the file may have grown since fstat
                chunk = os.read(fd, sandbox.max_bytes + 1 - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            if size > sandbox.max_bytes:
                raise too_big
        return b"".join(chunks).decode("utf-8", errors="replace")

    @tool(
        name="fs.write",
        description=(
            "Write text to a file (UTF-8), replacing its content if it exists. The parent "
            "directory must exist. Returns the path written and the number of bytes."
        ),
    )
    def fs_write(
        path: Annotated[str, Field(description="The file to write.")],
        content: Annotated[str, Field(description="The text to write.")],
    ) -> dict[str, Any]:
        data = content.encode("utf-8")
        if len(data) > sandbox.max_bytes:
            raise ToolError(
                f"fs.write: {path!r}: content too large ({len(data)} bytes, "
                f"over {sandbox.max_bytes})",
                code="EFBIG",
            )
        # No O_TRUNC: the file is checked first and truncated only once it passes.
        flags = os.O_WRONLY | os.O_CREAT | _O_NONBLOCK
        with sandbox.open("fs.write", path, flags) as (fd, resolved):
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ToolError(f"fs.write: {path!r}: not a regular file", code="EINVAL")
            if info.st_nlink > 1:
                # Another name of the same file may lie outside the allowed folders.
                raise ToolError(
                    f"fs.write: {path!r}: access denied: the file has {info.st_nlink} "
                    "hard links (one may lie outside the allowed directories)",
                    code="EPERM",
                )
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        return {"path": sandbox.display(resolved), "bytes": len(data)}

    @tool(
        name="fs.list",
        description=(
            "List a directory: each entry's name, type (file, dir, symlink or other) and "
            "size in bytes (files only), sorted by name."
        ),
    )
    def fs_list(
        path: Annotated[str, Field(description="The directory to list.")] = ".",
    ) -> list[dict[str, Any]]:
        try:
            if _WALK and os.scandir in os.supports_fd:
                flags = os.O_RDONLY | _O_DIRECTORY
                with sandbox.open("fs.list", path, flags) as (fd, _), os.scandir(fd) as scan:
                    entries = [_entry(entry) for entry in scan]
            else:  # Windows cannot open() a directory: list it by its checked, resolved path
                _, resolved = sandbox.resolve("fs.list", path)
                with os.scandir(resolved) as scan:
                    entries = [_entry(entry) for entry in scan]
        except OSError as exc:
            raise _os_error("fs.list", path, exc) from None
        return sorted(entries, key=lambda entry: str(entry["name"]))

    return [fs_read, fs_write, fs_list]


def _entry(entry: os.DirEntry[Any]) -> dict[str, Any]:
    """An entry of ``fs.list``; symbolic links are reported, not followed."""
    # A name that is not UTF-8 shows with U+FFFD, as fs.read shows such content:
    # os.fsdecode's surrogates could not go out in an event.
    name = os.fsencode(entry.name).decode("utf-8", "replace")
    if entry.is_symlink():
        return {"name": name, "type": "symlink", "size": None}
    if entry.is_dir(follow_symlinks=False):
        return {"name": name, "type": "dir", "size": None}
    if entry.is_file(follow_symlinks=False):
        return {"name": name, "type": "file", "size": entry.stat(follow_symlinks=False).st_size}
    return {"name": name, "type": "other", "size": None}
