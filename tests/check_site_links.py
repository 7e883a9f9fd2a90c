"""Crawls the built site (``mkdocs build``) for references that should be links and are not.

    python tests/check_site_links.py site

Every HTML page under the site's folder is read, and two things fail the check:

- inline code that names a documented openstarry object and is not a link: its
  text is the full path of an object the reference documents
  (``openstarry.agent.Agent``), the end of one (``Agent.ask``), or, inside an
  object's documentation in the reference, a name that resolves from there as
  ``docs/griffe_rest.py`` resolves a docstring's names (``ask()`` in ``Agent``'s);
- an internal link (``href``) to a file that is not there, or to an anchor that
  the page it leads to does not have.

The documented objects are the site's ``objects.inv`` (every object mkdocstrings
rendered, under each name it goes by) and the ids of the reference's headings.
Code in blocks, in headings and in signatures is the documentation itself and is
not checked. Prints each finding as ``page: text`` and exits 1 if there is any;
else says how many references link to the reference. Standard library only.
"""

from __future__ import annotations

import ast
import re
import sys
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

#: The package whose objects are checked.
PACKAGE = "openstarry"
#: An object's path as the reference writes it: dotted identifiers.
PYTHON_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
VOID = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
)
#: Where code is the documentation itself, not a reference: blocks, signatures, headings.
NOT_REFERENCES = frozenset({"pre", "h1", "h2", "h3", "h4", "h5", "h6"})


@dataclass
class Code:
    """One inline ``<code>`` that is not in a link, and where it stands."""

    text: str
    #: The id of the documented object whose documentation holds it, if any.
    context: str | None = None
    #: The ``title`` of a ``<span>`` around it or in it: a reference mkdocs-autorefs
    #: could not resolve (mkdocstrings', or docs/griffe_rest.py's), naming its target.
    span_title: str | None = None


@dataclass
class Page:
    """What the checks read of one page."""

    ids: set[str] = field(default_factory=set)
    hrefs: list[str] = field(default_factory=list)
    codes: list[Code] = field(default_factory=list)
    #: The targets of the links whose text is code.
    code_links: list[str] = field(default_factory=list)
    #: A documented function's or class's parameters (its "Parameters" table), by its id.
    parameters: dict[str, set[str]] = field(default_factory=dict)


@dataclass
class _Element:
    tag: str
    href: str | None = None
    span_title: str | None = None
    #: A ``div.doc-object`` (mkdocstrings' documentation of one object).
    doc_object: bool = False
    #: A row of a docstring's section (parameters, attributes, raises): its cells so far.
    section_row: bool = False
    cells: int = 0
    #: The first cell of such a row: a parameter's or attribute's own name.
    name_cell: bool = False
    #: A ``div.doc-signature``: a function's or class's signature.
    signature: bool = False


class PageParser(HTMLParser):
    """Collects a page's ids, hrefs and inline code, with the object each code documents."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()
        self._open: list[_Element] = []
        #: One per open ``div.doc-object``: its object's id, once its heading is read.
        self._objects: list[str | None] = []
        self._code: list[str] | None = None
        self._code_span: str | None = None
        #: The href of a link inside the code being read (``<code><a>Name</a></code>``).
        self._code_link: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        ident = attributes.get("id") or (attributes.get("name") if tag == "a" else None)
        if ident:
            self.page.ids.add(ident)
            if self._objects and self._objects[-1] is None and ident.startswith(PACKAGE):
                self._objects[-1] = ident
        if "href" in attributes and tag in ("a", "link", "area"):
            self.page.hrefs.append(attributes["href"])
        if tag in VOID:
            return
        classes = attributes.get("class", "").split()
        element = _Element(
            tag,
            href=attributes.get("href") if tag == "a" else None,
            span_title=attributes.get("title") if tag == "span" else None,
            doc_object=tag == "div" and "doc-object" in classes,
            section_row=tag == "tr" and "doc-section-item" in classes,
            signature=tag == "div" and "doc-signature" in classes,
        )
        if tag == "td" and self._open and self._open[-1].section_row:
            self._open[-1].cells += 1
            element.name_cell = self._open[-1].cells == 1
        if element.doc_object:
            self._objects.append(None)
        if self._code is not None:
            if element.span_title and self._code_span is None:
                self._code_span = element.span_title
            if tag == "a" and self._code_link is None:
                self._code_link = element.href or ""
        if tag == "code" and self._code is None:
            self._code = []
            self._code_span = next((e.span_title for e in self._open if e.span_title), None)
            self._code_link = None
        self._open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if not any(element.tag == tag for element in self._open):
            return  # a stray end tag
        while self._open:
            element = self._open.pop()
            if element.doc_object:
                self._objects.pop()
            if element.tag == "code" and self._code is not None and not self._in("code"):
                self._end_code()
            if element.tag == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._code is not None:
            self._code.append(data)

    def _in(self, *tags: str) -> bool:
        return any(element.tag in tags for element in self._open)

    def _end_code(self) -> None:
        text = " ".join("".join(self._code or []).split())
        self._code = None
        context = next((ident for ident in reversed(self._objects) if ident), None)
        if context is not None and any(element.signature for element in self._open):
            self.page.parameters.setdefault(context, set()).update(parameters_of(text))
            return
        if any(element.name_cell for element in self._open):
            # A section's own name: a parameter's (plain code) or an attribute's (a reference).
            if context is not None and self._code_span is None and self._code_link is None:
                self.page.parameters.setdefault(context, set()).add(text)
            return
        if self._in(*NOT_REFERENCES):
            return
        link = next((element for element in reversed(self._open) if element.tag == "a"), None)
        if link is not None or self._code_link is not None:
            href = link.href if link is not None else self._code_link
            self.page.code_links.append(href or "")
            return
        self.page.codes.append(Code(text, context, self._code_span))


def parameters_of(signature: str) -> set[str]:
    """The parameters' names in a rendered signature: ``f(a: int, *, b=1) -> X`` has a and b."""
    _, paren, rest = signature.partition("(")
    if not paren:
        return set()
    try:
        tree = ast.parse(f"def f({rest.rpartition(')')[0]}): pass")
    except SyntaxError:
        return set(re.findall(r"(?:^|[(,])\s*\**([A-Za-z_]\w*)\s*(?=[:=,)]|$)", paren + rest))
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef)
    arguments = function.args
    every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
    return {argument.arg for argument in every}


