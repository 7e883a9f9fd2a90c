"""Hardening of the tool retrieval layer, the schema cache, and the loop's doors that use them.

Each test is a defect found in review: it failed before its fix.
"""

from __future__ import annotations

import numbers
import threading
import time
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import anyio
import pytest

from agent_harness import HANG, Echo, running
from openstarry.agent.interfaces import AgentContext, Tool
from openstarry.agent.loop import ExecutionLoop
from openstarry.agent.registry import SchemaCache
from openstarry.agent.retrieval import EmbeddingRetriever, HybridRetriever, LexicalRetriever
from openstarry.bus import EventBus
from openstarry.core import Event, ToolIndex
from openstarry.testing import FunctionProvider, ScriptedProvider, text


class Spec(Tool):
    """A declaration only: retrieval never runs a tool."""

    def __init__(self, name: str, description: str = "") -> None:
        self.name = name
        self.description = description
        self.parameters = {"type": "object", "properties": {}}

    def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        raise AssertionError("retrieval must not run a tool")


WEATHER = Spec("get_weather", "Get the current weather forecast for a city.")
READ = Spec("fs.read", "Read a text file from the workspace.")
WRITE = Spec("fs.write", "Write a text file into the workspace.")
LIST = Spec("fs.list", "List a folder of the workspace.")
SMALL: dict[str, Tool] = {t.name: t for t in (WEATHER, READ, WRITE, LIST)}


# --- embeddings as embedding libraries return them ----------------------------------------------


