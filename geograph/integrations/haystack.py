"""Haystack components (``pip install 'geograph-rag[haystack]'``: ``haystack-ai``).

* :class:`GeographRanker`: ``run(query, documents, top_k)`` reranks the documents with Maniscope
  or Ricci-Filtration in one module call (Ricci-Filtration's dropped documents are left out); a
  document's ``embedding`` is used where present, the encoder embeds the rest and the query.
* :class:`GeographRetriever`: ``run(query, top_k)`` over a corpus of documents for ISO-RAG / G3RAG.

Returned documents are copies with ``score`` set to the method's score.

Example:
    >>> from haystack import Pipeline                                              # doctest: +SKIP
    >>> p = Pipeline(); p.add_component("ranker", GeographRanker(Maniscope()))       # doctest: +SKIP
"""

# no `from __future__ import annotations`: Haystack reads run()'s annotations as types
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

try:
    from haystack import Document, component
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "geograph.integrations.haystack needs the haystack extra: pip install 'geograph-rag[haystack]'"
    ) from e
import torch

from geograph.integrations._common import check_top, cut, default_encoder, embed, rerank, retrieve


def _enc(component_) -> Any:
    if component_.encoder is None:
        component_.encoder = default_encoder()
    return component_.encoder


@component
class GeographRanker:
    """Rerank documents for a query with a geograph reranker (one padded module call).

    Args:
        module: :class:`~geograph.Maniscope` or :class:`~geograph.RicciFiltration`.
        encoder: embeds the query and documents without an ``embedding`` (a
            :class:`geograph.data.Encoder` or a callable ``texts -> (N, D)``); default the
            offline all-MiniLM-L6-v2.
        top_k: keep at most this many (``None``: all the method keeps).
    """

    def __init__(self, module: Any, encoder: Any = None, top_k: int | None = None) -> None:
        self.module, self.encoder, self.top_k = module, encoder, check_top(top_k, "top_k")

    @component.output_types(documents=list[Document])
    def run(self, query: str, documents: list[Document], top_k: int | None = None):
        top_k = check_top(top_k, "top_k") if top_k is not None else self.top_k
        if not documents:
            return {"documents": []}
        q = embed(_enc(self), [query], query=True).float()
        rows: list = [None if d.embedding is None else torch.as_tensor(d.embedding, dtype=q.dtype) for d in documents]
        missing = [i for i, r in enumerate(rows) if r is None]
        if missing:
            vecs = embed(_enc(self), [documents[i].content or "" for i in missing]).to(q)
            for i, v in zip(missing, vecs):
                rows[i] = v
        [ranked] = rerank(self.module, q, [torch.stack(rows)])
        return {"documents": [replace(documents[j], score=s) for j, s in cut(ranked, top_k)]}


@component
class GeographRetriever:
    """Retrieve from a corpus with ISO-RAG / G3RAG (any ``module(query (B, D), k)`` retriever).

    Args:
        module: :class:`~geograph.ISORetriever`, :class:`~geograph.G3Retriever`, or
            :class:`~geograph.retrievers.DenseRetriever`, built over the corpus embeddings.
        documents: the corpus, row ``i`` of the module's corpus first.
        encoder: embeds queries (the corpus's model); default the offline all-MiniLM-L6-v2.
        top_k: documents per query (G3: at least its ``seeds``).
    """

    def __init__(self, module: Any, documents: Sequence[Document], encoder: Any = None, top_k: int = 10) -> None:
        self.module, self.encoder, self.top_k = module, encoder, check_top(top_k, "top_k")
        self.documents = list(documents)

    @component.output_types(documents=list[Document])
    def run(self, query: str, top_k: int | None = None):
        k = check_top(top_k, "top_k") if top_k is not None else self.top_k
        [ranked] = retrieve(self.module, embed(_enc(self), [query], query=True).float(), k)
        return {"documents": [replace(self.documents[j], score=s) for j, s in ranked]}
