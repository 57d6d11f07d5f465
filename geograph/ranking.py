"""Text in, ranking out: :class:`Ranker` (Maniscope, Ricci-Filtration) and :class:`Retriever` (ISO-RAG,
G3RAG, dense) over the batched modules, configured by the method registry.

A :class:`Ranker` embeds a query and its documents (or takes their embeddings), runs the
reranker once for a whole batch of queries (padded, masked) and returns the documents best
first, each with the method's score and its relevance in [0, 1] (the registry's mapping of the
method's score range, the one the server's ``/v1`` and ``/v2/rerank`` answer with), and the
document's ``id`` and ``meta`` when the caller gave ``doc_ids`` / ``metadata`` (as ``rerankers``
and FlashRank pass them through).
Ricci-Filtration may drop documents: they are listed apart, in input order, not ranked.
A :class:`Retriever` embeds a corpus once, builds the method's corpus structure (a k-NN graph for
ISO-RAG, the gain graph for G3RAG) and retrieves passages for query texts.

Both have coroutine twins for asyncio callers (:meth:`Ranker.arank`, :meth:`Ranker.arank_batch`,
:meth:`Retriever.aretrieve`, :meth:`Retriever.aretrieve_batch`): the same call in a worker thread
(:func:`asyncio.to_thread`), so the event loop goes on serving while the encoder and the module run.

Example:
    >>> from geograph import Ranker, Retriever
    >>> texts = ["Paris is the capital of France.", "The Seine flows through Paris.", "Bananas are yellow."]
    >>> ranked = Ranker("maniscope").rank("What is the capital of France?", texts)
    >>> ranked[0].text
    'Paris is the capital of France.'
    >>> [round(r.relevance, 2) for r in ranked]                                 # doctest: +SKIP
    [0.81, 0.64, 0.34]
    >>> Retriever("g3", corpus=texts).retrieve("Which river flows through Paris?", k=2).texts  # doctest: +SKIP
    ['The Seine flows through Paris.', 'Paris is the capital of France.']
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from geograph import registry
from geograph.registry import MethodSpec
from geograph.text import LazyEncoder, as_rows, check_artefacts, check_top, module_device, pad

__all__ = ["Ranker", "Retriever", "RankedResult", "RankedResults", "RetrievedPassage", "RetrievedPassages"]


@dataclass(frozen=True)
class RankedResult:
    """One ranked document.

    Attributes:
        index: its position in the documents given.
        score: the method's score (Maniscope's mixed score, Ricci-Filtration's cosine).
        relevance: ``score`` mapped from the method's score range onto [0, 1].
        text: the document's text (``None`` when it was given as an embedding).
        id: the document's id from ``doc_ids`` (``None`` when none were given).
        meta: the document's entry of ``metadata`` (``None`` when none was given).
    """

    index: int
    score: float
    relevance: float
    text: str | None = None
    id: Any = None
    meta: Any = None


@dataclass(frozen=True)
class RankedResults:
    """A query's documents best first (``results``) and the ones the method dropped (``dropped``,
    positions in input order; only Ricci-Filtration drops). Iterating, ``len`` and ``[i]`` go over
    ``results``."""

    results: tuple[RankedResult, ...]
    dropped: tuple[int, ...] = ()

    def __iter__(self) -> Iterator[RankedResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, i: int) -> RankedResult:
        return self.results[i]

    @property
    def indices(self) -> list[int]:
        return [r.index for r in self.results]

    @property
    def texts(self) -> list[str | None]:
        return [r.text for r in self.results]

    @property
    def ids(self) -> list[Any]:
        return [r.id for r in self.results]


@dataclass(frozen=True)
class RetrievedPassage:
    """One retrieved passage: its corpus ``index`` (row), ``id``, the method's ``score`` and ``text``."""

    index: int
    id: str | None
    score: float
    text: str | None = None


@dataclass(frozen=True)
class RetrievedPassages:
    """A query's passages, best first (iterating, ``len`` and ``[i]`` go over ``results``)."""

    results: tuple[RetrievedPassage, ...]

    def __iter__(self) -> Iterator[RetrievedPassage]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, i: int) -> RetrievedPassage:
        return self.results[i]

    @property
    def indices(self) -> list[int]:
        return [r.index for r in self.results]

    @property
    def ids(self) -> list[str | None]:
        return [r.id for r in self.results]

    @property
    def texts(self) -> list[str | None]:
        return [r.text for r in self.results]