class Float32:
    """A scalar like numpy's ``float32``: a ``numbers.Real``, but not a ``float``."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __float__(self) -> float:
        return self.value


numbers.Real.register(Float32)


class Array:
    """What numpy, torch and jax return: not a ``Sequence``; ``tolist()`` gives plain lists."""

    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[Any]:
        for row in self.rows:
            yield Array(row) if isinstance(row, list) else Float32(row)

    def __getitem__(self, i: int) -> Any:
        row = self.rows[i]
        return Array(row) if isinstance(row, list) else Float32(row)

    def tolist(self) -> list[Any]:
        return self.rows


def _bag_of_words(texts: list[str]) -> list[list[float]]:
    vocabulary = ["weather", "read", "write", "folder", "file", "city"]
    return [[float(word in t.lower()) + 0.01 for word in vocabulary] for t in texts]


@pytest.mark.parametrize(
    "shape",
    [
        pytest.param(lambda rows: Array(rows), id="matrix"),  # model.encode(texts)
        pytest.param(lambda rows: [Array(r) for r in rows], id="list-of-vectors"),
        pytest.param(lambda rows: [[Float32(x) for x in r] for r in rows], id="float32-scalars"),
    ],
)
def test_embeddings_may_be_arrays_as_embedding_libraries_return(shape: Any) -> None:
    retriever = EmbeddingRetriever(lambda texts: shape(_bag_of_words(texts)))
    assert retriever.select("the weather in my city", SMALL, 1) == ["get_weather"]
    assert retriever.select("open a folder", SMALL, 1) == ["fs.list"]


def test_arrays_are_still_checked() -> None:
    retriever = EmbeddingRetriever(lambda texts: Array([[1.0, 2.0]] * (len(texts) - 1)))
    with pytest.raises(ValueError, match="embed returned 3 vectors for 4 texts"):
        retriever.select("weather", SMALL, 1)
    nan = EmbeddingRetriever(lambda texts: [[Float32(float("nan"))] for _ in texts])
    with pytest.raises(ValueError, match="NaN or infinity"):
        nan.select("weather", SMALL, 1)


# --- the schema cache across event loops --------------------------------------------------------


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_creation_in_one_event_loop_does_not_hang_another(backend: str) -> None:
    """Two threads, each with its event loop, share one cache (say, one provider).

    The second asked while the first was creating: it waited on the first
    loop's signal, which cannot wake it (asyncio: stuck until something else
    woke its loop; trio: AttributeError).
    """
    cache: SchemaCache[str] = SchemaCache()
    key = ("api", "ts_same")
    creating = threading.Event()
    second_done = threading.Event()
    out: dict[str, Any] = {}

    def first() -> None:
        async def main() -> None:
            async def factory() -> str:
                creating.set()
                # Still creating while the other loop asks.
                second_done.wait(HANG)
                return "first"

            out["first"] = await cache.aget_or_create(key, factory)

        anyio.run(main, backend="asyncio")

    def second() -> None:
        async def main() -> None:
            async def factory() -> str:
                return "second"

            creating.wait(HANG)
            with anyio.move_on_after(2) as scope:
                out["second"] = await cache.aget_or_create(key, factory)
            out["hung"] = scope.cancelled_caught

        try:
            anyio.run(main, backend=backend)
        except BaseException as exc:  # reported below
            out["error"] = exc
        finally:
            second_done.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG * 2)
    assert "error" not in out, out
    # Not hung: the first factory waits for the second call to finish, so a second call that
    # waited for the first would have been cut off by its 2 s limit.
    assert out["hung"] is False
    # Whichever was stored first is what both get.
    assert out["first"] == out["second"] == "second"
    assert cache.keys() == [key]


# --- lexical retrieval across Unicode spellings -------------------------------------------------


def test_lexical_matches_across_unicode_spellings() -> None:
    tools: dict[str, Tool] = {
        t.name: t
        for t in (
            Spec("meteo.get", "Prévisions météo de la ville."),
            Spec("github.issue.create", "Open an issue on GitHub."),
            Spec("db.query", "データベースを検索する"),
            Spec("fs.read", "Read a file."),
        )
    }
    retriever = LexicalRetriever(fill=False)
    # An accent typed as a letter and a combining mark (NFD), as macOS produces.
    assert retriever.select(unicodedata.normalize("NFD", "météo"), tools, 2) == ["meteo.get"]
    # Full-width Latin letters, as typed with a CJK input method.
    full_width = "".join(chr(ord(c) + 0xFEE0) for c in "GitHub")
    assert retriever.select(full_width, tools, 2) == ["github.issue.create"]
    # Kana with a separate voicing mark.
    hits = retriever.search(unicodedata.normalize("NFD", "データベース"), tools, 2)
    nfc = retriever.search("データベース", tools, 2)
    assert hits == nfc
    assert [name for name, _ in hits] == ["db.query"]


def test_a_non_ascii_name_matches_in_its_normal_form() -> None:
    name = unicodedata.normalize("NFD", "météo")
    tools: dict[str, Tool] = {name: Spec(name, "Forecasts."), "other": Spec("other", "Nothing.")}
    assert LexicalRetriever(fill=False).select("météo", tools, 2) == [name]


# --- tool sets and limits -----------------------------------------------------------------------


def test_one_tool_under_two_keys() -> None:
    """Keys need not be the tools' names (aliases): two keys may hold one tool."""
    aliased: dict[str, Tool] = {"weather": WEATHER, "forecast": WEATHER, "cat": READ}
    lexical = LexicalRetriever(fill=False)
    assert set(lexical.select("weather forecast", aliased, 3)) == {"weather", "forecast"}
    embedding = EmbeddingRetriever(_bag_of_words)
    assert embedding.select("read the file", aliased, 1) == ["cat"]
    # A different aliasing is a different set.
    assert lexical.select("weather", {"w": WEATHER}, 1) == ["w"]
    assert lexical.builds == 2


def test_a_limit_beyond_any_tool_count() -> None:
    """A huge limit (``max_tools`` from a config, say) gave OverflowError or ValueError."""
    huge = 2**70
    assert LexicalRetriever().select("weather", SMALL, huge) == list(SMALL)
    assert LexicalRetriever(fill=False).search("weather", SMALL, huge) == (
        LexicalRetriever(fill=False).search("weather", SMALL, 4)
    )
    embedding = EmbeddingRetriever(_bag_of_words)
    assert embedding.select("", SMALL, huge) == list(SMALL)
    assert embedding.select("weather", SMALL, huge)[0] == "get_weather"
    hybrid = HybridRetriever(LexicalRetriever(fill=False), embedding)
    assert set(hybrid.select("weather", SMALL, huge)) == set(SMALL)