def parse_page(html: str) -> Page:
    parser = PageParser()
    parser.feed(html)
    parser.close()
    return parser.page


# --- what the site documents --------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """An object of ``objects.inv``: its kind (``module``, ``class``...) and its anchor."""

    kind: str
    anchor: str


def read_inventory(data: bytes) -> dict[str, Entry]:
    """The Python objects of a Sphinx inventory (``objects.inv``, version 2), by name."""
    header_lines = 4
    parts = data.split(b"\n", header_lines)
    if len(parts) <= header_lines or not parts[0].startswith(b"# Sphinx inventory version 2"):
        raise ValueError("not a Sphinx inventory (version 2)")
    objects: dict[str, Entry] = {}
    for line in zlib.decompress(parts[header_lines]).decode("utf-8").splitlines():
        match = re.match(
            r"(?P<name>\S+)\s+(?P<domain>\w+):(?P<kind>\w+)\s+-?\d+\s+(?P<uri>\S*)", line
        )
        if match is None or match["domain"] != "py":
            continue
        uri = match["uri"]
        if uri.endswith("$"):
            uri = uri[:-1] + match["name"]
        objects[match["name"]] = Entry(match["kind"], uri.partition("#")[2])
    return objects


class Documented:
    """The objects the site documents: every name each goes by, and the anchor it is at.

    ``ids`` are the anchors of the reference's headings (each object's path where it
    is documented); ``inventory`` adds the other names of each (the module that
    defines it, those that import it), as ``objects.inv`` lists them.
    """

    def __init__(self, ids: Iterable[str], inventory: dict[str, Entry] | None = None) -> None:
        self.primary = {name for name in ids if is_object_id(name)}
        self.anchors = {name: name for name in self.primary}
        self.modules: set[str] = set()
        for name, entry in (inventory or {}).items():
            if is_object_id(name):
                self.anchors.setdefault(name, entry.anchor or name)
                if entry.kind == "module":
                    self.modules.add(name)
        self._names_at: dict[str, set[str]] = {}
        for name, anchor in self.anchors.items():
            self._names_at.setdefault(anchor, {anchor}).add(name)
        #: ``Class.member`` -> the anchors of the documented names that end so.
        self._tails: dict[str, set[str]] = {}
        for name, anchor in self.anchors.items():
            parts = name.split(".")
            for start in range(1, len(parts) - 1):
                if parts[start][:1].isupper():
                    self._tails.setdefault(".".join(parts[start:]), set()).add(anchor)

    def __contains__(self, name: str) -> bool:
        return name in self.anchors

    def is_full_name(self, name: str) -> bool:
        """Whether ``name``, written alone, is a documented object's full path.

        The package's own re-exports (``openstarry.tool``) count only where the
        reference documents them: alone, they are as likely a span's or a logger's name.
        """
        return name in self.primary or (name in self.anchors and name.count(".") > 1)

    def names_of(self, anchor: str) -> set[str]:
        """Every name of the object documented at ``anchor`` (an alias's and its target's)."""
        return self._names_at.get(anchor, {anchor})

    def member(self, tail: str) -> str | None:
        """The one documented object whose name ends with ``tail`` (``Agent.ask``), if one."""
        anchors = self._tails.get(tail, set())
        return next(iter(anchors)) if len(anchors) == 1 else None


def is_object_id(name: str) -> bool:
    """Whether ``name`` is an object's path in the package (not a parameter's, not a slug)."""
    return (name == PACKAGE or name.startswith(f"{PACKAGE}.")) and bool(PYTHON_PATH.fullmatch(name))


