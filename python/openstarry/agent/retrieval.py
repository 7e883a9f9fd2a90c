"""The tool retrieval layer (spec 000 section 6B).

When an agent has more tools than fit a provider's context, only the ``N`` most
relevant to the current input reach it. A :class:`ToolRetriever` picks them:

- :class:`LexicalRetriever` (the default) needs no model: it scores tool names
  and descriptions against the input with the Rust
  :class:`~openstarry.core.ToolIndex` (BM25F, a light stemmer, prefix matches),
  built once per tool set.
- :class:`EmbeddingRetriever` ranks by cosine similarity of embeddings from a
  function you supply (any embedding model), embedding each tool set once.
- :class:`HybridRetriever` fuses the rankings of several retrievers.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import numbers
import operator
import threading
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, SupportsFloat, runtime_checkable

from openstarry.agent.registry import FINGERPRINT_PREFIX, SchemaCache, tool_set_fingerprint
from openstarry.core import ToolIndex

if TYPE_CHECKING:
    from openstarry.agent.interfaces import Tool

__all__ = [
    "EmbedFunction",
    "EmbeddingRetriever",
    "HybridRetriever",
    "LexicalRetriever",
    "ToolRetriever",
    "tool_document",
]


@runtime_checkable
class ToolRetriever(Protocol):
    """Picks the tools most relevant to an input.

    ``select`` returns at most ``limit`` names of ``tools``, the most relevant
    first. It is called once per input, on the input's text, and may cache
    whatever it derives from ``tools`` (an index, embeddings) between calls.
    It may be called from several threads at once (the retrievers here are
    thread-safe).
    """

    def select(self, query: str, tools: Mapping[str, Tool], limit: int) -> Sequence[str]: ...


class _ArrayLike(Protocol):
    """An array of numpy, torch or jax: ``tolist()`` gives its values as lists."""

    def tolist(self) -> Any: ...


#: ``embed(texts)``: one vector per text, all of one length (lists, or an array).
EmbedFunction = Callable[
    [list[str]], Sequence[Sequence[SupportsFloat]] | Sequence[_ArrayLike] | _ArrayLike
]


def tool_document(tool: Tool, max_bytes: int = ToolIndex.MAX_TEXT_BYTES) -> str:
    """The text a tool is retrieved by, besides its name.

    Its description, then each top-level parameter's name and description, cut
    to ``max_bytes`` of UTF-8 (a very long description keeps its beginning).
    """
    parts = [tool.description or ""]
    properties = tool.parameters.get("properties")
    if isinstance(properties, Mapping):
        for name, schema in properties.items():
            parts.append(str(name))
            if isinstance(schema, Mapping) and isinstance(schema.get("description"), str):
                parts.append(schema["description"])
    return _cut("\n".join(parts), max_bytes)


def _cut(text: str, max_bytes: int) -> str:
    """``text`` as valid UTF-8 of at most ``max_bytes``, cut on a character boundary.

    A lone surrogate (text read with ``errors="surrogateescape"``) becomes ``?``.
    """
    if text.isascii() and len(text) <= max_bytes:
        return text
    return text.encode("utf-8", "replace")[:max_bytes].decode("utf-8", "ignore")


def _normalise(text: str, max_bytes: int) -> str:
    """``text`` in Unicode normal form NFKC, as valid UTF-8 of at most ``max_bytes``.

    Accented letters typed as a letter and a combining mark (``e`` + U+0301,
    as macOS and some keyboards produce), full-width Latin letters and digits
    (U+FF21 onwards, typed with a CJK input method) and kana with a separate
    voicing mark become the characters the index holds, so they match.
    """
    if text.isascii():
        return _cut(text, max_bytes)
    # Cut before (the work stays bounded) and after (NFKC may lengthen it).
    text = _cut(text, max_bytes)
    return _cut(unicodedata.normalize("NFKC", text), max_bytes)


def _check_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be an int of at least 0, not {limit!r}")


def _cache_key(kind: str, tools: Mapping[str, Tool]) -> tuple[str, str]:
    """The cache key of ``tools``: its fingerprint, when every key is its tool's name.

    Otherwise a digest of each key with its tool's own fingerprint, in order:
    one tool may then sit under two keys (aliases), which a fingerprint refuses.
    """
    if all(key == tool.name for key, tool in tools.items()):
        return (kind, tool_set_fingerprint(tools))
    digest = hashlib.sha256()
    for key, tool in tools.items():
        digest.update(key.encode("utf-8", "surrogatepass") + b"\0")
        digest.update(tool_set_fingerprint([tool]).encode("ascii") + b"\0")
    return (kind + ":keyed", FINGERPRINT_PREFIX + digest.hexdigest())


class _PerToolSet:
    """What a retriever derives from a tool set: the last set found by identity, others by content.

    The same mapping holding the same tool objects as on the previous call is
    recognised without hashing anything; any other set is looked up by its
    fingerprint, so a set seen before (in another mapping) is not rebuilt. A
    tool changed in place, rather than replaced, is not noticed: build a new
    tool instead. Threads asking for a set being built wait for that build
    rather than make their own (embedding a thousand tools once is enough).
    """

    def __init__(self, kind: str, build: Callable[[Mapping[str, Tool]], Any], max_sets: int):
        self._kind = kind
        self._build = build
        self._cache: SchemaCache[Any] = SchemaCache(max_sets)
        self._last: tuple[list[str], list[Tool], Any] | None = None
        self._lock = threading.Lock()
        self._building = threading.Lock()

    def get(self, tools: Mapping[str, Tool]) -> Any:
        # Two lists compared element by element, identity first: a few
        # microseconds for a thousand tools (tuples of items take four times as long).
        names, values = list(tools), list(tools.values())
        last = self._last
        if last is not None and last[0] == names and last[1] == values:
            return last[2]
        key = _cache_key(self._kind, tools)
        with self._building:
            value = self._cache.get_or_create(key, lambda: self._build(tools))
        with self._lock:
            self._last = (names, values, value)
        return value

    @property
    def builds(self) -> int:
        """How many tool sets were built (cache misses)."""
        return self._cache.misses


class LexicalRetriever:
    """Ranks tools by the words they share with the input: no model, no network.

    Each tool is indexed by its name (boosted) and :func:`tool_document`; the
    index is built once per tool set in Rust (:class:`~openstarry.core.ToolIndex`)
    and a selection among 1,000 tools takes about ten microseconds. Words match
    across plural, ``-ing`` and ``-ed`` forms and camelCase, snake_case or
    dotted names, and across Unicode spellings of one text (NFKC: a combining
    accent, full-width letters); a word of three letters or more also matches
    the longer words it begins; a few verbs count as the operation they name
    (``add`` as ``create``, ``remove`` as ``delete``). Other synonyms do not match: use an
    :class:`EmbeddingRetriever` (or both, in a :class:`HybridRetriever`).

    Args:
        fill: When fewer than ``limit`` tools share a word with the input (a
            reply such as "yes, go ahead"), fill up to ``limit`` with the others
            in their declared order, so the provider still sees ``limit`` tools.
            Without it the selection may be short, or empty.
        max_tool_sets: How many tool sets' indexes are kept.
    """

    def __init__(self, *, fill: bool = True, max_tool_sets: int = 8) -> None:
        self.fill = fill
        self._indexes = _PerToolSet("openstarry.lexical", self._build, max_tool_sets)

    @staticmethod
    def _build(tools: Mapping[str, Tool]) -> ToolIndex:
        limit = ToolIndex.MAX_TEXT_BYTES
        documents = []
        for name, tool in tools.items():
            text = _normalise(tool_document(tool, limit), limit)
            if not name.isascii() and (folded := _normalise(name, limit)) != name:
                # The index splits the name as given: its normal form goes with the text.
                text = _cut(f"{folded}\n{text}", limit)
            documents.append((name, text))
        return ToolIndex(documents)

    def index_for(self, tools: Mapping[str, Tool]) -> ToolIndex:
        """The index of ``tools``, built on first use and cached.

        Raises:
            ValueError: for more tools than ``ToolIndex.MAX_DOCUMENTS`` or a tool
                name over ``ToolIndex.MAX_NAME_BYTES``.
        """
        index: ToolIndex = self._indexes.get(tools)
        return index

    @property
    def builds(self) -> int:
        """How many indexes were built: one per new tool set."""
        return self._indexes.builds

    def search(self, query: str, tools: Mapping[str, Tool], limit: int) -> list[tuple[str, float]]:
        """Up to ``limit`` tools sharing words with ``query``, as ``(name, score)``, the best first.

        A query over ``ToolIndex.MAX_QUERY_BYTES`` is cut to its beginning.
        Queries and tool texts are compared in Unicode normal form NFKC.
        """
        _check_limit(limit)
        if not tools or limit == 0:
            return []
        query = _normalise(query, ToolIndex.MAX_QUERY_BYTES)
        return self.index_for(tools).search(query, min(limit, len(tools)))

    def select(self, query: str, tools: Mapping[str, Tool], limit: int) -> list[str]:
        """The names of the ``limit`` tools most relevant to ``query``, the best first."""
        _check_limit(limit)
        limit = min(limit, len(tools))
        names = [name for name, _ in self.search(query, tools, limit)]
        if self.fill and len(names) < min(limit, len(tools)):
            chosen = set(names)
            rest = (name for name in tools if name not in chosen)
            names.extend(itertools.islice(rest, limit - len(names)))
        return names


_sumprod: Callable[[Sequence[float], Sequence[float]], float] | None = getattr(
    math, "sumprod", None
)


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    if _sumprod is not None:
        return _sumprod(a, b)
    return float(sum(map(operator.mul, a, b)))


def _as_list(value: object) -> object:
    """An array (numpy, torch, jax: anything with ``tolist()``) as nested lists; else ``value``."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and not isinstance(value, (str, bytes, Sequence)):
        return tolist()
    return value