def test_a_blank_query_gives_the_declared_order_of_this_mapping() -> None:
    calls: list[int] = []

    def embed(texts: list[str]) -> list[list[float]]:
        calls.append(len(texts))
        return _bag_of_words(texts)

    retriever = EmbeddingRetriever(embed)
    retriever.select("weather", SMALL, 1)  # embeds this set, in this order
    reordered = dict(reversed(list(SMALL.items())))
    assert retriever.select("  ", reordered, 2) == ["fs.list", "fs.write"]
    assert calls == [4, 1]


def test_hybrid_depth_must_be_an_int() -> None:
    with pytest.raises(ValueError, match=r"depth must be at least 1, not 2\.5"):
        HybridRetriever(LexicalRetriever(), depth=2.5)  # type: ignore[arg-type]


# --- the loop's doors ------------------------------------------------------------------------


class SideEffect(Tool):
    """A tool with an effect in the world: counts its runs."""

    name = "side_effect"

    def __init__(self) -> None:
        self.runs = 0

    async def run(self, args: dict[str, Any], context: AgentContext) -> Any:
        self.runs += 1
        return "done"


@pytest.mark.anyio
async def test_a_call_tool_cancelled_before_it_starts_never_runs_the_tool() -> None:
    """An MCP client cancels its ``tools/call`` while the bus is busy: the tool must not run later.

    The caller forgot the call on its way out, so when the bus got to it the
    loop took it for a call published by someone else, and ran it.
    """
    tool = SideEffect()
    entered, hold = anyio.Event(), anyio.Event()

    async def busy(event: Event) -> None:
        if event.source == "bridge":  # holds the bus's dispatch up
            entered.set()
            await hold.wait()

    async with running(ScriptedProvider([]), [tool, Echo()]) as h:
        h.bus.subscribe("EXEC:TOOL_CALL", busy)
        first = {"toolCallId": "c0", "name": "echo", "args": {"x": 0}}
        h.bus.publish(Event.new("EXEC:TOOL_CALL", first, source="bridge", session_id="x"))
        with anyio.fail_after(HANG):
            await entered.wait()
            async with anyio.create_task_group() as tg:
                tg.start_soon(h.loop.call_tool, "side_effect", {})
                while not h.loop._external:  # published, not dispatched
                    await anyio.sleep(0.001)
                tg.cancel_scope.cancel()
            hold.set()
            await h.bus.wait_idle()
            again = await h.loop.call_tool("echo", {"x": 1})
            await h.bus.wait_idle()
        assert again.success
        assert tool.runs == 0
        (result,) = [r for r in h.of("EXEC:TOOL_RESULT") if r.payload["name"] == "side_effect"]
        assert result.payload["success"] is False
        assert result.payload["error"]["code"] == "CANCELLED"
        assert h.loop._external == {}  # nothing kept for the cancelled call


@pytest.mark.anyio
async def test_text_deltas_from_a_worker_thread(
    anyio_backend: str, request: pytest.FixtureRequest
) -> None:
    """A provider streaming through a sync SDK in a worker thread emits its deltas there.

    Publishing on the bus from that thread touched the event loop's signals
    from outside it: on trio the bus stopped dispatching (a hang); on asyncio
    it worked only because the thread's end woke the loop.
    """

    async def streaming(prompt: str, context: AgentContext) -> Any:
        def stream() -> None:
            for piece in ("Hel", "lo"):
                context.emit_text_delta(piece)

        await anyio.to_thread.run_sync(stream)
        return text("Hello")

    async with running(FunctionProvider(streaming), []) as h:
        with anyio.fail_after(HANG):
            result = await h.loop.ask("hi")
            await h.bus.wait_idle()
        assert result.text == "Hello"
        assert result.error is None
        deltas = [e.payload["text"] for e in h.of("OUTPUT:AGENT_MESSAGE_DELTA")]
        assert deltas == ["Hel", "lo"]