def _spec(method: Any, params: Mapping[str, Any], kind: str) -> tuple[MethodSpec, nn.Module | None]:
    """The registry entry of ``method`` (a name, or a module of a registered class) and the module if given."""
    if isinstance(method, nn.Module):
        spec = next((s for s in registry.METHODS.values() if type(method) is s.module), None)
        if spec is None:
            raise ValueError(f"method: {type(method).__name__} is not a registered method's module")
        if params:
            raise ValueError(f"params: {', '.join(params)} given next to a built module; set them on the module")
        module: nn.Module | None = method
    else:
        spec, module = registry.get(method), None
    if spec.kind != kind:
        use = "geograph.Ranker" if spec.kind == "reranker" else "geograph.Retriever"
        raise ValueError(f"method {spec.name} is a {spec.kind}: use {use}")
    return spec, module


def _per_document(values: Any, n: int, what: str) -> list[Any]:
    """``values`` (``None``, or one entry per document) as a list of ``n`` entries; one line naming
    ``what`` when it is not a list of that length."""
    if values is None:
        return [None] * n
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
        raise ValueError(f"{what} must be a list with one entry per document, got {type(values).__name__}")
    if len(values) != n:
        raise ValueError(f"{what}: {len(values)} entries for {n} documents")
    return list(values)


def _per_query(values: Any, sizes: list[int], what: str) -> list[list[Any]]:
    """``values`` (``None``, or one list per query) as per-query lists matching ``sizes``."""
    if values is None:
        return [[None] * n for n in sizes]
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
        raise ValueError(f"{what} must be a list with one list per query, got {type(values).__name__}")
    if len(values) != len(sizes):
        raise ValueError(f"{what}: {len(values)} lists for {len(sizes)} queries")
    return [_per_document(v, n, f"{what}[{i}]") for i, (v, n) in enumerate(zip(values, sizes))]


def _embed_rows(
    encoder: LazyEncoder, groups: list[tuple[list[str | None], list[Tensor | None]]], query: bool
) -> list[list[Tensor]]:
    """Fill every text position of ``groups`` with its embedding, all texts in one encoder call."""
    texts = [t for ts, _ in groups for t in ts if t is not None]
    if texts:
        enc = iter(encoder(texts, query=query))
        for ts, vs in groups:
            for j, t in enumerate(ts):
                if t is not None:
                    vs[j] = next(enc)
    return [cast(list[Tensor], vs) for _, vs in groups]  # every text position now holds its embedding


