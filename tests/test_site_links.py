"""tests/check_site_links.py finds the references of the built site that are not links.

Small HTML pages stand for the site: no site is built here (``make test`` builds it
and runs the crawl over it). The build-time linking it checks is tested here too:
docs/griffe_rest.py's resolution of a docstring's names, docs/hooks.py's of a page's.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from check_site_links import (
    Code,
    Documented,
    Entry,
    check_site,
    main,
    parameters_of,
    parse_page,
    read_inventory,
    should_link,
)
from docs_support import load_docs_module

#: The reference's documentation of a class and a method, as mkdocstrings renders it.
REFERENCE = """
<h1 id="openstarryagent"><code>openstarry.agent</code></h1>
<div class="doc doc-object doc-module">
<a id="openstarry.agent"></a>
<div class="doc doc-object doc-class">
<h2 id="openstarry.agent.Agent" class="doc doc-heading"><code>Agent</code></h2>
<div class="doc-signature highlight"><pre><code>Agent(provider: Provider, *, bus: EventBus = None)
</code></pre></div>
<div class="doc doc-contents">
<p>{body}</p>
<table><tbody><tr class="doc-section-item">
<td><code>provider</code></td><td><code>Provider</code></td><td>The brain.</td>
</tr></tbody></table>
<div class="doc doc-object doc-function">
<h3 id="openstarry.agent.Agent.ask" class="doc doc-heading"><code>ask</code></h3>
<div class="doc doc-contents"><p>Ask.</p></div>
</div>
</div>
</div>
<div class="doc doc-object doc-attribute">
<h2 id="openstarry.agent.Agent.bus" class="doc doc-heading"><code>bus</code></h2>
</div>
<div class="doc doc-object doc-class">
<h2 id="openstarry.agent.Tool" class="doc doc-heading"><code>Tool</code></h2>
</div>
</div>
"""


def codes_to_link(html: str, documented: Documented | None = None) -> list[str]:
    """The texts of the codes of ``html`` that the crawl reports as not links."""
    page = parse_page(html)
    documented = documented or Documented(page.ids)
    found = []
    for code in page.codes:
        if code.context is not None and code.text in page.parameters.get(code.context, ()):
            continue
        if should_link(code, documented) is not None:
            found.append(code.text)
    return found


def test_a_documented_name_in_code_that_is_no_link_is_found() -> None:
    body = (
        "Runs <code>openstarry.agent.Tool</code>, <code>Agent.ask</code>, <code>ask()</code>"
        " and <code>Tool</code>; not <code>ask</code>, a word alone."
    )
    assert codes_to_link(REFERENCE.format(body=body)) == [
        "openstarry.agent.Tool",
        "Agent.ask",
        "ask()",
        "Tool",
    ]


def test_links_blocks_headings_and_other_names_are_not_reported() -> None:
    body = (
        '<a href="#openstarry.agent.Tool"><code>Tool</code></a>, '
        '<code><a href="#openstarry.agent.Tool">Tool</a></code>, '
        "<code>asyncio.Queue</code>, <code>agent.ask</code>, <code>x = 1</code>"
    )
    html = REFERENCE.format(body=body) + "<pre><code>openstarry.agent.Tool</code></pre>"
    # The headings' codes (Agent, ask), the signature, the parameter's name: no references.
    assert codes_to_link(html) == []


def test_a_parameter_named_like_an_attribute_is_no_reference() -> None:
    """``bus`` in the class's documentation is its parameter (the signature has it)."""
    body = "Runs on <code>bus</code>, with <code>provider</code>."
    assert codes_to_link(REFERENCE.format(body=body)) == []
    assert parameters_of("Agent(provider: Provider, *, bus: EventBus | None = None)") == {
        "provider",
        "bus",
    }
    assert parameters_of("f(a, *args, b: dict[str, int] = {}, **kw) -> tuple[int, str]") == {
        "a",
        "args",
        "b",
        "kw",
    }
    assert parameters_of("f(a: Weird<type>, b=1)") == {"a", "b"}


def test_outside_the_reference_only_dotted_names_count() -> None:
    documented = Documented(parse_page(REFERENCE.format(body="")).ids)
    guide = (
        "<p><code>Agent</code>, <code>openstarry</code>, <code>Agent.ask()</code>,"
        " <code>openstarry.agent.Agent</code></p>"
    )
    assert codes_to_link(guide, documented) == ["Agent.ask()", "openstarry.agent.Agent"]


def test_a_name_that_ends_two_documented_names_is_no_reference() -> None:
    documented = Documented(["openstarry.a.Event.child", "openstarry.b.Event.child"])
    assert should_link(Code("Event.child"), documented) is None
    assert should_link(Code("a.Event.child"), documented) is None  # a module's name: too loose
    assert should_link(Code("openstarry.a.Event.child"), documented) == "openstarry.a.Event.child"


