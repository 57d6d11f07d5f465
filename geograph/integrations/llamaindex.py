"""LlamaIndex components (``pip install 'geograph-rag[llamaindex]'``: ``llama-index-core``), built on
:class:`geograph.Ranker` and :class:`geograph.Retriever`.

* :class:`GeographPostprocessor`: a ``BaseNodePostprocessor`` that reranks the retrieved nodes
  with Maniscope or Ricci-Filtration in one module call (Ricci-Filtration's dropped nodes are
  left out). It uses ``node.embedding`` and ``query_bundle.embedding`` where present and the
  encoder for the rest (so they must come from the same model).
* :class:`GeographRetriever`: a ``BaseRetriever`` over a corpus of nodes for ISO-RAG / G3RAG / dense.

Returned nodes carry the method's score in ``NodeWithScore.score``.

Example:
    >>> from geograph.integrations.llamaindex import GeographPostprocessor        # doctest: +SKIP
    >>> rerank = GeographPostprocessor(method="maniscope", top_n=5)  # doctest: +SKIP
    >>> engine = index.as_query_engine(node_postprocessors=[rerank])  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import BaseNode, NodeWithScore, QueryBundle, TextNode
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "geograph.integrations.llamaindex needs the llamaindex extra: pip install 'geograph-rag[llamaindex]'"
    ) from e

from geograph.ranking import Ranker, Retriever
from geograph.text import check_top


def _query(bundle: QueryBundle) -> Any:
    return bundle.embedding if bundle.embedding is not None else bundle.query_str


class GeographPostprocessor(BaseNodePostprocessor):
    """Rerank a query's nodes with a geograph reranker (one padded module call).

    Args:
        method: ``"maniscope"`` or ``"ricci"`` (or a built reranker module; ``module=`` is accepted too).
        params: the method's parameters.
        encoder: embeds what has no embedding yet (a model name, a :class:`geograph.data.Encoder`,
            a callable ``texts -> (N, D)``); default the offline all-MiniLM-L6-v2.
        top_n: keep at most this many (``None``: all the method keeps).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    method: Any = Field("maniscope", description="a geograph reranker's name or module")
    params: dict[str, Any] = Field(default_factory=dict, description="the method's parameters")
    encoder: Any = Field(None, description="embeds texts without an embedding")
    top_n: int | None = Field(None, description="keep at most this many")
    _ranker: Any = PrivateAttr(None)

    def __init__(self, **kwargs: Any) -> None:
        if "module" in kwargs:
            if "method" in kwargs:
                raise ValueError("give method or module, not both")
            kwargs["method"] = kwargs.pop("module")
        super().__init__(**kwargs)
        check_top(self.top_n, "top_n")
        self._ranker = Ranker(self.method, encoder=self.encoder, **self.params)

    @classmethod
    def class_name(cls) -> str:
        return "GeographPostprocessor"

    @property
    def ranker(self) -> Ranker:
        ranker: Ranker = self._ranker
        return ranker

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("query_bundle is required (the query to rerank for)")
        docs = [n.node.get_content() if n.node.embedding is None else n.node.embedding for n in nodes]
        ranked = self._ranker.rank(_query(query_bundle), docs, top_k=self.top_n)
        return [NodeWithScore(node=nodes[r.index].node, score=r.score) for r in ranked]


class GeographRetriever(BaseRetriever):
    """Retrieve from a corpus of nodes with ISO-RAG / G3RAG / dense.

    Args:
        method: ``"iso"``, ``"g3"`` or ``"dense"`` (built over the nodes at construction: their
            embeddings when every node has one, else the encoder's), or a retriever module built
            over the corpus embeddings.
        nodes: the corpus as nodes (or strings), row ``i`` of the module's corpus first.
        encoder: embeds the corpus and query texts (when the bundle has no embedding); default the
            offline all-MiniLM-L6-v2.
        k: nodes per query (G3: at least its ``seeds``).
        **params: the method's parameters (build parameters included).
    """

    def __init__(
        self,
        method: Any,
        nodes: Sequence[Any],
        *,
        encoder: Any = None,
        k: int = 4,
        embeddings: Any = None,
        **params: Any,
    ) -> None:
        callback_manager = params.pop("callback_manager", None)
        super().__init__(callback_manager=callback_manager)
        self.k = check_top(k, "k")
        self.nodes: list[BaseNode] = [TextNode(text=n) if isinstance(n, str) else n for n in nodes]
        if embeddings is None and isinstance(method, str) and all(n.embedding is not None for n in self.nodes):
            embeddings = [n.embedding for n in self.nodes]
        self.retriever = Retriever(
            method, corpus=[n.get_content() for n in self.nodes], encoder=encoder, embeddings=embeddings, **params
        )

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [
            NodeWithScore(node=self.nodes[r.index], score=r.score)
            for r in self.retriever.retrieve(_query(query_bundle), self.k)
        ]