def _is_number(x: object) -> bool:
    # numbers.Real covers numpy's float32 and int64, which are not float or int.
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _unit_vectors(raw: object, count: int, dimension: int | None) -> list[list[float]]:
    """``raw`` checked as ``count`` finite vectors of one length, each scaled to length 1.

    ``raw`` may be a list of lists or an array (a numpy matrix, a list of numpy
    vectors). A zero vector stays zero (it is similar to nothing).
    """
    raw = _as_list(raw)
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)):
        raise ValueError(f"embed must return a list of vectors, not {type(raw).__name__}")
    if len(raw) != count:
        raise ValueError(f"embed returned {len(raw)} vectors for {count} texts")
    out: list[list[float]] = []
    for i, item in enumerate(raw):
        vector = _as_list(item)
        if not isinstance(vector, Sequence) or isinstance(vector, (str, bytes)):
            raise ValueError(f"embed's vector {i} is a {type(item).__name__}, not a list")
        if not all(_is_number(x) for x in vector):
            raise ValueError(f"embed's vector {i} holds a value that is not a number")
        values = [float(x) for x in vector]
        if not values:
            raise ValueError(f"embed's vector {i} is empty")
        if dimension is None:
            dimension = len(values)
        elif len(values) != dimension:
            raise ValueError(
                f"embed's vector {i} has {len(values)} dimensions, not {dimension} like the others"
            )
        if not all(math.isfinite(x) for x in values):
            raise ValueError(f"embed's vector {i} holds NaN or infinity")
        norm = math.sqrt(_dot(values, values))
        out.append([x / norm for x in values] if norm > 0 else values)
    return out


