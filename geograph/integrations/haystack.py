"""Haystack components (``pip install 'geograph-rag[haystack]'``: ``haystack-ai``), built on
:class:`geograph.Ranker` and :class:`geograph.Retriever`.

* :class:`GeographRanker`: ``run(query, documents, top_k)`` reranks the documents with Maniscope
  or Ricci-Filtration in one module call (Ricci-Filtration's dropped documents are left out); a
  document's ``embedding`` is used where present, the encoder embeds the rest and the query.
* :class:`GeographRetriever`: ``run(query, top_k)`` over a corpus of documents for ISO-RAG / G3RAG / dense.

Returned documents are copies with ``score`` set to the method's score (for the ranker: with
``meta["relevance_score"]``, that score mapped onto [0, 1]). Both serialise with ``to_dict`` /
``from_dict`` (so pipelines that hold them save to YAML) when the encoder is the default or a
model name or directory; Haystack loads them from a trusted module only, so name it:
``Pipeline.loads(text, allowed_modules=["geograph.integrations.haystack"])``.

Example:
    >>> from haystack import Pipeline                                              # doctest: +SKIP
    >>> p = Pipeline(); p.add_component("ranker", GeographRanker("maniscope", top_k=5))  # doctest: +SKIP
"""

# no `from __future__ import annotations`: Haystack reads run()'s annotations as types
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

try:
    from haystack import Document, component, default_from_dict, default_to_dict
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "geograph.integrations.haystack needs the haystack extra: pip install 'geograph-rag[haystack]'"
    ) from e

from geograph.ranking import Ranker, Retriever
from geograph.text import check_top


def _encoder_name(owner: Any, lazy: Any) -> Any:
    if lazy.spec is not None and lazy.name is None:
        raise ValueError(
            f"{type(owner).__name__}.to_dict: the encoder {type(lazy.spec).__name__} cannot be saved; "
            "give the encoder as a model name or directory"
        )
    return lazy.name


@component
class GeographRanker:
    """Rerank documents for a query with a geograph reranker (one padded module call).

    Args:
        method: ``"maniscope"`` or ``"ricci"`` (or a built reranker module).
        encoder: embeds the query and documents without an ``embedding`` (a model name, a
            :class:`geograph.data.Encoder` or a callable ``texts -> (N, D)``); default the
            offline all-MiniLM-L6-v2.
        top_k: keep at most this many (``None``: all the method keeps).
        params: the method's parameters.
    """

    def __init__(
        self,
        method: Any = "maniscope",
        encoder: Any = None,
        top_k: int | None = None,
        params: dict[str, Any] | None = None,
    ) -> None:
        self.ranker = Ranker(method, encoder=encoder, **(params or {}))
        self.top_k = check_top(top_k, "top_k")

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self,
            method=self.ranker.method,
            encoder=_encoder_name(self, self.ranker.encoder),
            top_k=self.top_k,
            params=self.ranker.params,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GeographRanker":
        return default_from_dict(cls, data)

    @component.output_types(documents=list[Document])
    def run(self, query: str, documents: list[Document], top_k: int | None = None) -> dict[str, list[Document]]:
        top_k = check_top(top_k, "top_k") if top_k is not None else self.top_k
        docs = [(d.content or "") if d.embedding is None else d.embedding for d in documents]
        ranked = self.ranker.rank(query, docs, top_k=top_k)
        out = []
        for r in ranked:
            d = documents[r.index]
            out.append(replace(d, score=r.score, meta={**d.meta, "relevance_score": r.relevance}))
        return {"documents": out}


@component
class GeographRetriever:
    """Retrieve from a corpus of documents with ISO-RAG / G3RAG / dense.

    Args:
        method: ``"iso"``, ``"g3"`` or ``"dense"`` (built over the documents at construction:
            their embeddings when every document has one, else the encoder's), or a retriever
            module built over the corpus embeddings (row ``i`` = document ``i``).
        documents: the corpus.
        encoder: embeds the corpus and the queries; default the offline all-MiniLM-L6-v2.
        top_k: documents per query (G3: at least its ``seeds``).
        params: the method's parameters (build parameters included).
    """

    def __init__(
        self,
        method: Any,
        documents: Sequence[Document],
        encoder: Any = None,
        top_k: int = 10,
        params: dict[str, Any] | None = None,
    ) -> None:
        self.documents = list(documents)
        self.top_k = check_top(top_k, "top_k")
        emb = None
        if isinstance(method, str) and self.documents and all(d.embedding is not None for d in self.documents):
            emb = [d.embedding for d in self.documents]
        self.retriever = Retriever(
            method, corpus=[d.content or "" for d in self.documents], encoder=encoder, embeddings=emb, **(params or {})
        )

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self,
            method=self.retriever.method,
            documents=[d.to_dict() for d in self.documents],
            encoder=_encoder_name(self, self.retriever.encoder),
            top_k=self.top_k,
            params=self.retriever.params,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GeographRetriever":
        data = {**data, "init_parameters": dict(data["init_parameters"])}
        data["init_parameters"]["documents"] = [Document.from_dict(d) for d in data["init_parameters"]["documents"]]
        return default_from_dict(cls, data)

    @component.output_types(documents=list[Document])
    def run(self, query: str, top_k: int | None = None) -> dict[str, list[Document]]:
        k = check_top(top_k, "top_k") if top_k is not None else self.top_k
        return {
            "documents": [replace(self.documents[r.index], score=r.score) for r in self.retriever.retrieve(query, k)]
        }