class Ranker:
    """Rerank documents for a query by a registered reranker (``maniscope``, ``ricci``).

    Args:
        method: the registered name (see :data:`geograph.registry.RERANKERS`) or a built reranker module.
        encoder: embeds texts (``None``: the offline all-MiniLM-L6-v2; a model name; an encoder
            object; a callable ``texts -> (N, D)``; see :mod:`geograph.text`); used only for texts.
        **params: the method's parameters (checked against the registry's bounds), e.g. ``k``,
            ``alpha`` for Maniscope.

    Example:
        >>> import torch
        >>> ranker = Ranker("maniscope", k=2)
        >>> q, docs = torch.tensor([1.0, 0.0]), torch.tensor([[0.0, 1.0], [1.0, 0.1], [0.6, 0.8]])
        >>> [(r.index, round(r.relevance, 3)) for r in ranker.rank(q, docs)]
        [(1, 0.999), (2, 0.776), (0, 0.584)]
    """

    def __init__(self, method: Any, encoder: Any = None, **params: Any) -> None:
        self.spec, module = _spec(method, params, "reranker")
        self.module = module if module is not None else self.spec.create(params=params)
        self.encoder = LazyEncoder(encoder)
        self.device: torch.device | None = None

    @property
    def method(self) -> str:
        return self.spec.name

    @property
    def params(self) -> dict[str, Any]:
        """The method's parameters as the module holds them (a configuration that makes it again)."""
        return _module_params(self.spec, self.module)

    def __repr__(self) -> str:
        return f"Ranker({self.module!r})"

    def to(self, device: str | torch.device) -> Ranker:
        """Run the module on ``device`` (inputs are moved there); returns ``self``."""
        self.device = torch.device(device)
        self.module.to(self.device)
        return self

    def rank(
        self,
        query: Any,
        documents: Any,
        top_k: int | None = None,
        doc_ids: Sequence[Any] | None = None,
        metadata: Sequence[Any] | None = None,
    ) -> RankedResults:
        """The ``documents`` for ``query``, best first.

        Args:
            query: a text or an embedding ``(D,)``.
            documents: texts, embeddings (a ``(N, D)`` tensor or ndarray), or a list mixing texts
                and ``(D,)`` embeddings.
            top_k: return at most this many (``None``: every document the method keeps).
            doc_ids: one id per document (any values), returned as each result's ``id``.
            metadata: one entry per document (a dict, say), returned as each result's ``meta``.

        Example:
            >>> import torch
            >>> q, docs = torch.tensor([1.0, 0.0]), torch.tensor([[0.0, 1.0], [1.0, 0.1], [0.6, 0.8]])
            >>> ranked = Ranker("maniscope", k=2).rank(q, docs, doc_ids=["a", "b", "c"], metadata=[{}, {"p": 2}, {}])
            >>> ranked.ids, ranked[0].meta
            (['b', 'c', 'a'], {'p': 2})
        """
        ids = None if doc_ids is None else [doc_ids]
        meta = None if metadata is None else [metadata]
        return self._rank_batch([query], [documents], top_k, ids, meta, single=True)[0]

    def rank_batch(
        self,
        queries: Any,
        documents: Sequence[Any],
        top_k: int | None = None,
        doc_ids: Sequence[Sequence[Any] | None] | None = None,
        metadata: Sequence[Sequence[Any] | None] | None = None,
    ) -> list[RankedResults]:
        """:meth:`rank` for ``B`` queries in one module call (padded to the longest list, masked).

        Args:
            queries: ``B`` texts or embeddings (or a ``(B, D)`` tensor).
            documents: ``B`` lists of documents (each as :meth:`rank` takes them).
            top_k: as in :meth:`rank`, for every query.
            doc_ids: ``B`` lists of ids, one per document of the query's list (an entry may be ``None``).
            metadata: ``B`` lists of metadata entries, as ``doc_ids``.
        """
        return self._rank_batch(queries, documents, top_k, doc_ids, metadata)

    async def arank(
        self,
        query: Any,
        documents: Any,
        top_k: int | None = None,
        doc_ids: Sequence[Any] | None = None,
        metadata: Sequence[Any] | None = None,
    ) -> RankedResults:
        """:meth:`rank` for asyncio callers: runs in a worker thread, the event loop is not blocked.

        Example:
            >>> import asyncio, torch
            >>> q, docs = torch.tensor([1.0, 0.0]), torch.tensor([[0.0, 1.0], [1.0, 0.1]])
            >>> asyncio.run(Ranker("maniscope", k=1).arank(q, docs)).indices
            [1, 0]
        """
        return await asyncio.to_thread(self.rank, query, documents, top_k, doc_ids, metadata)

    async def arank_batch(
        self,
        queries: Any,
        documents: Sequence[Any],
        top_k: int | None = None,
        doc_ids: Sequence[Sequence[Any] | None] | None = None,
        metadata: Sequence[Sequence[Any] | None] | None = None,
    ) -> list[RankedResults]:
        """:meth:`rank_batch` for asyncio callers (one module call in a worker thread)."""
        return await asyncio.to_thread(self.rank_batch, queries, documents, top_k, doc_ids, metadata)

    def _rank_batch(
        self,
        queries: Any,
        documents: Sequence[Any],
        top_k: int | None,
        doc_ids: Any,
        metadata: Any,
        single: bool = False,
    ) -> list[RankedResults]:
        check_top(top_k, "top_k")
        q_texts, q_vecs = as_rows(queries, "queries")
        if len(documents) != len(q_texts):
            raise ValueError(f"documents has {len(documents)} lists for {len(q_texts)} queries")
        groups = [as_rows(d, "documents" if single else f"documents[{i}]") for i, d in enumerate(documents)]
        sizes = [len(ts) for ts, _ in groups]
        if single:  # rank(): the lists' names without an index
            ids = [_per_document(None if doc_ids is None else doc_ids[0], sizes[0], "doc_ids")]
            metas = [_per_document(None if metadata is None else metadata[0], sizes[0], "metadata")]
        else:
            ids, metas = _per_query(doc_ids, sizes, "doc_ids"), _per_query(metadata, sizes, "metadata")
        [qv] = _embed_rows(self.encoder, [(q_texts, q_vecs)], query=True)
        dv = _embed_rows(self.encoder, groups, query=False)
        rows = [i for i, vs in enumerate(dv) if vs]
        out = [RankedResults(())] * len(q_texts)
        if not rows:
            return out
        vecs = [v for i in rows for v in (qv[i], *dv[i])]
        dims = {int(v.shape[0]) for v in vecs}
        if len(dims) != 1:
            raise ValueError(f"queries and documents: embeddings of different dimensions {sorted(dims)}")
        dtype = torch.float64 if any(v.dtype == torch.float64 for v in vecs) else torch.float32
        dev = self.device if self.device is not None else vecs[0].device
        q = torch.stack([qv[i] for i in rows]).to(dev, dtype)
        docs, mask = pad([torch.stack(dv[i]).to(dev, dtype) for i in rows])
        with torch.inference_mode():
            res = self.module(q, docs, mask)
            relevance = self.spec.relevance(res.scores, self.module)
        order, scores, keep, rel = (t.cpu() for t in (res.order, res.scores, res.keep, relevance))
        for b, i in enumerate(rows):
            n, texts = len(dv[i]), groups[i][0]
            kept = [j for j in order[b, :n].tolist() if keep[b, j]]
            results = tuple(
                RankedResult(j, float(scores[b, j]), float(rel[b, j]), texts[j], ids[i][j], metas[i][j])
                for j in kept[:top_k]
            )
            out[i] = RankedResults(results, tuple(j for j in range(n) if not keep[b, j]))
        return out


