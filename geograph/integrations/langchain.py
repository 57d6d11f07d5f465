"""LangChain components (``pip install 'geograph-rag[langchain]'``: ``langchain-core`` only).

* :class:`GeographCompressor`: a ``BaseDocumentCompressor`` that reranks a query's documents with
  Maniscope or Ricci-Filtration in one module call (Ricci-Filtration's dropped documents are left
  out); ``compress_documents`` and ``acompress_documents``.
* :class:`GeographRetriever`: a ``BaseRetriever`` over a corpus for ISO-RAG / G3RAG (or any
  corpus retriever ``module(query, k)``), one module call per query.

Each returned ``Document`` is the input one with ``metadata["geograph_score"]``, the method's score.

Example:
    >>> from geograph import Maniscope                                              # doctest: +SKIP
    >>> from geograph.integrations.langchain import GeographCompressor              # doctest: +SKIP
    >>> GeographCompressor(module=Maniscope(), top_n=3).compress_documents(docs, "query")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
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
from pydantic import ConfigDict, Field, PrivateAttr, field_validator

from geograph.integrations._common import check_top, cut, embed, rerank, resolve_encoder, retrieve


def _scored(doc: Document, score: float) -> Document:
    return Document(page_content=doc.page_content, metadata={**doc.metadata, "geograph_score": score}, id=doc.id)


class GeographCompressor(BaseDocumentCompressor):
    """Rerank a query's documents with a geograph reranker (one padded module call).

    Args:
        module: :class:`~geograph.Maniscope` or :class:`~geograph.RicciFiltration`.
        encoder: embeds the query and the documents' ``page_content`` (a
            :class:`geograph.data.Encoder`, a LangChain ``Embeddings``, or a callable); default
            the offline all-MiniLM-L6-v2.
        top_n: keep at most this many (``None``: all the method keeps).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    module: Any
    encoder: Any = None
    top_n: int | None = Field(None)
    _encoder: Any = PrivateAttr(None)

    @field_validator("top_n")
    @classmethod
    def _top(cls, v):
        return check_top(v, "top_n")

    def _enc(self):
        return resolve_encoder(self)

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        documents = list(documents)
        if not documents:
            return []
        enc = self._enc()
        q = embed(enc, [query], query=True)
        docs = embed(enc, [d.page_content for d in documents]).to(q)
        [ranked] = rerank(self.module, q, [docs])
        return [_scored(documents[j], s) for j, s in cut(ranked, self.top_n)]

    async def acompress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        return await run_in_executor(None, self.compress_documents, documents, query, callbacks)


class GeographRetriever(BaseRetriever):
    """Retrieve from a corpus with ISO-RAG / G3RAG (any ``module(query (B, D), k)`` retriever).

    Args:
        module: :class:`~geograph.ISORetriever`, :class:`~geograph.G3Retriever`, or
            :class:`~geograph.retrievers.DenseRetriever`, built over the corpus embeddings.
        corpus: the corpus as ``Document`` s (or strings), row ``i`` of the module's corpus first.
        encoder: embeds queries (the corpus's model); default the offline all-MiniLM-L6-v2.
        k: passages per query (G3: at least its ``seeds``).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    module: Any
    corpus: list[Document]
    encoder: Any = None
    k: int = 4
    _encoder: Any = PrivateAttr(None)

    @field_validator("corpus", mode="before")
    @classmethod
    def _docs(cls, v):
        return [Document(page_content=d) if isinstance(d, str) else d for d in v]

    @field_validator("k")
    @classmethod
    def _k(cls, v):
        return check_top(v, "k")

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        [ranked] = retrieve(self.module, embed(resolve_encoder(self), [query], query=True), self.k)
        return [_scored(self.corpus[j], s) for j, s in ranked]
