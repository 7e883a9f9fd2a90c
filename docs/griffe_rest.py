"""A griffe extension: openstarry's docstrings, written for readers of the source, as Markdown.

The docstrings are Google style with a few reStructuredText habits that read
well in a terminal (``help()``, an editor's hover) but that Markdown does not
know: cross-reference roles (``:class:`~openstarry.bus.EventBus```) and
paragraphs that end in ``::`` before an indented literal block. This extension
rewrites those two, and nothing else, before mkdocstrings renders a docstring:
a closing ``::`` becomes ``:`` (the indented block that follows is already a
Markdown code block), and a role becomes inline code of the name it shows (the
last dotted part after ``~``, the title of ``title <target>``), a link to the
object's entry in the reference when the name is one of openstarry's.

A role's name is looked up as Sphinx looks it up: in the class or module whose
docstring it is in, then in each module above, up to the package, then as a
full dotted path; a name that starts with ``.`` is also looked for as the end
of any of the package's paths. The link is an optional cross-reference of
mkdocs-autorefs: a name that resolves to nothing the site documents (the
standard library's, a third party's, a private helper's) stays inline code,
and fails no build.

It also reads the ``#:`` comments above a module's or class's attribute (Sphinx's
doc-comments, as ``_core.pyi`` and ``events.py`` write them) as that attribute's
docstring, when it has none, and leaves out the expression an instance
attribute is assigned in ``__init__`` (how it is made, not its value).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import griffe

#: Turns a role's target (a dotted name, as written; ``True`` after it for an inline
#: literal's) into the identifier of the object it names, or ``None`` when it names
#: nothing documented.
Resolve = Callable[[str, bool], str | None]

# :class:`~a.b.C`, :meth:`C.m`, :data:`X`, :mod:`a.b`, :attr:`x <a.b.x>`, ...; or ``a.b.C``.
_REFERENCE = re.compile(
    r":(?:py:)?[a-z]+:`(?P<text>[^`]+)`"
    r"|``(?P<literal>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?:\(\))?)``"
)


def role_parts(text: str) -> tuple[str, str]:
    """The title a role shows and the target it names: ``~a.b.C`` shows ``C``, names ``a.b.C``.

    ``title <target>`` shows its title; a trailing ``()`` is shown, not looked up.
    """
    explicit = re.fullmatch(r"(?P<title>.+?)\s*<(?P<target>[^>]+)>", text)
    if explicit:
        return explicit.group("title"), explicit.group("target").strip().removesuffix("()")
    target = text.removeprefix("~")
    title = target.lstrip(".").rpartition(".")[2] if text.startswith("~") else target
    return title, target.removesuffix("()")


def _link(title: str, identifier: str) -> str:
    """Inline code of ``title`` linked to ``identifier``'s entry, if the site has one.

    An optional reference of mkdocs-autorefs: a link once the object is rendered,
    the code alone (with the identifier as its tooltip) if it is not.
    """
    return (
        f'<autoref identifier="{html.escape(identifier)}" optional>'
        f"<code>{html.escape(title, quote=False)}</code></autoref>"
    )


def _reference_markdown(match: re.Match[str], resolve: Resolve | None) -> str:
    literal = match.group("literal")
    if literal is not None:
        # A literal is a reference too when it names an object documented here: a
        # dotted name, a class's or a constant's, a call's (``close()``). A lowercase
        # word alone is as often a value or a key (``created``, ``traceparent``).
        name = literal.removesuffix("()")
        if "." not in name and not name[:1].isupper() and name == literal:
            return match.group(0)
        identifier = resolve(name, True) if resolve is not None else None
        return match.group(0) if identifier is None else _link(literal, identifier)
    title, target = role_parts(match.group("text"))
    identifier = resolve(target, False) if resolve is not None else None
    return f"`{title}`" if identifier is None else _link(title, identifier)


def markdown_of(docstring: str, resolve: Resolve | None = None) -> str:
    """``docstring`` with its reStructuredText roles and ``::`` markers made Markdown.

    With ``resolve``, a role whose target it resolves becomes a link, and so
    does an inline literal that names an object it resolves (a dotted name alone).
    """
    text = _REFERENCE.sub(lambda match: _reference_markdown(match, resolve), docstring)
    lines = []
    for line in text.split("\n"):
        stripped = line.rstrip()
        if stripped.endswith("::"):
            head = stripped[:-2].rstrip()
            # "Example::" reads "Example:"; a line of "::" alone disappears.
            line = f"{head}:" if head else ""
        lines.append(line)
    return "\n".join(lines)


def _lookup(collection: griffe.ModulesCollection, path: str) -> griffe.Object | None:
    """The object (an alias followed to its target) at ``path``, if loaded."""
    try:
        found = collection[path]
        return found.final_target if isinstance(found, griffe.Alias) else found
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def _documented(obj: griffe.Object) -> bool:
    """Whether mkdocstrings renders ``obj`` (it, or one of its members, has a docstring)."""
    try:
        return obj.has_docstrings
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return False


class Resolver:
    """Resolves roles' targets in the docstrings of one package, as Sphinx's Python domain does.

    A name is looked up from where the object is defined, then from each place
    that imports it (a package's ``__init__`` that re-exports it): the reference
    shows a docstring there, and its reader reads it there.
    """

    def __init__(self, package: griffe.Module) -> None:
        self.package = package
        self._paths: list[str] | None = None
        self._aliases: dict[str, list[str]] | None = None

    def _walk(self) -> None:
        paths: list[str] = []
        aliases: dict[str, list[str]] = {}

        def walk(obj: griffe.Object) -> None:
            paths.append(obj.path)
            for member in obj.members.values():
                if not isinstance(member, griffe.Alias):
                    walk(member)
                    continue
                target = _lookup(self.package.modules_collection, member.path)
                if target is not None and target.path != member.path:
                    aliases.setdefault(target.path, []).append(member.path)

        walk(self.package)
        self._paths = paths
        self._aliases = {path: sorted(names) for path, names in aliases.items()}

    def all_paths(self) -> list[str]:
        """The canonical path of every object the package defines (for ``.name`` targets)."""
        if self._paths is None:
            self._walk()
        return self._paths or []

    def names_of(self, obj: griffe.Object) -> list[str]:
        """``obj``'s canonical path, then the paths that import it."""
        if self._aliases is None:
            self._walk()
        return [obj.path, *(self._aliases or {}).get(obj.path, ())]

    def _scopes(self, obj: griffe.Object, single: bool) -> list[str]:
        """Where a name in ``obj``'s docstring is looked up, innermost first.

        From ``obj`` (a class or module) or its parent, up to the package; a
        ``single`` literal's only up to the first module.
        """
        start = obj if (obj.is_module or obj.is_class) else obj.parent
        if start is None:
            return []
        scopes: list[str] = []
        for name in self.names_of(start):
            parts = name.split(".")
            for end in range(len(parts), 0, -1):
                scope = ".".join(parts[:end])
                scopes.append(scope)
                found = _lookup(self.package.modules_collection, scope)
                if single and (found is None or found.is_module):
                    break
        return list(dict.fromkeys(scopes))

    def identifier(self, obj: griffe.Object, target: str, literal: bool = False) -> str | None:
        """The canonical path of what ``target`` names in ``obj``'s docstring, if documented.

        A ``literal`` (``name`` in double backquotes, not a role) is a reference
        more rarely: a single name is looked up only up to the module, is no
        module, and is no parameter of the function it documents (``tools``).
        """
        name = target.lstrip(".")
        if not re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", name):
            return None
        single = literal and "." not in name
        if single and name in _parameters(obj):
            return None
        candidates = [f"{scope}.{name}" for scope in self._scopes(obj, single)] + [name]
        if target.startswith(".") and not literal:
            ending = f".{name}"
            candidates += [path for path in self.all_paths() if path.endswith(ending)]
        for path in candidates:
            # As Sphinx, which knows only documented objects: the first documented one.
            found = _lookup(self.package.modules_collection, path)
            if found is None or not _documented(found) or (single and found.is_module):
                continue
            canonical = found.canonical_path
            # The package itself is left code: its name is also the command's and the site's.
            if canonical.split(".")[0] != self.package.name or canonical == self.package.name:
                return None
            return canonical
        return None

    def for_object(self, obj: griffe.Object) -> Resolve:
        return lambda target, literal: self.identifier(obj, target, literal)


def _parameters(obj: griffe.Object) -> set[str]:
    """The names of the parameters of ``obj`` (a function, or a class's ``__init__``)."""
    function = obj.members.get("__init__") if obj.is_class else obj
    if isinstance(function, griffe.Function):
        return {parameter.name for parameter in function.parameters}
    return set()


# An attribute's line: `NAME: type`, `NAME = value`, `NAME: type = value`.
_ATTRIBUTE = re.compile(r"^\s*[A-Za-z_]\w*\s*(?::|=)")


def doc_comment(lines: list[str], lineno: int) -> str | None:
    """The ``#:`` comment lines above line ``lineno`` (from 1), joined; ``None`` if none.

    A comment above a group of attributes, with no blank line between them,
    documents each (``#: Highest and lowest priorities`` above two constants).
    """
    found: list[str] = []
    index = lineno - 2
    while index >= 0 and _ATTRIBUTE.match(lines[index]):
        index -= 1
    while index >= 0 and lines[index].strip().startswith("#:"):
        found.append(lines[index].strip()[2:].strip())
        index -= 1
    return "\n".join(reversed(found)) or None


class RestToMarkdown(griffe.Extension):
    """Rewrites each docstring once the object tree is built; reads ``#:`` doc-comments."""

    def __init__(self) -> None:
        super().__init__()
        self._sources: dict[Path, list[str]] = {}
        self._resolvers: dict[str, Resolver] = {}
        self._done: set[int] = set()

    def on_attribute_instance(self, *, attr: griffe.Attribute, **kwargs: Any) -> None:
        if attr.docstring is not None or attr.lineno is None:
            return
        path = attr.filepath
        if not isinstance(path, Path) or not path.is_file():
            return
        if path not in self._sources:
            self._sources[path] = path.read_text(encoding="utf-8").split("\n")
        comment = doc_comment(self._sources[path], attr.lineno)
        if comment is not None:
            attr.docstring = griffe.Docstring(comment, lineno=attr.lineno, parent=attr)

    def _rewrite(self, obj: griffe.Object) -> None:
        if obj.docstring is None or id(obj.docstring) in self._done:
            return
        package = obj.package
        resolver = self._resolvers.get(package.path)
        if resolver is None or resolver.package is not package:
            resolver = self._resolvers[package.path] = Resolver(package)
        obj.docstring.value = markdown_of(obj.docstring.value, resolver.for_object(obj))
        self._done.add(id(obj.docstring))

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        # The package itself gets no on_object: its docstring is rewritten here.
        self._rewrite(pkg)

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        self._rewrite(obj)
        if isinstance(obj, griffe.Attribute) and "instance-attribute" in obj.labels:
            # What ``__init__`` assigns (``self.loop = ExecutionLoop(self.bus, ...)``) is
            # how it is made, not a value to show: the signature reads ``loop``.
            obj.value = None
