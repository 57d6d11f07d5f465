"""G3RAG: one-step diffusion from seeds over the zero-token geometric-gain graph (:class:`G3Graph`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor, nn

from geograph.graphs.g3_graph import DEFAULT_MAX_DEGREE, G3Graph
from geograph.graphs.g3_updates import G3UpdateReport
from geograph.graphs.updates import PassageId, passage_ids
from geograph.methods.dense.module import DenseRetriever
from geograph.methods.g3.functional import _retrieve, check_g3_options
from geograph.outputs import RetrievalOutput

__all__ = ["G3Retriever"]


SeedScorer = Callable[..., Tensor]


class G3Retriever(nn.Module):
    r"""G3RAG retrieval: dense candidates, seeds, one diffusion step over ``T``, seeds first.

    A holder of the graph and the hyperparameters: :meth:`forward` calls
    :func:`geograph.functional.g3_retrieve`'s body, the method's one home (bitwise the same result).
    Per query (the whole batch at once): dense top-``candidates``; the ``seed_scorer`` (default:
    cosine) keeps the best ``seeds`` of them; ``p`` is uniform on the seeds and ``y = p T`` (one
    sparse-dense product for the batch); seeds are masked out of ``y`` and the ``k - seeds``
    passages of largest positive ``y`` follow the seeds; when fewer than ``k - seeds`` have
    ``y > 0`` the rest is topped up with the best-cosine candidates not yet chosen (then the
    best-cosine passages of the corpus if the candidates run out).

    A seed scorer is called as ``seed_scorer(query, candidate_ids, query_texts)`` and returns
    ``(B, C)`` scores (higher = better): any callable of that shape, e.g.
    :meth:`geograph.CrossEncoderScorer.for_corpus` (the paper uses an LLM).

    ``scores`` of the output hold the value of the stage that picked each passage: the seed
    score for seeds, ``y`` for diffused passages, cosine for top-ups. The order is by position.

    The diffusion reads only the seeds' rows of ``T`` (gathered from the CSR buffers into a
    ``(B, seeds, row_width)`` block and scattered into ``y``): no sparse kernel, no host read.
    Ties: equal scores at every stage go to the lowest corpus index
    (:func:`~geograph.outputs.topk_stable`).

    State: the graph is a submodule, so ``state_dict()`` carries it; the dense index over its
    embeddings is derived, not saved, and rebuilt after every ``load_state_dict`` of the
    retriever (a load hook): a retriever loaded with another's state answers exactly like it.

    Device and dtype: the graph is a submodule (``.to()`` moves it); a query on another device
    raises a ``ValueError`` naming both; the query is scored in the corpus's dtype and the
    returned scores have the query's floating dtype. ``torch.compile(model, fullgraph=True)``
    gives the same output (tested; a custom ``seed_scorer`` may add graph breaks);
    ``torch.export`` does not work yet (its unflattening fails on the graph submodule's buffers).

    Args:
        graph_or_embeddings: a :class:`G3Graph`, or ``(N, D)`` embeddings to build one from with
            ``band``, ``beta``, ``max_degree``.
        candidates: dense candidates per query.
        seeds: seeds kept per query.
        beta, band, max_degree: used only when building from embeddings (``max_degree``:
            see :meth:`G3Graph.build`; ``None`` = the authors' full T).

    References:
        G3RAG: Beyond Similarity through Zero-Token Geometric Graphs for Multi-Hop RAG (no arXiv
        id or venue known to us).

    Example:
        >>> x = torch.nn.functional.normalize(torch.randn(40, 8, generator=torch.Generator().manual_seed(0)), dim=1)
        >>> out = G3Retriever(x)(x[:3], k=5)
        >>> out.indices[:, 0].tolist()  # each passage is its own best seed
        [0, 1, 2]
    """

    def __init__(
        self,
        graph_or_embeddings: G3Graph | Tensor,
        *,
        candidates: int = 10,
        seeds: int = 2,
        beta: float = 0.4,
        band: tuple[float, float] | None = (0.1, 0.7),
        max_degree: int | None = DEFAULT_MAX_DEGREE,
    ) -> None:
        super().__init__()
        if isinstance(graph_or_embeddings, G3Graph):
            graph = graph_or_embeddings
        elif isinstance(graph_or_embeddings, Tensor):
            graph = G3Graph.build(graph_or_embeddings, band=band, beta=beta, max_degree=max_degree)
        else:
            raise ValueError(f"expected a G3Graph or an (N, D) tensor, got {type(graph_or_embeddings).__name__}")
        self.graph = graph
        self.candidates, self.seeds = check_g3_options(candidates, seeds, graph.num_nodes)
        self.dense = DenseRetriever(graph.embeddings, persistent=False)  # the unit embeddings, derived from the graph
        self.register_load_state_dict_post_hook(_rebuild_dense_after_load)  # type: ignore[no-untyped-call]  # unannotated in torch

    def forward(
        self,
        query: Tensor,
        k: int = 5,
        seed_scorer: SeedScorer | None = None,
        query_texts: Sequence[str] | None = None,
    ) -> RetrievalOutput:
        g = self.graph
        return _retrieve(
            query,
            self.dense.embeddings,
            g.crow,
            g.col,
            g.val,
            k,
            candidates=self.candidates,
            seeds=self.seeds,
            row_width=g.row_width,
            seed_scorer=seed_scorer,
            query_texts=query_texts,
            owner="the G3Retriever",
        )

    @torch.no_grad()
    def add(self, embeddings: Tensor, ids: Sequence[PassageId]) -> G3UpdateReport:
        """Add passages to the graph in place (:meth:`G3Graph.add`); the dense index follows."""
        report = self.graph.add(embeddings, ids)
        self._follow()
        return report

    @torch.no_grad()
    def remove(self, ids: Iterable[PassageId] | PassageId) -> G3UpdateReport:
        """Remove passages from the graph in place (:meth:`G3Graph.remove`); the dense index follows.
        The corpus must keep at least ``candidates`` passages."""
        ids = [ids] if isinstance(ids, (str, int)) else list(ids)
        left = self.graph.num_nodes - int(passage_ids(self.graph).rows(ids).numel())
        if left < self.candidates:
            raise ValueError(f"ids: removing them leaves {left} passages, fewer than candidates={self.candidates}")
        report = self.graph.remove(ids)
        self._follow()
        return report

    def _follow(self) -> None:
        self.dense = DenseRetriever(self.graph.embeddings, chunk_size=self.dense.chunk_size, persistent=False)

    def extra_repr(self) -> str:
        return f"candidates={self.candidates}, seeds={self.seeds}"


def _rebuild_dense_after_load(module: G3Retriever, incompatible_keys: object) -> None:
    """``load_state_dict`` post hook: the dense index follows the loaded graph's embeddings."""
    module.dense = DenseRetriever(module.graph.embeddings, chunk_size=module.dense.chunk_size, persistent=False)