def _scopes(documented: Documented, context: str, single: bool) -> list[str]:
    """The objects a name in ``context``'s documentation is looked up in, innermost first.

    As ``docs/griffe_rest.py`` looks up a literal: a ``single`` name only up to
    the module (of each name the object goes by), a dotted one up to the package.
    """
    scopes: list[str] = []
    for name in sorted(documented.names_of(documented.anchors.get(context, context))):
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            scope = ".".join(parts[:end])
            if single and scope == PACKAGE:
                break
            scopes.append(scope)
            if single and scope in documented.modules:
                break
    return list(dict.fromkeys(scopes))


def should_link(code: Code, documented: Documented) -> str | None:
    """The documented object ``code`` names, when it names one and is not a link; else None.

    Outside an object's documentation, only a dotted name counts: a full path, or a
    class's member (``Agent.ask``) that one documented object ends with. Inside
    one, a name also counts when it resolves from there (``ask()`` in ``Agent``'s),
    a single name to no module, and only a class's, a constant's or a call's.
    """
    if code.span_title is not None:
        # An unresolved reference names its own target: it is missing only if documented.
        target = code.span_title.partition("(")[0]
        return target if target in documented else None
    text = code.text.removesuffix("()")
    if not PYTHON_PATH.fullmatch(text):
        return None
    single = "." not in text
    if single and not text[:1].isupper() and text == code.text:
        return None  # a lowercase word alone: as often a value or a key as a name
    if not single:
        if documented.is_full_name(text):
            return text
        member = documented.member(text)
        if member is not None:
            return member
    if code.context is not None:
        for scope in _scopes(documented, code.context, single):
            found = f"{scope}.{text}"
            if found in documented and not (single and found in documented.modules):
                return found
    return None


# --- the crawl ----------------------------------------------------------------------------------


def _site_base(site: Path) -> str:
    """The path the site is served under (``/openstarry/``), from its sitemap; ``/`` if none."""
    sitemap = site / "sitemap.xml"
    if not sitemap.is_file():
        return "/"
    locations: list[str] = re.findall(r"<loc>([^<]+)</loc>", sitemap.read_text(encoding="utf-8"))
    if not locations:
        return "/"
    base = min((urlsplit(location).path for location in locations), key=len)
    return base if base.endswith("/") else base + "/"


def _target_file(site: Path, page: PurePosixPath, path: str, base: str) -> Path:
    """The file a link's path leads to from ``page`` (a path relative to ``site``)."""
    if path.startswith("/"):
        relative = PurePosixPath(path.removeprefix(base) if path.startswith(base) else path[1:])
    elif path:
        relative = page.parent / path
    else:
        relative = page
    target = site.joinpath(*(part for part in relative.parts if part not in ("", ".")))
    target = target.resolve()
    if path.endswith("/") or target.is_dir():
        target = target / "index.html"
    return target


def check_site(site: Path) -> tuple[list[str], int]:
    """The findings (``page: text``) of the crawl, and how many code references link."""
    site = site.resolve()
    pages = {
        PurePosixPath(path.relative_to(site).as_posix()): parse_page(
            path.read_text(encoding="utf-8")
        )
        for path in sorted(site.rglob("*.html"))
    }
    inventory_file = site / "objects.inv"
    inventory = read_inventory(inventory_file.read_bytes()) if inventory_file.is_file() else {}
    documented = Documented((i for page in pages.values() for i in page.ids), inventory)
    base = _site_base(site)
    findings: list[str] = []
    linked = 0
    for name, page in pages.items():
        for code in page.codes:
            if code.context is not None and code.text in page.parameters.get(code.context, ()):
                continue  # a parameter of the function it documents, named
            target = should_link(code, documented)
            if target is not None:
                findings.append(f"{name}: `{code.text}` is not a link (to {target})")
        for href in page.hrefs:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or href == "#":
                continue
            target_file = _target_file(site, name, unquote(parts.path), base)
            if not target_file.is_file():
                findings.append(f"{name}: link {href!r} leads to no file")
                continue
            if parts.fragment:
                try:
                    target_page = pages[PurePosixPath(target_file.relative_to(site).as_posix())]
                except (KeyError, ValueError):
                    continue  # not a page of the site: no anchors to check
                if unquote(parts.fragment) not in target_page.ids:
                    findings.append(f"{name}: link {href!r} leads to no anchor")
        linked += sum(
            1
            for href in page.code_links
            if not urlsplit(href).scheme and unquote(urlsplit(href).fragment) in documented
        )
    return findings, linked


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/check_site_links.py SITE_DIR", file=sys.stderr)
        return 2
    site = Path(argv[0])
    if not (site / "index.html").is_file():
        print(f"{site}: no built site here (run mkdocs build)", file=sys.stderr)
        return 2
    findings, linked = check_site(site)
    for finding in findings:
        print(finding)
    if findings:
        print(f"{len(findings)} problem(s); {linked} code references link", file=sys.stderr)
        return 1
    print(f"{site}: {linked} code references link to the reference; no unlinked one, no dead link")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
