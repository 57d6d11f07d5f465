"""G3RAG: one-step diffusion from seeds over the zero-token geometric-gain graph."""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from geograph._checks import check_finite_where, check_positive_int, check_tensor
from geograph.functional.gain import check_band, csr, gain_density, gain_transition
from geograph.functional.similarity import normalize
from geograph.outputs import RetrievalOutput
from geograph.retrievers.dense import DenseRetriever

__all__ = ["G3Graph", "G3Retriever"]

_FORMAT = 1


class G3Graph:
    """Passage embeddings and G3RAG's sparse transition matrix ``T`` (see :func:`~geograph.functional.gain_transition`).

    Embeddings are L2-normalised when the graph is built (stored as given).

    Attributes:
        embeddings: ``(N, D)``.
        transition: sparse CSR ``(N, N)``, rows sum to 1 (0 for a passage with no edge).
        density: ``(N,)`` normalised density ``rho``.
        band, beta, max_degree: the build parameters.

    Example:
        >>> x = torch.nn.functional.normalize(torch.randn(50, 8, generator=torch.Generator().manual_seed(0)), dim=1)
        >>> g = G3Graph.build(x, max_degree=4)
        >>> g.transition.shape, bool((g.degree() <= 4).all())
        (torch.Size([50, 50]), True)
    """

    def __init__(self, embeddings: Tensor, transition: Tensor, density: Tensor, *, band, beta: float,
                 max_degree: Optional[int]) -> None:
        self.embeddings = embeddings
        self.transition = transition
        self.density = density
        self.band = band
        self.beta = float(beta)
        self.max_degree = max_degree

    @classmethod
    def build(cls, embeddings: Tensor, *, band: Optional[tuple[float, float]] = (0.1, 0.7), beta: float = 0.4,
              max_degree: Optional[int] = None, block: Optional[int] = None) -> "G3Graph":
        """Build blockwise: memory ``O(block x N + N x max_degree)`` (``band=None``: the authors' T).

        ``block`` rows per similarity block; default ``2^26 // N`` (about 256 MB per block in
        float32, whatever N).
        """
        band = check_band(band)
        rho = gain_density(embeddings, block=block)
        t = gain_transition(embeddings, band=band, beta=beta, max_degree=max_degree, block=block, density=rho)
        return cls(embeddings, t, rho, band=band, beta=beta, max_degree=max_degree)

    @property
    def num_nodes(self) -> int:
        return int(self.embeddings.shape[0])

    def degree(self) -> Tensor:
        """Out-degree of every passage in ``T``."""
        crow = self.transition.crow_indices()
        return crow[1:] - crow[:-1]

    def save(self, directory: Union[str, Path]) -> Path:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        t = self.transition
        torch.save({"embeddings": self.embeddings.cpu(), "density": self.density.cpu(),
                    "crow": t.crow_indices().cpu(), "col": t.col_indices().cpu(), "val": t.values().cpu()},
                   path / "g3graph.pt")
        meta = {"format": _FORMAT, "band": self.band, "beta": self.beta, "max_degree": self.max_degree,
                "num_nodes": self.num_nodes, "nnz": int(t.values().numel())}
        (path / "g3graph.json").write_text(json.dumps(meta, indent=2))
        return path

    @classmethod
    def load(cls, directory: Union[str, Path], *, device: Optional[Union[str, torch.device]] = None) -> "G3Graph":
        path = Path(directory)
        if not (path / "g3graph.json").is_file():
            raise ValueError(f"{path} is not a saved G3Graph (no g3graph.json)")
        meta = json.loads((path / "g3graph.json").read_text())
        if meta.get("format") != _FORMAT:
            raise ValueError(f"{path}: unsupported G3Graph format {meta.get('format')!r}")
        blob = torch.load(path / "g3graph.pt", map_location=device or "cpu", weights_only=True)
        n = meta["num_nodes"]
        t = csr(blob["crow"], blob["col"], blob["val"], n)
        band = tuple(meta["band"]) if meta["band"] is not None else None
        return cls(blob["embeddings"], t, blob["density"], band=band, beta=meta["beta"], max_degree=meta["max_degree"])

    def __repr__(self) -> str:
        return (f"G3Graph(nodes={self.num_nodes}, nnz={int(self.transition.values().numel())}, band={self.band}, "
                f"beta={self.beta}, max_degree={self.max_degree})")


SeedScorer = Callable[..., Tensor]


