"""LlamaIndex components (``pip install 'geograph-rag[llamaindex]'``: ``llama-index-core``).

* :class:`GeographPostprocessor`: a ``BaseNodePostprocessor`` that reranks the retrieved nodes
  with Maniscope or Ricci-Filtration in one module call (Ricci-Filtration's dropped nodes are
  left out). It uses ``node.embedding`` and ``query_bundle.embedding`` where present and the
  encoder for the rest (so they must come from the same model).
* :class:`GeographRetriever`: a ``BaseRetriever`` over a corpus of nodes for ISO-RAG / G3RAG.

Returned nodes carry the method's score in ``NodeWithScore.score``.

Example:
    >>> from geograph.integrations.llamaindex import GeographPostprocessor        # doctest: +SKIP
    >>> rerank = GeographPostprocessor(module=Maniscope())  # doctest: +SKIP
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
import torch

from geograph.integrations._common import check_top, cut, default_encoder, embed, rerank, resolve_encoder, retrieve


class GeographPostprocessor(BaseNodePostprocessor):
    """Rerank a query's nodes with a geograph reranker (one padded module call).

    Args:
        module: :class:`~geograph.Maniscope` or :class:`~geograph.RicciFiltration`.
        encoder: embeds what has no embedding yet (a :class:`geograph.data.Encoder`, a callable
            ``texts -> (N, D)``); default the offline all-MiniLM-L6-v2.
        top_n: keep at most this many (``None``: all the method keeps).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    module: Any = Field(description="a geograph reranker")
    encoder: Any = Field(None, description="embeds texts without an embedding")
    top_n: int | None = Field(None, description="keep at most this many")
    _encoder: Any = PrivateAttr(None)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check_top(self.top_n, "top_n")

    @classmethod
    def class_name(cls) -> str:
        return "GeographPostprocessor"

    def _enc(self):
        return resolve_encoder(self)

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("query_bundle is required (the query to rerank for)")
        if not nodes:
            return []
        if query_bundle.embedding is not None:
            q = torch.as_tensor([query_bundle.embedding], dtype=torch.float32)
        else:
            q = embed(self._enc(), [query_bundle.query_str], query=True).float()
        rows: list[torch.Tensor | None] = [
            None if n.node.embedding is None else torch.as_tensor(n.node.embedding, dtype=q.dtype) for n in nodes
        ]
        missing = [i for i, r in enumerate(rows) if r is None]
        if missing:
            vecs = embed(self._enc(), [nodes[i].node.get_content() for i in missing]).to(q)
            for i, v in zip(missing, vecs):
                rows[i] = v
        [ranked] = rerank(self.module, q, [torch.stack(rows)])
        return [NodeWithScore(node=nodes[j].node, score=s) for j, s in cut(ranked, self.top_n)]


class GeographRetriever(BaseRetriever):
    """Retrieve from a corpus of nodes with ISO-RAG / G3RAG (any ``module(query (B, D), k)``).

    Args:
        module: :class:`~geograph.ISORetriever`, :class:`~geograph.G3Retriever`, or
            :class:`~geograph.retrievers.DenseRetriever`, built over the corpus embeddings.
        nodes: the corpus as nodes (or strings), row ``i`` of the module's corpus first.
        encoder: embeds query texts (the corpus's model) when the bundle has no embedding.
        k: nodes per query (G3: at least its ``seeds``).
    """

    def __init__(self, module, nodes: Sequence[Any], *, encoder: Any = None, k: int = 4, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.module, self.encoder, self.k = module, encoder, check_top(k, "k")
        self.nodes: list[BaseNode] = [TextNode(text=n) if isinstance(n, str) else n for n in nodes]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if query_bundle.embedding is not None:
            q = torch.as_tensor([query_bundle.embedding], dtype=torch.float32)
        else:
            if self.encoder is None:
                self.encoder = default_encoder()
            q = embed(self.encoder, [query_bundle.query_str], query=True).float()
        [ranked] = retrieve(self.module, q, self.k)
        return [NodeWithScore(node=self.nodes[j], score=s) for j, s in ranked]