def test_an_unresolved_reference_is_reported_only_when_its_target_is_documented() -> None:
    documented = Documented(["openstarry.agent.Tool"])
    missing = Code("Tool", span_title="openstarry.agent.Tool")
    private = Code("_helper", span_title="openstarry.agent._helper")
    parameter = Code("tools", span_title="openstarry.agent.Agent(tools)")
    assert should_link(missing, documented) == "openstarry.agent.Tool"
    assert should_link(private, documented) is None
    assert should_link(parameter, documented) is None


def test_the_inventory_gives_every_name_of_an_object() -> None:
    lines = [
        "openstarry.agent.Agent py:class 1 reference/api/agent/#$ -",
        "openstarry.agent.runtime.Agent py:class 1 reference/api/agent/#openstarry.agent.Agent -",
        "openstarry.agent py:module 1 reference/api/agent/#$ -",
        "some-page std:doc -1 page/ Some page",
    ]
    header = b"# Sphinx inventory version 2\n# Project: x\n# Version: 0\n# zlib\n"
    inventory = read_inventory(header + zlib.compress("\n".join(lines).encode()))
    assert inventory == {
        "openstarry.agent.Agent": Entry("class", "openstarry.agent.Agent"),
        "openstarry.agent.runtime.Agent": Entry("class", "openstarry.agent.Agent"),
        "openstarry.agent": Entry("module", "openstarry.agent"),
    }
    documented = Documented([], inventory)
    # Agent is documented under the module that defines it too.
    assert documented.names_of("openstarry.agent.Agent") == {
        "openstarry.agent.Agent",
        "openstarry.agent.runtime.Agent",
    }
    with pytest.raises(ValueError, match="not a Sphinx inventory"):
        read_inventory(b"nothing")


def site(tmp_path: Path, pages: dict[str, str]) -> Path:
    for name, html in pages.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"<html><body>{html}</body></html>", encoding="utf-8")
    return tmp_path


def test_the_crawl_reports_dead_links_and_unlinked_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = site(
        tmp_path,
        {
            "index.html": (
                '<a href="guide/">guide</a> <a href="guide/#there">there</a>'
                ' <a href="reference/#openstarry.agent.Agent"><code>Agent</code></a>'
                ' <a href="https://example.com/x">out</a> <a href="#">top</a>'
                ' <a href="gone/">gone</a> <a href="guide/#nowhere">nowhere</a>'
            ),
            "guide/index.html": '<h2 id="there">There</h2><code>Agent.ask</code>',
            "reference/index.html": REFERENCE.format(body=""),
        },
    )
    findings, linked = check_site(root)
    assert findings == [
        "guide/index.html: `Agent.ask` is not a link (to openstarry.agent.Agent.ask)",
        "index.html: link 'gone/' leads to no file",
        "index.html: link 'guide/#nowhere' leads to no anchor",
    ]
    assert linked == 1
    assert main([str(root)]) == 1
    assert "3 problem(s)" in capsys.readouterr().err


def test_a_clean_site_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = site(
        tmp_path,
        {
            "index.html": '<a href="reference/#openstarry.agent.Agent.ask"><code>ask</code></a>',
            "reference/index.html": REFERENCE.format(body=""),
        },
    )
    assert main([str(root)]) == 0
    assert "1 code references link" in capsys.readouterr().out
    assert main([str(tmp_path / "nothing")]) == 2


# --- the linking it checks ----------------------------------------------------------------------


load = load_docs_module


def test_a_page_links_the_code_that_names_a_documented_object() -> None:
    hooks = load("hooks")
    urls = {
        "openstarry.agent.Agent": "a/#openstarry.agent.Agent",
        "openstarry.agent.runtime.Agent": "a/#openstarry.agent.Agent",
        "openstarry.agent.Agent.ask": "a/#openstarry.agent.Agent.ask",
        "openstarry.agent.runtime.Agent.ask": "a/#openstarry.agent.Agent.ask",
        "openstarry.tool": "a/#openstarry.agent.tool",
    }
    names = hooks.DocumentedNames(urls, primary=["openstarry.agent.Agent"])
    html = (
        "<p><code>Agent.ask()</code> <code>openstarry.agent.Agent</code>"
        " <code>openstarry.tool</code> <code>Agent</code></p>"
        '<pre><code>Agent.ask</code></pre><a href="x"><code>Agent.ask</code></a>'
        "<h2><code>Agent.ask</code></h2>"
    )
    linked = hooks.link_code(html, names)
    assert linked.count("<autoref") == 2
    ask = '<autoref identifier="openstarry.agent.Agent.ask" optional><code>Agent.ask()</code>'
    assert ask in linked
    assert '<autoref identifier="openstarry.agent.Agent" optional>' in linked
    # A span's name (openstarry.tool), a single name, a block, a link, a heading: left as they are.
    assert "<code>openstarry.tool</code> <code>Agent</code>" in linked


