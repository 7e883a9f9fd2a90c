"""MkDocs hooks: the references that are generated from the code each time the site is built.

A page asks for a generated part with a marker on a line of its own,
``<!-- generated: NAME -->``; :func:`on_page_markdown` replaces the marker with
what :data:`GENERATORS` makes for ``NAME``, so the page cannot drift from the
code:

- ``agent-json``: the ``agent.json`` reference, from the manifest's JSON Schema
  (what ``openstarry schema manifest`` prints);
- ``events``: the event envelope and the payload of each event type, from the
  protocol's JSON Schema (what ``openstarry schema protocol`` prints);
- ``cli``: every ``openstarry`` command and option, from the argparse parsers;
- ``layers``: the layers contract of ``pyproject.toml`` (what ``make lint`` checks).

It also titles "Output" each block that the tests check as the output of the
block before it (``<!-- expect-output -->``, see ``tests/test_docs.py``), and,
once every page is rendered, makes a link of each inline code on any page that
names an object the reference documents (:func:`link_code`): a full path
(``openstarry.agent.Agent``) or a class's member (``Agent.ask``). The
docstrings' own references are linked by ``docs/griffe_rest.py``.

An unknown marker fails the build. The generators import openstarry, so the
build needs it importable with its extension built (``make docs`` builds it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

_HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("_openstarry_griffe_rest", _HERE / "griffe_rest.py")
if _spec is None or _spec.loader is None:
    raise ImportError(f"cannot load {_HERE / 'griffe_rest.py'}")
_griffe_rest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_griffe_rest)
markdown_of: Callable[[str], str] = _griffe_rest.markdown_of

MARKER = re.compile(r"^<!-- generated: (?P<name>[a-z-]+) -->$", re.MULTILINE)
# A block the tests check as the output of the one before (tests/test_docs.py) is titled so.
EXPECTED_OUTPUT = re.compile(
    r"^(?P<indent>[ \t]*)<!-- expect-output -->\n(?P=indent)(?P<fence>`{3,}|~{3,})text[ \t]*$",
    re.MULTILINE,
)

JSON = dict[str, Any]


# --- JSON Schema to Markdown tables -------------------------------------------------------------


def _cell(text: str) -> str:
    """Text fit for one table cell: paragraphs kept apart, pipes escaped."""
    paragraphs = [" ".join(part.split()) for part in markdown_of(text).split("\n\n")]
    return "<br><br>".join(p for p in paragraphs if p).replace("|", "\\|")


class SchemaTables:
    """Renders the objects of one JSON Schema (pydantic's dialect) as Markdown tables.

    ``anchors`` maps a ``$defs`` name to the anchor of the section that
    describes it; a reference to such a definition becomes a link there.
    """

    def __init__(
        self, schema: JSON, anchors: dict[str, str], link_texts: dict[str, str] | None = None
    ) -> None:
        self.schema = schema
        self.defs: dict[str, JSON] = schema.get("$defs", {})
        self.anchors = anchors
        #: What a link to a definition reads (its name when absent here).
        self.link_texts = link_texts or {}

    def ref_name(self, node: JSON) -> str | None:
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return ref.removeprefix("#/$defs/")
        return None

    def resolve(self, node: JSON) -> JSON:
        name = self.ref_name(node)
        return self.defs[name] if name is not None else node

    def type_of(self, node: JSON) -> str:
        """A short, readable type: ``string``, ``integer ≥ 1``, ``list of string``, a link."""
        name = self.ref_name(node)
        if name is not None:
            target = self.defs[name]
            if "enum" in target:
                return " \\| ".join(f"`{json.dumps(v)}`" for v in target["enum"])
            if name in self.anchors:
                return f"[{self.link_texts.get(name, name)}](#{self.anchors[name]})"
            return name
        if "anyOf" in node:
            parts = [self.type_of(option) for option in node["anyOf"]]
            return " or ".join(dict.fromkeys(parts))
        if "const" in node:
            return f"`{json.dumps(node['const'])}`"
        if "enum" in node:
            return " \\| ".join(f"`{json.dumps(v)}`" for v in node["enum"])
        kind = node.get("type")
        if kind is None:
            return "any JSON value"
        if kind == "array":
            items = node.get("items")
            return f"list of {self.type_of(items)}" if items else "list"
        if kind == "object":
            extra = node.get("additionalProperties")
            if isinstance(extra, dict) and extra:
                return f"object of {self.type_of(extra)}"
            return "object"
        text = str(kind)
        bounds = []
        if "minimum" in node:
            bounds.append(f"≥ {node['minimum']}")
        if "exclusiveMinimum" in node:
            bounds.append(f"> {node['exclusiveMinimum']}")
        if "maximum" in node and node["maximum"] < 2**53:
            bounds.append(f"≤ {node['maximum']}")
        if "minLength" in node and node["minLength"] > 0:
            bounds.append("not empty" if node["minLength"] == 1 else f"≥ {node['minLength']} chars")
        if "pattern" in node:
            bounds.append(f"matching `{node['pattern']}`")
        return " ".join([text, ", ".join(bounds)]) if bounds else text

    def table(self, node: JSON) -> list[str]:
        """The table of an object's properties: key, type, default, description."""
        obj = self.resolve(node)
        required = set(obj.get("required", ()))
        rows = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
        for key, prop in obj.get("properties", {}).items():
            if key in required:
                default = "required"
            elif "default" in prop:
                default = f"`{json.dumps(prop['default'], ensure_ascii=False)}`"
            else:
                default = "see below" if self._section_of(prop) else ""
            # A bare reference has no description of its own: its definition's says it.
            described = self.defs.get(self._section_of(prop) or "", {})
            description = _cell(prop.get("description") or described.get("description", ""))
            rows.append(f"| `{key}` | {self.type_of(prop)} | {default} | {description} |")
        return rows

    def _section_of(self, prop: JSON) -> str | None:
        """The definition a property's value is described under, if it has a section."""
        for candidate in (prop, prop.get("items") or {}, *prop.get("anyOf", ())):
            name = self.ref_name(candidate)
            if name is not None and name in self.anchors:
                return name
        return None

    def closing_note(self, node: JSON) -> str:
        obj = self.resolve(node)
        if obj.get("additionalProperties") is False:
            return "Other keys are refused."
        return "Other keys are kept as they are."


# --- agent.json ---------------------------------------------------------------------------------


def _manifest_sections(schema: JSON) -> Iterator[tuple[str, str, JSON]]:
    """(JSON path, $defs name, object) of each object in the manifest, depth first from the root."""
    tables = SchemaTables(schema, {})
    seen: set[str] = set()

    def walk(path: str, node: JSON) -> Iterator[tuple[str, str, JSON]]:
        for key, prop in tables.resolve(node).get("properties", {}).items():
            for candidate, suffix in (
                (prop, ""),
                (prop.get("items") or {}, "[]"),
                *((option, "") for option in prop.get("anyOf", ())),
                *((option.get("items") or {}, "[]") for option in prop.get("anyOf", ())),
            ):
                name = tables.ref_name(candidate)
                if name is None or name in seen or "properties" not in tables.defs[name]:
                    continue
                seen.add(name)
                child = f"{path}.{key}{suffix}" if path else f"{key}{suffix}"
                yield child, name, tables.defs[name]
                yield from walk(child, tables.defs[name])

    yield from walk("", schema)


def _anchor(path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


def agent_json_reference() -> str:
    """Every key of ``agent.json``: a table for the top level, then one section per object."""
    from openstarry.manifest import AgentManifest

    schema = AgentManifest.json_schema()
    sections = list(_manifest_sections(schema))
    anchors = {name: _anchor(path) for path, name, _ in sections}
    # In agent.json an object is known by where it sits, not by its model's name.
    tables = SchemaTables(schema, anchors, {name: "object" for name in anchors})
    out = ["## The top level", "", *tables.table(schema), "", tables.closing_note(schema), ""]
    for path, _name, node in sections:
        out += [f"## `{path}` {{#{_anchor(path)}}}", ""]
        if node.get("description"):
            out += [markdown_of(node["description"]), ""]
        out += [*tables.table(node), "", tables.closing_note(node), ""]
    return "\n".join(out)


# --- the events of spec 002 ---------------------------------------------------------------------


def events_reference() -> str:
    """The envelope, then each event type with its payload, then the shapes they share."""
    from openstarry.protocol import json_schema

    schema = json_schema()
    payloads: dict[str, JSON] = schema["x-payloads"]
    tables = SchemaTables(schema, {})
    payload_defs = {tables.ref_name(node) for node in payloads.values()}
    shared = [
        name
        for name, node in schema["$defs"].items()
        if name not in payload_defs and name != "EventEnvelope" and "properties" in node
    ]
    tables.anchors = {name: _anchor(name) for name in shared}
    tables.anchors |= {
        tables.ref_name(node) or "": _anchor(event_type) for event_type, node in payloads.items()
    }
    envelope = schema["$defs"]["EventEnvelope"]
    out = [
        "## The envelope {#envelope}",
        "",
        *tables.table(envelope),
        "",
        tables.closing_note(envelope),
        "",
        "## The event types",
        "",
    ]
    for event_type, node in payloads.items():
        payload = tables.resolve(node)
        out += [f"### `{event_type}` {{#{_anchor(event_type)}}}", ""]
        if payload.get("description"):
            out += [markdown_of(payload["description"]), ""]
        out += [*tables.table(payload), "", tables.closing_note(payload), ""]
    out += ["## Shapes the payloads share", ""]
    for name in shared:
        node = schema["$defs"][name]
        out += [f"### {name} {{#{_anchor(name)}}}", ""]
        if node.get("description"):
            out += [markdown_of(node["description"]), ""]
        out += [*tables.table(node), "", tables.closing_note(node), ""]
    return "\n".join(out)


# --- the command line ---------------------------------------------------------------------------


def _invocation(action: argparse.Action) -> str:
    """How an argument is written: ``--port PORT``, ``-i TEXT, --input TEXT``, ``manifest``."""
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        metavar = action.metavar or "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        metavar = action.metavar or action.dest.upper()
    if not action.option_strings:
        return str(metavar if action.choices is not None else action.metavar or action.dest)
    takes_value = action.nargs != 0
    names = sorted(action.option_strings, key=len)
    return ", ".join(f"{name} {metavar}" if takes_value else name for name in names)


def _default(action: argparse.Action) -> str:
    default = action.default
    if default in (None, False, argparse.SUPPRESS) or action.nargs == 0:
        return ""
    if isinstance(default, list | tuple):
        default = ",".join(str(item) for item in default)
    return f"`{default}`"


def _command_sections(
    parser: argparse.ArgumentParser, name: str, help_text: str | None, level: int
) -> Iterator[str]:
    yield f"{'#' * level} `{name}` {{#{_anchor(name)}}}"
    yield ""
    about = parser.description or help_text
    if about:
        yield about.strip()
        yield ""
    # "usage: " goes, and the indent argparse gave the wrapped lines under it with it.
    first, *rest = parser.format_usage().strip().removeprefix("usage: ").split("\n")
    yield "```text"
    yield first
    yield from (line.removeprefix(" " * len("usage: ")) for line in rest)
    yield "```"
    yield ""
    rows = []
    subcommands: list[tuple[str, argparse.ArgumentParser, str | None]] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for sub_name, sub_parser in action.choices.items():
                subcommands.append((sub_name, sub_parser, helps.get(sub_name)))
            continue
        help_text_ = (action.help or "").replace("%(default)s", str(action.default))
        if action.help == argparse.SUPPRESS:
            continue
        row = f"| `{_invocation(action)}` | {_cell(help_text_)} | {_default(action)} |"
        rows.append(row)
    if rows:
        yield "| argument | what it does | default |"
        yield "| --- | --- | --- |"
        yield from rows
        yield ""
    if subcommands:
        yield "| command | what it does |"
        yield "| --- | --- |"
        for sub_name, _, sub_help in subcommands:
            full = f"{name} {sub_name}"
            yield f"| [`{full}`](#{_anchor(full)}) | {_cell(sub_help or '')} |"
        yield ""
    for sub_name, sub_parser, sub_help in subcommands:
        yield from _command_sections(sub_parser, f"{name} {sub_name}", sub_help, level + 1)


def cli_reference() -> str:
    """Every command of ``openstarry`` with its usage and arguments, from ``build_parser()``."""
    from openstarry.cli import build_parser

    # argparse wraps usage lines to the terminal's width: fix it, so the page is the same anywhere.
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        parser = build_parser()
        return "\n".join(_command_sections(parser, "openstarry", parser.description, 2))
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


# --- the layers ---------------------------------------------------------------------------------


def layers_reference() -> str:
    """The import-linter layers contract of ``pyproject.toml``, top layer first, as a table."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # requirements-dev.txt brings tomli there
        import tomli as tomllib  # type: ignore[import-not-found]

    config = tomllib.loads((_HERE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c.get("type") == "layers")["layers"]
    rows = ["| layer | modules | siblings |", "| ---: | --- | --- |"]
    for number, layer in enumerate(layers, 1):
        independent = "|" in layer
        modules = [m.strip() for m in re.split(r"[|:]", layer)]
        siblings = "may not import each other" if independent else "may import each other"
        if len(modules) == 1:
            siblings = ""
        rows.append(f"| {number} | {', '.join(f'`{m}`' for m in modules)} | {siblings} |")
    return "\n".join(rows)


GENERATORS: dict[str, Callable[[], str]] = {
    "agent-json": agent_json_reference,
    "events": events_reference,
    "cli": cli_reference,
    "layers": layers_reference,
}


def expand(markdown: str, where: str = "a page") -> str:
    """``markdown`` with every ``<!-- generated: NAME -->`` marker replaced by its part."""

    def replace(match: re.Match[str]) -> str:
        generator = GENERATORS.get(match.group("name"))
        if generator is None:
            known = ", ".join(sorted(GENERATORS))
            raise ValueError(f"{where}: unknown generated part {match.group(0)!r} (known: {known})")
        return generator()

    return MARKER.sub(replace, markdown)


def title_outputs(markdown: str) -> str:
    """Each expected output's block titled "Output" (pymdownx.highlight's ``title``)."""
    return EXPECTED_OUTPUT.sub(
        lambda match: f'{match["indent"]}{match["fence"]}text title="Output"', markdown
    )


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """MkDocs hook: expand the markers of each page, and title its outputs."""
    return title_outputs(expand(markdown, page.file.src_path))


# --- code that names a documented object, on any page --------------------------------------------

#: A dotted name, written alone in inline code (a call's ``()`` may follow).
_PYTHON_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
#: A plain ``<code>`` (no attributes, nothing nested), or any other tag.
_CODE_OR_TAG = re.compile(
    r"<code>(?P<code>[^<]*)</code>|<(?P<end>/?)(?P<tag>[A-Za-z][A-Za-z0-9-]*)\b[^>]*?(?P<void>/?)>"
)
#: Where code is no reference to link: a link already, a block, a heading, an unresolved one.
_NO_LINKS_IN = frozenset({"a", "autoref", "pre", "h1", "h2", "h3", "h4", "h5", "h6", "span"})


class DocumentedNames:
    """The objects the reference documents (``openstarry.*`` identifiers), looked up by code.

    ``urls`` maps the identifiers of mkdocs-autorefs to where each is documented:
    an object's path where the reference documents it (``primary``), and the others
    it goes by (the module that defines it, those that import it). The package's
    own re-exports (``openstarry.tool``) are left out unless documented there:
    written alone they are as likely a span's or a logger's name.
    """

    def __init__(
        self, urls: Mapping[str, str], primary: Iterable[str], package: str = "openstarry"
    ) -> None:
        primary = set(primary)
        #: A documented object's full path -> where it is documented.
        self.full: dict[str, str] = {}
        #: A class's member (``Agent.ask``) -> the names that end so, by where each is documented.
        self.tails: dict[str, dict[str, str]] = {}
        for name, url in urls.items():
            parts = name.split(".")
            if parts[0] != package or len(parts) < 2 or not _PYTHON_PATH.fullmatch(name):
                continue
            if len(parts) > 2 or name in primary:
                self.full[name] = url
            for start in range(1, len(parts) - 1):
                if parts[start][:1].isupper():
                    tail = ".".join(parts[start:])
                    known = self.tails.setdefault(tail, {})
                    if url not in known or name in primary:
                        known[url] = name

    def identifier(self, text: str) -> str | None:
        """What the inline code ``text`` names, if one documented object (else ``None``)."""
        name = text.removesuffix("()")
        if "." not in name or not _PYTHON_PATH.fullmatch(name):
            return None
        if name in self.full:
            return name
        found = self.tails.get(name, {})
        # A tail that two documented objects end with names neither.
        return next(iter(found.values())) if len(found) == 1 else None


def link_code(html: str, names: DocumentedNames) -> str:
    """``html`` with each inline code that names a documented object made a reference to it."""
    out: list[str] = []
    inside: dict[str, int] = {}
    position = 0
    for match in _CODE_OR_TAG.finditer(html):
        tag = (match.group("tag") or "").lower()
        if tag:
            if tag in _NO_LINKS_IN and not match.group("void"):
                change = -1 if match.group("end") else 1
                inside[tag] = max(0, inside.get(tag, 0) + change)
            continue
        if any(inside.values()):
            continue
        identifier = names.identifier(match.group("code"))
        if identifier is None:
            continue
        out.append(html[position : match.start()])
        out.append(f'<autoref identifier="{identifier}" optional>{match.group(0)}</autoref>')
        position = match.end()
    out.append(html[position:])
    return "".join(out)


# --- the specification's sections, cited by the docstrings ---------------------------------------

#: ``spec 000 section 5`` and the like, as docstrings cite the specification openstarry follows.
_SPEC = re.compile(r"spec (?P<number>00[0-4])(?: section (?P<section>\d+)[A-Z]?(?:\.\d+)*)?")
#: The protocol page that says, in openstarry's words, what each part of the specification fixes.
_SPEC_PAGES = {
    "000": "protocol/providers/",
    "001": "protocol/envelope/",
    "002": "protocol/envelope/",
    "003": "protocol/agent-api/",
    "004": "protocol/mcp/",
}
#: Sections of spec 000 and 002 that another page covers.
_SPEC_SECTIONS = {
    ("000", "1"): "protocol/",
    ("000", "5"): "protocol/loop/",
    ("000", "6"): "protocol/providers/#many-tools",
    ("002", "3"): "protocol/events/",
}


def link_spec(html: str, page_url: str) -> str:
    """``html`` with each citation of the specification made a link to its protocol page.

    The specification itself is not part of the site: its sections are told in
    the protocol pages, and a docstring's ``spec 000 section 5`` leads there.
    Citations inside code, links and headings are left as they are.
    """
    from mkdocs.utils import get_relative_url

    out: list[str] = []
    position = 0
    for match in _TEXT.finditer(html):
        text = match.group("text")
        if text is None or match.group("inside"):
            continue
        start = match.start("text")
        linked = _SPEC.sub(
            lambda cite: (
                f'<a href="{get_relative_url(_spec_page(cite), page_url)}">{cite.group(0)}</a>'
            ),
            text,
        )
        if linked != text:
            out.append(html[position:start])
            out.append(linked)
            position = match.end("text")
    out.append(html[position:])
    return "".join(out)


def _spec_page(cite: re.Match[str]) -> str:
    number, section = cite.group("number"), cite.group("section")
    return _SPEC_SECTIONS.get((number, section or ""), _SPEC_PAGES[number])


#: Text between tags; a tag alone, and what sits inside code, a link or a heading, are left alone.
_TEXT = re.compile(
    r"(?P<inside><(?P<tag>code|a|pre|h[1-6]|autoref)\b[^>]*>.*?</(?P=tag)>)|<[^>]*>|(?P<text>[^<]+)",
    re.DOTALL,
)


@event_priority(-40)  # After mkdocstrings (its anchors registered), before autorefs resolves.
def on_env(env: Any, *, config: Any, files: Any, **kwargs: Any) -> Any:
    """MkDocs hook: link the inline code of every page that names a documented object, and
    each citation of the specification to its protocol page."""
    autorefs = config.plugins.get("autorefs")
    primary: dict[str, list[str]] = getattr(autorefs, "_primary_url_map", {})
    secondary: dict[str, list[str]] = getattr(autorefs, "_secondary_url_map", {})
    urls = {name: found[0] for name, found in {**secondary, **primary}.items() if found}
    names = DocumentedNames(urls, primary)
    for file in files:
        page = file.page
        if page is not None and page.content:
            page.content = link_spec(link_code(page.content, names), page.url)
    return env
