"""ToolIndex against a pure-Python BM25F index with the same terms and scores.

Both pick the top 10 of the 1,000 generated tools of ``tests/test_retrieval.py``
for each of its 70 requests, and both build their index from those tools. The
baseline is what a careful Python programmer would write: a regex tokenizer
(ASCII camelCase rules, which is all the corpus needs), an inverted index of
precomputed BM25F weights in dicts, ``bisect`` for prefix matches,
``heapq.nsmallest`` for the top 10. Each benchmark first checks, untimed, that
the baseline makes the same terms and the same rankings as the Rust index.
"""

from __future__ import annotations

import heapq
import math
import re
import sys
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest

from benches.harness import Benchmark, measure
from openstarry.agent.retrieval import tool_document
from openstarry.core import ToolIndex

# The tools and requests of the recall test, imported as pytest imports that
# module (``tests/`` has no ``__init__.py``), whether or not tests/ is collected.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_retrieval import AMBIGUOUS, QUERIES, generated_tools

LIMIT = 10
SEARCH_GROUP = "retrieval: top 10 of 1,000 tools (per request)"
BUILD_GROUP = "retrieval: index 1,000 tools (per tool)"

# --- the baseline: the Rust index's rules, in Python -------------------------------------------

K1 = 1.2
NAME_WEIGHT, TEXT_WEIGHT = 3.0, 1.0
NAME_B, TEXT_B = 0.5, 0.75
PREFIX_WEIGHT = 0.5
MIN_PREFIX_CHARS = 3
MAX_PREFIX_EXPANSIONS = 64
STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "can",
        "could",
        "do",
        "for",
        "from",
        "i",
        "in",
        "is",
        "it",
        "its",
        "me",
        "my",
        "of",
        "on",
        "or",
        "our",
        "please",
        "that",
        "the",
        "this",
        "to",
        "we",
        "will",
        "with",
        "would",
        "you",
        "your",
    ]
)
ACTION_SYNONYMS = {
    "add": "creat",
    "chang": "updat",
    "destroy": "delet",
    "download": "export",
    "edit": "updat",
    "eras": "delet",
    "fetch": "get",
    "find": "search",
    "generat": "creat",
    "insert": "creat",
    "lookup": "search",
    "mak": "creat",
    "modify": "updat",
    "purg": "delet",
    "remov": "delet",
    "retriev": "get",
}
_UNSPACED = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff"
_RUNS = re.compile(f"([{_UNSPACED}]+)|([^\\W_{_UNSPACED}]+)")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z][A-Z])(?=[A-Z][a-z])(?![A-Z]s(?![a-z]))")
_ACRONYM_PLURAL = re.compile(r"[A-Z]{2,}s")
_VOWELS = frozenset("aeiouy")


def _verb_suffix(w: str) -> str | None:
    if w.endswith("ing"):
        cut = 3
    elif w.endswith("ied") and len(w) > 4:
        return w[:-3] + "y"
    elif w.endswith("ed") and not w.endswith("eed"):
        cut = 2
    else:
        return None
    rest = w[:-cut]
    if len(rest) < 3 or not any(c in _VOWELS for c in rest):
        return None
    if len(rest) > 3 and rest[-1] == rest[-2] and rest[-1] not in _VOWELS and rest[-1] not in "lsz":
        rest = rest[:-1]
    return rest


def stem(w: str) -> str:
    if not w.isascii() or len(w) <= 3:
        return w
    if w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith(("sses", "shes", "ches", "xes")):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")) and len(w) > 3:
        w = w[:-1]
    verb = _verb_suffix(w)
    if verb is not None:
        return verb
    return w[:-1] if len(w) > 3 and w.endswith("e") else w


def tokenize(text: str) -> list[str]:
    out: list[str] = []
    for unspaced, word in _RUNS.findall(text):
        if unspaced:
            pairs = [unspaced[i : i + 2] for i in range(len(unspaced) - 1)]
            out += pairs or [unspaced]
            continue
        for part in _CAMEL.split(word):
            if _ACRONYM_PLURAL.fullmatch(part):
                part = part[:-1]
            lower = part.lower()
            if lower and lower not in STOP_WORDS:
                term = stem(lower)
                out.append(term)
                action = ACTION_SYNONYMS.get(term)
                if action is not None:
                    out.append(action)
    return out