def test_a_citation_of_the_specification_links_to_its_protocol_page() -> None:
    hooks = load("hooks")
    html = (
        '<p>The loop of spec 000 section 5; spec 002 section 3.2 (<span title="spec 004">'
        'spec 004</span>); <code>spec 003</code>, <a href="x">spec 003</a></p><h2>spec 000</h2>'
    )
    linked = hooks.link_spec(html, "reference/api/agent/")
    assert '<a href="../../../protocol/loop/">spec 000 section 5</a>' in linked
    assert '<a href="../../../protocol/events/">spec 002 section 3.2</a>' in linked
    assert '<span title="spec 004"><a href="../../../protocol/mcp/">spec 004</a>' in linked
    # Code, a link, a heading and a tag's attribute: left as they are.
    assert '<code>spec 003</code>, <a href="x">spec 003</a></p><h2>spec 000</h2>' in linked


def test_a_docstrings_roles_and_literals_link_when_they_resolve() -> None:
    markdown_of = load("griffe_rest").markdown_of

    def resolve(target: str, literal: bool) -> str | None:
        return {"EventBus": "openstarry.bus.EventBus", "Agent.ask": "openstarry.a.Agent.ask"}.get(
            target.rpartition("openstarry.bus.")[2] or target
        )

    text = ":class:`~openstarry.bus.EventBus`, :meth:`Agent.ask`, ``Agent.ask()``, :func:`len`."
    assert markdown_of(text, resolve) == (
        '<autoref identifier="openstarry.bus.EventBus" optional><code>EventBus</code></autoref>, '
        '<autoref identifier="openstarry.a.Agent.ask" optional><code>Agent.ask</code></autoref>, '
        '<autoref identifier="openstarry.a.Agent.ask" optional><code>Agent.ask()</code></autoref>, '
        "`len`."
    )
    # Without a resolver, a role is code and a literal stays as written.
    assert markdown_of(text) == "`EventBus`, `Agent.ask`, ``Agent.ask()``, `len`."
    # A lowercase word alone is left a literal (a status, a header), a class's name is not.
    asked: list[str] = []

    def record(target: str, literal: bool) -> str | None:
        asked.append(target)
        return None

    assert markdown_of("``created``, ``EventBus``, ``close()``", record) == (
        "``created``, ``EventBus``, ``close()``"
    )
    assert asked == ["EventBus", "close"]


def test_a_docstrings_names_resolve_as_sphinx_resolves_them(tmp_path: Path) -> None:
    griffe = pytest.importorskip("griffe")
    griffe_rest = load("griffe_rest")
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text('"""The package."""\nfrom pkg.sub.impl import Thing\n')
    (package / "sub" / "__init__.py").write_text('"""Sub."""\n')
    (package / "sub" / "impl.py").write_text(
        '"""Impl."""\n'
        "import asyncio\n\n"
        "class Thing:\n"
        '    """A thing."""\n\n'
        "    def run(self, other: int) -> None:\n"
        '        """Run."""\n\n'
        "    def stop(self) -> None:\n"
        '        """Stop."""\n\n'
        "    def _hidden(self) -> None: ...\n"
    )
    loaded = griffe.load("pkg", search_paths=[tmp_path])
    resolver = griffe_rest.Resolver(loaded)
    run = loaded["sub.impl.Thing.run"]
    assert resolver.identifier(run, "stop") == "pkg.sub.impl.Thing.stop"
    assert resolver.identifier(run, "Thing.stop") == "pkg.sub.impl.Thing.stop"
    assert resolver.identifier(run, "pkg.Thing") == "pkg.sub.impl.Thing"
    assert resolver.identifier(run, ".impl") == "pkg.sub.impl"
    assert resolver.identifier(run, "sub") == "pkg.sub"
    # Undocumented, standard library, the package itself: no link.
    assert resolver.identifier(run, "_hidden") is None
    assert resolver.identifier(run, "asyncio.Queue") is None
    assert resolver.identifier(run, "pkg") is None
    # A literal: a parameter and a module are not references; a method is.
    assert resolver.identifier(run, "other", literal=True) is None
    assert resolver.identifier(run, "sub", literal=True) is None
    assert resolver.identifier(run, "stop", literal=True) == "pkg.sub.impl.Thing.stop"