def _tools(n: int) -> list[Tool]:
    out: list[Tool] = []
    for i in range(n):
        tool = Echo()
        tool.name = f"t{i:02d}"
        out.append(tool)
    return out


@pytest.mark.anyio
async def test_a_slow_retriever_does_not_stall_the_event_loop() -> None:
    """An embedding retriever calls its model synchronously (a network call).

    Called on the event loop, it froze every session, the bus and the
    transports until the model answered.
    """
    entered, gate = threading.Event(), threading.Event()
    released: list[bool] = []

    class Slow:
        def select(self, query: str, tools: Mapping[str, Tool], limit: int) -> Sequence[str]:
            entered.set()
            # True only if the event loop went on meanwhile (HANG: generous, and the
            # wait ends as soon as the loop sets the gate).
            released.append(gate.wait(HANG))
            return list(tools)[:limit]

    provider = ScriptedProvider([text("a")])
    async with (
        running(provider, _tools(5), max_tools=2, retriever=Slow()) as h,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(h.ask, "hi")
        with anyio.fail_after(HANG):
            while not entered.is_set():
                await anyio.sleep(0.005)
        gate.set()
    assert released == [True]


@pytest.mark.parametrize("bad", [2.5, True, "3"])
def test_max_tools_must_be_an_int(bad: Any) -> None:
    """A float was accepted, then every input failed with INTERNAL_ERROR."""
    with pytest.raises((TypeError, ValueError), match="max_tools"):
        ExecutionLoop(EventBus(), ScriptedProvider([]), [], max_tools=bad)


def test_threads_selecting_at_once_embed_a_tool_set_once() -> None:
    """Sessions selecting from worker threads on a cold retriever each embedded every tool."""
    calls: list[int] = []
    first_batch = threading.Event()

    def embed(texts: list[str]) -> list[list[float]]:
        calls.append(len(texts))
        if len(texts) > 1:
            first_batch.set()
            time.sleep(0.05)  # a model takes a while: the other threads arrive meanwhile
        return _bag_of_words(texts)

    retriever = EmbeddingRetriever(embed)
    picks: list[list[str]] = []

    def work() -> None:
        picks.append(retriever.select("the weather", SMALL, 1))

    threads = [threading.Thread(target=work) for _ in range(4)]
    threads[0].start()
    first_batch.wait(HANG)
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(HANG)
    assert picks == [["get_weather"]] * 4
    assert sorted(calls) == [1, 1, 1, 1, 4]  # the tools once, each query once
    assert retriever.builds == 1


# --- terms --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "terms"),
    [
        ("listAPIs", ["list", "api"]),  # was ["list", "ap"]: "Is" became a stop word
        ("getURLsForTag", ["get", "url", "tag"]),  # was ["get", "ur", "ls", "tag"]
        ("SDKs GPUs IDs", ["sdk", "gpu", "id"]),
        ("HTTPServer HTTPSession", ["http", "server", "http", "session"]),
    ],
)
def test_an_acronyms_plural_is_one_word(text: str, terms: list[str]) -> None:
    assert ToolIndex.tokenize(text) == terms


def test_tools_named_with_acronym_plurals_are_found() -> None:
    tools: dict[str, Tool] = {
        t.name: t
        for t in (
            Spec("listAPIs", "Enumerate what the gateway serves."),
            Spec("getURLs", "Links of a page."),
            Spec("fs.read", "Read a file."),
        )
    }
    retriever = LexicalRetriever(fill=False)
    assert retriever.select("which API endpoints exist?", tools, 3) == ["listAPIs"]
    assert retriever.select("the URL of the docs", tools, 3) == ["getURLs"]