class _Embedded:
    """A tool set's names and unit vectors."""

    __slots__ = ("dimension", "names", "vectors")

    def __init__(self, names: list[str], vectors: list[list[float]]) -> None:
        self.names = names
        self.vectors = vectors
        self.dimension = len(vectors[0]) if vectors else None


class EmbeddingRetriever:
    """Ranks tools by the cosine similarity of their embedding to the input's.

    ``embed`` is your embedding model: it takes a list of texts and returns one
    vector per text, all of the same length: lists of floats, or an array
    (numpy, torch) as embedding libraries return. Each tool set is embedded once (a
    tool's text is its name and :func:`tool_document`), in batches of
    ``batch_size``, and kept for ``max_tool_sets`` sets; each selection embeds
    only the query. ``embed`` is called synchronously, in the thread that calls
    :meth:`select` (an :class:`~openstarry.agent.loop.ExecutionLoop` calls a
    retriever other than the lexical one in a worker thread): wrap a remote or
    async model in a function that blocks, or use a local one.

    Args:
        embed: ``embed(texts) -> vectors``.
        batch_size: The most texts passed to one ``embed`` call.
        max_tool_sets: How many tool sets' embeddings are kept.

    Raises:
        ValueError: from :meth:`select`, when ``embed`` returns the wrong number
            of vectors, vectors of different lengths, or values that are not
            finite numbers.
    """

    def __init__(
        self, embed: EmbedFunction, *, batch_size: int = 64, max_tool_sets: int = 8
    ) -> None:
        if not callable(embed):
            raise TypeError(f"embed must be callable, not {type(embed).__name__}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int of at least 1, not {batch_size!r}")
        self.embed = embed
        self.batch_size = batch_size
        self._sets = _PerToolSet("openstarry.embedding", self._build, max_tool_sets)

    @property
    def builds(self) -> int:
        """How many tool sets were embedded."""
        return self._sets.builds

    def _build(self, tools: Mapping[str, Tool]) -> _Embedded:
        names = list(tools)
        texts = [f"{name}\n{tool_document(tool)}" for name, tool in tools.items()]
        vectors: list[list[float]] = []
        dimension: int | None = None
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            vectors += _unit_vectors(self.embed(batch), len(batch), dimension)
            dimension = len(vectors[0])
        return _Embedded(names, vectors)

    def search(self, query: str, tools: Mapping[str, Tool], limit: int) -> list[tuple[str, float]]:
        """The ``limit`` tools most similar to ``query`` as ``(name, cosine)``, the best first.

        Ties are ordered by name. A blank query gives the first ``limit`` tools
        in their declared order, with a similarity of 0, without calling ``embed``.
        """
        _check_limit(limit)
        if not tools or limit == 0:
            return []
        limit = min(limit, len(tools))
        if not query.strip():
            return [(name, 0.0) for name in itertools.islice(tools, limit)]
        embedded: _Embedded = self._sets.get(tools)
        (q,) = _unit_vectors(self.embed([query]), 1, embedded.dimension)
        scored = sorted(
            ((_dot(q, v), name) for name, v in zip(embedded.names, embedded.vectors, strict=True)),
            key=lambda pair: (-pair[0], pair[1]),
        )
        return [(name, score) for score, name in scored[:limit]]

    def select(self, query: str, tools: Mapping[str, Tool], limit: int) -> list[str]:
        """The names of the ``limit`` tools most similar to ``query``, the best first."""
        return [name for name, _ in self.search(query, tools, limit)]