class PyBM25F:
    """The scoring of ``ToolIndex`` over dicts: ``term -> [(doc, weight), ...]``."""

    def __init__(self, documents: Iterable[tuple[str, str]]) -> None:
        self.names: list[str] = []
        counted: list[tuple[Counter[str], Counter[str], int, int]] = []
        for name, text in documents:
            self.names.append(name)
            n, t = tokenize(name), tokenize(text)
            counted.append((Counter(n), Counter(t), len(n), len(t)))
        count = max(1, len(counted))
        avg_name = max(1.0, sum(c[2] for c in counted) / count)
        avg_text = max(1.0, sum(c[3] for c in counted) / count)
        tfs: dict[str, list[tuple[int, float]]] = {}
        for doc, (in_name, in_text, name_len, text_len) in enumerate(counted):
            name_norm = 1.0 - NAME_B + NAME_B * name_len / avg_name
            text_norm = 1.0 - TEXT_B + TEXT_B * text_len / avg_text
            for term in sorted(in_name.keys() | in_text.keys()):
                tf = (
                    NAME_WEIGHT * in_name[term] / name_norm
                    + TEXT_WEIGHT * in_text[term] / text_norm
                )
                tfs.setdefault(term, []).append((doc, tf))
        total = len(counted)
        self.postings: dict[str, list[tuple[int, float]]] = {}
        for term, entries in tfs.items():
            df = len(entries)
            idf = math.log(1.0 + (total - df + 0.5) / (df + 0.5))
            self.postings[term] = [(doc, idf * tf / (K1 + tf)) for doc, tf in entries]
        self.terms = sorted(self.postings)

    def _expansions(self, term: str) -> list[str]:
        if len(term) < MIN_PREFIX_CHARS:
            return []
        terms = self.terms
        out: list[str] = []
        i = bisect_right(terms, term)
        while i < len(terms) and len(out) < MAX_PREFIX_EXPANSIONS and terms[i].startswith(term):
            out.append(terms[i])
            i += 1
        return out

    def search(self, query: str, limit: int) -> list[tuple[str, float]]:
        scores: dict[int, float] = {}
        postings = self.postings
        for term in sorted(set(tokenize(query))):
            exact = postings.get(term)
            expansions = self._expansions(term)
            if not expansions:
                for doc, w in exact or ():
                    scores[doc] = scores.get(doc, 0.0) + w
                continue
            best: dict[int, float] = {}
            matches = [(exact, 1.0)] if exact else []
            matches += [(postings[t], PREFIX_WEIGHT) for t in expansions]
            for entries, factor in matches:
                for doc, w in entries:
                    v = w * factor
                    if v > best.get(doc, 0.0):
                        best[doc] = v
            for doc, v in best.items():
                scores[doc] = scores.get(doc, 0.0) + v
        names = self.names
        top = heapq.nsmallest(limit, scores.items(), key=lambda kv: (-kv[1], names[kv[0]]))
        return [(names[doc], score) for doc, score in top]


# --- the benchmarks ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def documents() -> list[tuple[str, str]]:
    return [(name, tool_document(tool)) for name, tool in generated_tools().items()]


@pytest.fixture(scope="module")
def queries() -> list[str]:
    return [q for q, _ in QUERIES + AMBIGUOUS]


def _search_all(search: object, queries: list[str]) -> int:
    found = 0
    for query in queries:
        found += len(search(query, LIMIT))  # type: ignore[operator]
    return found


def test_the_baseline_matches_the_index(
    documents: list[tuple[str, str]], queries: list[str]
) -> None:
    for name, text in documents:
        assert tokenize(name) == ToolIndex.tokenize(name)
        assert tokenize(text) == ToolIndex.tokenize(text)
    for query in queries:
        assert tokenize(query) == ToolIndex.tokenize(query)
    rust, python = ToolIndex(documents), PyBM25F(documents)
    assert len(python.terms) == rust.term_count
    for query in queries:
        ours, theirs = rust.search(query, LIMIT), python.search(query, LIMIT)
        assert [n for n, _ in ours] == [n for n, _ in theirs], query
        assert [s for _, s in ours] == pytest.approx([s for _, s in theirs], rel=1e-12)


def test_search_openstarry(
    benchmark: Benchmark, documents: list[tuple[str, str]], queries: list[str]
) -> None:
    index = ToolIndex(documents)
    measure(
        benchmark,
        _search_all,
        group=SEARCH_GROUP,
        label="ToolIndex.search(query, 10)",
        ops=len(queries),
        rounds=200,
        role="openstarry",
        setup=lambda: ((index.search, queries), {}),
    )


def test_search_python(
    benchmark: Benchmark, documents: list[tuple[str, str]], queries: list[str]
) -> None:
    index = PyBM25F(documents)
    measure(
        benchmark,
        _search_all,
        group=SEARCH_GROUP,
        label="BM25F in Python: dict postings, bisect, heapq",
        ops=len(queries),
        rounds=50,
        target=5.0,
        setup=lambda: ((index.search, queries), {}),
    )


def test_build_openstarry(benchmark: Benchmark, documents: list[tuple[str, str]]) -> None:
    measure(
        benchmark,
        ToolIndex,
        group=BUILD_GROUP,
        label="ToolIndex(documents)",
        ops=len(documents),
        rounds=50,
        role="openstarry",
        setup=lambda: ((documents,), {}),
    )


def test_build_python(benchmark: Benchmark, documents: list[tuple[str, str]]) -> None:
    measure(
        benchmark,
        PyBM25F,
        group=BUILD_GROUP,
        label="BM25F in Python",
        ops=len(documents),
        rounds=10,
        setup=lambda: ((documents,), {}),
    )