class Retriever:
    """Retrieve passages of a text corpus by a registered retriever (``iso``, ``g3``, ``dense``).

    Args:
        method: the registered name (see :data:`geograph.registry.RETRIEVERS`) or a retriever
            module already built over the corpus's embeddings (row ``i`` = passage ``i``).
        corpus: the passages: a list of texts, or a mapping ``id -> text`` (ids in its order).
        encoder: embeds the corpus and the queries (as :class:`Ranker`'s; the corpus's model).
        ids: the passages' ids for a list ``corpus`` (default: none).
        embeddings: ``(V, D)`` corpus embeddings to use instead of embedding ``corpus``.
        graph: a saved-and-loaded corpus structure (:class:`~geograph.CorpusGraph` for ISO-RAG,
            :class:`~geograph.G3Graph` for G3RAG) instead of building one.
        projection: a trained :class:`~geograph.PoincareProjection` (ISO-RAG).
        **params: the method's parameters, build parameters included (checked against the registry).

    Example:
        >>> import torch
        >>> emb = torch.eye(4)[[0, 1, 2, 3, 0]] + 0.1
        >>> r = Retriever("dense", corpus=["a", "b", "c", "d", "a2"], embeddings=emb)
        >>> r.retrieve(torch.tensor([1.0, 0, 0, 0]), k=2).texts
        ['a', 'a2']
    """

    def __init__(
        self,
        method: Any,
        corpus: Sequence[str] | Mapping[Any, str] | None = None,
        encoder: Any = None,
        *,
        ids: Sequence[Any] | None = None,
        embeddings: Any = None,
        graph: nn.Module | None = None,
        projection: nn.Module | None = None,
        **params: Any,
    ) -> None:
        self.spec, module = _spec(method, params, "retriever")
        self.encoder = LazyEncoder(encoder)
        self._params = dict(params)
        if isinstance(corpus, Mapping):
            if ids is not None:
                raise ValueError("ids: the corpus is a mapping id -> text already")
            ids, corpus = list(corpus.keys()), list(corpus.values())
        if isinstance(corpus, str):
            raise ValueError("corpus must be a list of texts or a mapping id -> text, got a single string")
        self.texts: list[str] | None = None if corpus is None else [str(t) for t in corpus]
        self.ids = None if ids is None else [str(x) for x in ids]
        if self.ids is not None and (self.texts is None or len(self.ids) != len(self.texts)):
            raise ValueError(f"ids: {len(self.ids)} ids for {0 if self.texts is None else len(self.texts)} passages")
        if module is None:
            emb = self._corpus_embeddings(embeddings)
            module = self.spec.create(emb, params, graph=graph, projection=projection)
        elif embeddings is not None or graph is not None or projection is not None:
            raise ValueError("embeddings, graph, projection: the module given is built already")
        self.module = module
        self.size = _corpus_size(module)
        if self.texts is not None and len(self.texts) != self.size:
            raise ValueError(f"corpus: {len(self.texts)} passages, the {self.spec.label} corpus has {self.size}")
        check_artefacts(module, None, None if self.texts is None else len(self.texts))
        self._encoder_checked = False

    def _corpus_embeddings(self, embeddings: Any) -> Tensor:
        if embeddings is not None:
            emb = torch.as_tensor(embeddings)
            if emb.ndim != 2 or (self.texts is not None and emb.shape[0] != len(self.texts)):
                n = "any" if self.texts is None else len(self.texts)
                raise ValueError(f"embeddings: shape {tuple(emb.shape)}, expected ({n}, D) for the corpus")
            return emb if emb.is_floating_point() else emb.float()
        if not self.texts:
            raise ValueError(f"corpus: method {self.spec.name} needs passages (texts, or embeddings=)")
        return self.encoder(self.texts)

    @property
    def method(self) -> str:
        return self.spec.name

    @property
    def params(self) -> dict[str, Any]:
        """The parameters given by name (build parameters included), or those a given module holds."""
        return dict(self._params) if self._params else _module_params(self.spec, self.module)

    def __repr__(self) -> str:
        return f"Retriever({self.spec.name}, passages={self.size})"

    def retrieve(self, query: Any, k: int = 10) -> RetrievedPassages:
        """The ``k`` best passages for ``query`` (a text or an embedding ``(D,)``)."""
        return self.retrieve_batch([query], k)[0]

    async def aretrieve(self, query: Any, k: int = 10) -> RetrievedPassages:
        """:meth:`retrieve` for asyncio callers: runs in a worker thread, the event loop is not blocked."""
        return await asyncio.to_thread(self.retrieve, query, k)

    async def aretrieve_batch(self, queries: Any, k: int = 10) -> list[RetrievedPassages]:
        """:meth:`retrieve_batch` for asyncio callers (one module call in a worker thread)."""
        return await asyncio.to_thread(self.retrieve_batch, queries, k)

    def retrieve_batch(self, queries: Any, k: int = 10) -> list[RetrievedPassages]:
        """:meth:`retrieve` for ``B`` queries (texts or embeddings, or a ``(B, D)`` tensor) in one module call."""
        lo, hi, why = self.spec.k_range(self.module, self.size)  # type: ignore[misc]
        if isinstance(k, bool) or not isinstance(k, int) or k < lo or (hi is not None and k > hi):
            raise ValueError(f"k must be an integer in [{lo}, {hi}] ({why}), got {k!r}")
        texts, vecs = as_rows(queries, "queries")
        if not texts:
            return []
        if not self._encoder_checked and any(t is not None for t in texts):
            check_artefacts(self.module, self.encoder.get())  # a saved graph made with another encoder
            self._encoder_checked = True
        [qv] = _embed_rows(self.encoder, [(texts, vecs)], query=True)
        dev = module_device(self.module)
        q = torch.stack(qv)
        with torch.inference_mode():
            res = self.module(q if dev is None else q.to(dev), k)
        idx, scores = res.indices.cpu().tolist(), res.scores.cpu().tolist()
        return [
            RetrievedPassages(
                tuple(
                    RetrievedPassage(
                        j,
                        None if self.ids is None else self.ids[j],
                        float(s),
                        None if self.texts is None else self.texts[j],
                    )
                    for j, s in zip(row, srow)
                    if j >= 0
                )
            )
            for row, srow in zip(idx, scores)
        ]


def _corpus_size(module: nn.Module) -> int:
    graph = getattr(module, "graph", None)
    if graph is not None:
        return int(graph.num_nodes)
    return int(cast(Tensor, module.embeddings).shape[0])  # nn.Module types a buffer as Tensor | Module


def _module_params(spec: MethodSpec, module: nn.Module) -> dict[str, Any]:
    out = {}
    for p in spec.params:
        value = getattr(module, p.name, None)
        if p.accepts(value):
            out[p.name] = value
    return out