class G3Retriever(nn.Module):
    r"""G3RAG retrieval: dense candidates, seeds, one diffusion step over ``T``, seeds first.

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

    Compilation: runs under ``torch.compile`` with the same output (tested), but dynamo
    cannot trace sparse CSR tensors, so the graph breaks there and the sparse product runs
    eagerly; ``torch.export`` fails for the same reason. Densify ``graph.transition`` for a
    small corpus if a captured graph is needed.

    Args:
        graph_or_embeddings: a :class:`G3Graph`, or ``(N, D)`` embeddings to build one from with
            ``band``, ``beta``, ``max_degree``.
        candidates: dense candidates per query.
        seeds: seeds kept per query.
        beta, band, max_degree: used only when building from embeddings.

    References:
        G3RAG (../shared/papers/g3rag.txt).

    Example:
        >>> x = torch.nn.functional.normalize(torch.randn(40, 8, generator=torch.Generator().manual_seed(0)), dim=1)
        >>> out = G3Retriever(x)(x[:3], k=5)
        >>> out.indices[:, 0].tolist()  # each passage is its own best seed
        [0, 1, 2]
    """

    def __init__(self, graph_or_embeddings: Union[G3Graph, Tensor], *, candidates: int = 10, seeds: int = 2,
                 beta: float = 0.4, band: Optional[tuple[float, float]] = (0.1, 0.7),
                 max_degree: Optional[int] = None) -> None:
        super().__init__()
        if isinstance(graph_or_embeddings, G3Graph):
            graph = graph_or_embeddings
        elif isinstance(graph_or_embeddings, Tensor):
            graph = G3Graph.build(graph_or_embeddings, band=band, beta=beta, max_degree=max_degree)
        else:
            raise ValueError(f"expected a G3Graph or an (N, D) tensor, got {type(graph_or_embeddings).__name__}")
        self.graph = graph
        self.candidates = check_positive_int(candidates, "candidates")
        self.seeds = check_positive_int(seeds, "seeds")
        if self.seeds > self.candidates:
            raise ValueError(f"seeds ({seeds}) must not exceed candidates ({candidates})")
        if self.candidates > graph.num_nodes:
            raise ValueError(f"candidates ({candidates}) exceeds the corpus size {graph.num_nodes}")
        self.dense = DenseRetriever(graph.embeddings)  # holds the unit embeddings
        t = graph.transition
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            self._t_transposed = t.to_sparse_coo().t().coalesce().to_sparse_csr()

    def forward(self, query: Tensor, k: int = 5, seed_scorer: Optional[SeedScorer] = None,
                query_texts: Optional[Sequence[str]] = None) -> RetrievalOutput:
        check_tensor(query, "query", 2, finite=False)
        check_finite_where(query, None, "query")
        k = check_positive_int(k, "k")
        n = self.graph.num_nodes
        if k < self.seeds:
            raise ValueError(f"k ({k}) must be at least seeds ({self.seeds}): the seeds come first")
        if k > n:
            raise ValueError(f"k ({k}) exceeds the corpus size {n}")
        if query.shape[1] != self.graph.embeddings.shape[1]:
            raise ValueError(f"query must have shape (B, D={self.graph.embeddings.shape[1]}), got {tuple(query.shape)}")
        b = query.shape[0]
        # one (B, N) cosine matrix serves the candidates and the top-up
        cos_all = normalize(query.to(self.dense.embeddings.dtype)) @ self.dense.embeddings.T
        cand_scores, cand_ids = cos_all.topk(self.candidates, dim=1)
        if seed_scorer is None:
            seed_score = cand_scores
        else:
            seed_score = torch.as_tensor(seed_scorer(query, cand_ids, query_texts)).to(cand_scores)
            if tuple(seed_score.shape) != tuple(cand_ids.shape):
                raise ValueError(f"seed_scorer returned shape {tuple(seed_score.shape)}, expected {tuple(cand_ids.shape)}")
        top_seed, pos = torch.sort(seed_score, dim=1, descending=True, stable=True)
        seeds = cand_ids.gather(1, pos[:, : self.seeds])
        seed_vals = top_seed[:, : self.seeds]
        # one sparse product for the batch: y^T = T^T p^T with p uniform on the seeds
        dtype = self.graph.transition.dtype
        p = torch.zeros(n, b, dtype=dtype, device=query.device)
        p.scatter_(0, seeds.T, 1.0 / self.seeds)
        y = (self._t_transposed @ p).T  # (B, N)
        y = y.scatter(1, seeds, float("-inf"))
        m = k - self.seeds
        if m == 0:
            return RetrievalOutput(indices=seeds, scores=seed_vals)
        y_val, y_idx = y.topk(m, dim=1)
        positive = y_val > 0
        # top-up order: remaining candidates by cosine, then the rest of the corpus by cosine
        taken = torch.zeros(b, n, dtype=torch.bool, device=query.device)
        taken.scatter_(1, seeds, True)
        taken.scatter_(1, torch.where(positive, y_idx, seeds[:, :1].expand_as(y_idx)), True)
        bonus = torch.zeros(b, n, dtype=cos_all.dtype, device=query.device).scatter(1, cand_ids, 4.0)
        fill_val, fill_idx = torch.where(taken, torch.full_like(cos_all, float("-inf")), cos_all + bonus).topk(m, dim=1)
        # diffused passages first (already sorted by y), then the fill, per row
        n_pos = positive.sum(1, keepdim=True)
        slot = torch.arange(m, device=query.device).unsqueeze(0)
        fill_pos = (slot - n_pos).clamp_min(0)
        idx = torch.where(slot < n_pos, y_idx, fill_idx.gather(1, fill_pos))
        fill_score = (fill_val.gather(1, fill_pos) - bonus.gather(1, fill_idx.gather(1, fill_pos))).to(y_val.dtype)
        val = torch.where(slot < n_pos, y_val, fill_score)
        return RetrievalOutput(indices=torch.cat([seeds, idx], 1), scores=torch.cat([seed_vals.to(val.dtype), val], 1))

    def extra_repr(self) -> str:
        return f"{self.graph!r}, candidates={self.candidates}, seeds={self.seeds}"
