"""LangChain components (``pip install 'geograph-rag[langchain]'``: ``langchain-core`` only), built on
:class:`geograph.Ranker` and :class:`geograph.Retriever`.

* :class:`GeographCompressor`: a ``BaseDocumentCompressor`` that reranks a query's documents with
  Maniscope or Ricci-Filtration in one module call (Ricci-Filtration's dropped documents are left
  out); ``compress_documents`` and ``acompress_documents``.
* :class:`GeographRetriever`: a ``BaseRetriever`` over a corpus for ISO-RAG / G3RAG / dense.

Each returned ``Document`` is the input one with ``metadata["geograph_score"]`` (the method's
score) and ``metadata["relevance_score"]`` (for the compressor: that score mapped onto [0, 1]).

Example:
    >>> from geograph.integrations.langchain import GeographCompressor, GeographRetriever  # doctest: +SKIP
    >>> retriever = GeographRetriever(method="g3", corpus=texts, k=8)                       # doctest: +SKIP
    >>> GeographCompressor(method="maniscope", top_n=3).compress_documents(retriever.invoke(q), q)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

try:
    from langchain_core.callbacks import CallbackManagerForRetrieverRun, Callbacks
    from langchain_core.documents import BaseDocumentCompressor, Document
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables.config import run_in_executor
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "geograph.integrations.langchain needs the langchain extra: pip install 'geograph-rag[langchain]'"
    ) from e
from pydantic import ConfigDict, Field, PrivateAttr, field_validator, model_validator

from geograph.ranking import Ranker, Retriever
from geograph.text import check_top


def _scored(doc: Document, score: float, relevance: float | None = None) -> Document:
    meta = {**doc.metadata, "geograph_score": score}
    if relevance is not None:
        meta["relevance_score"] = relevance
    return Document(page_content=doc.page_content, metadata=meta, id=doc.id)


def _module_alias(data: Any) -> Any:
    """``module=`` (a built module) is accepted for ``method=``."""
    if isinstance(data, dict) and "module" in data:
        data = dict(data)
        if "method" in data:
            raise ValueError("give method or module, not both")
        data["method"] = data.pop("module")
    return data


class GeographCompressor(BaseDocumentCompressor):
    """Rerank a query's documents with a geograph reranker (one padded module call).

    Args:
        method: ``"maniscope"`` or ``"ricci"`` (or a built reranker module; ``module=`` is accepted too).
        params: the method's parameters (e.g. ``{"k": 5, "alpha": 0.3}``).
        encoder: embeds the query and the documents' ``page_content`` (a model name, a
            :class:`geograph.data.Encoder`, a LangChain ``Embeddings``, or a callable); default
            the offline all-MiniLM-L6-v2.
        top_n: keep at most this many (``None``: all the method keeps).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    method: Any = "maniscope"
    params: dict[str, Any] = Field(default_factory=dict)
    encoder: Any = None
    top_n: int | None = Field(None)
    _ranker: Any = PrivateAttr(None)

    _alias = model_validator(mode="before")(_module_alias)

    @field_validator("top_n")
    @classmethod
    def _top(cls, v: int | None) -> int | None:
        return check_top(v, "top_n")

    def model_post_init(self, context: Any) -> None:
        self._ranker = Ranker(self.method, encoder=self.encoder, **self.params)

    @property
    def ranker(self) -> Ranker:
        ranker: Ranker = self._ranker
        return ranker

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        documents = list(documents)
        ranked = self._ranker.rank(query, [d.page_content for d in documents], top_k=self.top_n)
        return [_scored(documents[r.index], r.score, r.relevance) for r in ranked]

    async def acompress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        return await run_in_executor(None, self.compress_documents, documents, query, callbacks)


class GeographRetriever(BaseRetriever):
    """Retrieve from a corpus with ISO-RAG / G3RAG / dense.

    Args:
        method: ``"iso"``, ``"g3"`` or ``"dense"`` (built over the corpus at construction), or a
            retriever module built over the corpus embeddings (``module=`` is accepted too).
        corpus: the corpus as ``Document`` s (or strings), row ``i`` of the module's corpus first.
        params: the method's parameters (build parameters included).
        encoder: embeds the corpus and the queries; default the offline all-MiniLM-L6-v2.
        embeddings: ``(V, D)`` corpus embeddings to use instead of embedding the corpus.
        k: passages per query (G3: at least its ``seeds``).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    method: Any
    corpus: list[Document]
    params: dict[str, Any] = Field(default_factory=dict)
    encoder: Any = None
    embeddings: Any = None
    k: int = 4
    _retriever: Any = PrivateAttr(None)

    _alias = model_validator(mode="before")(_module_alias)

    @field_validator("corpus", mode="before")
    @classmethod
    def _docs(cls, v: Iterable[Document | str]) -> list[Document]:
        return [Document(page_content=d) if isinstance(d, str) else d for d in v]

    @field_validator("k")
    @classmethod
    def _k(cls, v: int) -> int:
        return check_top(v, "k")

    def model_post_init(self, context: Any) -> None:
        self._retriever = Retriever(
            self.method,
            corpus=[d.page_content for d in self.corpus],
            encoder=self.encoder,
            embeddings=self.embeddings,
            **self.params,
        )

    @property
    def retriever(self) -> Retriever:
        retriever: Retriever = self._retriever
        return retriever

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return [_scored(self.corpus[r.index], r.score) for r in self._retriever.retrieve(query, self.k)]