class HybridRetriever:
    """Fuses several retrievers' rankings by reciprocal rank (RRF).

    Each retriever ranks its ``depth`` best (at least ``limit``); a tool scores
    ``sum(weight / (k + rank))`` over the rankings it appears in (rank from 1),
    and the best scores win, ties by name. A lexical and an embedding retriever
    together catch both exact words and synonyms::

        HybridRetriever(LexicalRetriever(fill=False), EmbeddingRetriever(embed))

    Args:
        retrievers: Two or more :class:`ToolRetriever`.
        weights: One per retriever (default: all 1).
        k: Damps the advantage of the very first ranks (60 is the usual value).
        depth: How many each retriever ranks (default: ``2 * limit``).
    """

    def __init__(
        self,
        *retrievers: ToolRetriever,
        weights: Sequence[float] | None = None,
        k: float = 60.0,
        depth: int | None = None,
    ) -> None:
        if not retrievers:
            raise ValueError("HybridRetriever needs at least one retriever")
        for r in retrievers:
            if not isinstance(r, ToolRetriever):
                raise TypeError(f"{r!r} is not a ToolRetriever (it needs a select method)")
        weights = [1.0] * len(retrievers) if weights is None else [float(w) for w in weights]
        if len(weights) != len(retrievers):
            raise ValueError(f"{len(weights)} weights for {len(retrievers)} retrievers")
        if k <= 0 or not math.isfinite(k):
            raise ValueError(f"k must be a positive number, not {k!r}")
        if depth is not None and (
            isinstance(depth, bool) or not isinstance(depth, int) or depth < 1
        ):
            raise ValueError(f"depth must be at least 1, not {depth!r}")
        self.retrievers = retrievers
        self.weights = weights
        self.k = k
        self.depth = depth

    def select(self, query: str, tools: Mapping[str, Tool], limit: int) -> list[str]:
        """The names of the ``limit`` tools ranked best across the retrievers, the best first."""
        _check_limit(limit)
        if not tools or limit == 0:
            return []
        limit = min(limit, len(tools))
        depth = max(limit, self.depth if self.depth is not None else 2 * limit)
        scores: dict[str, float] = {}
        for retriever, weight in zip(self.retrievers, self.weights, strict=True):
            for rank, name in enumerate(retriever.select(query, tools, depth)[:depth], 1):
                if name in tools:
                    scores[name] = scores.get(name, 0.0) + weight / (self.k + rank)
        ranked = sorted(scores.items(), key=lambda item: (-item[1], item[0]))
        return [name for name, _ in ranked[:limit]]
