"""G3RAG's query-time math: dense candidates, seeds, one diffusion step over ``T``, the top-up."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from geograph._checks import check_finite_where, check_positive_int, check_same_device, check_tensor
from geograph.ops.adjacency import csr_row_slots
from geograph.ops.similarity import normalize
from geograph.outputs import RetrievalOutput, topk_by_key, topk_stable

__all__ = ["g3_retrieve", "g3_diffuse", "g3_top_up", "check_g3_options"]


def check_g3_options(candidates: int, seeds: int, num_nodes: int) -> tuple[int, int]:
    """Validate G3RAG's ``candidates`` and ``seeds`` for a corpus of ``num_nodes``; returns them, or raises."""
    candidates = check_positive_int(candidates, "candidates")
    seeds = check_positive_int(seeds, "seeds")
    if seeds > candidates:
        raise ValueError(f"seeds ({seeds}) must not exceed candidates ({candidates})")
    if candidates > num_nodes:
        raise ValueError(f"candidates ({candidates}) exceeds the corpus size {num_nodes}")
    return candidates, seeds


def g3_diffuse(
    crow: Tensor, col: Tensor, val: Tensor, seeds: Tensor, row_width: int, dtype: torch.dtype | None = None
) -> Tensor:
    """``y = p T`` for ``p`` uniform on ``seeds (B, s)``: a gather of the seeds' CSR rows of ``T``, ``(B, N)``.

    Args:
        crow, col, val: ``T`` in CSR (``(N + 1,)``, ``(E,)``, ``(E,)``).
        seeds: ``(B, s)`` long corpus ids.
        row_width: at least the largest out-degree of ``T`` (a bound known a priori: no host read).
        dtype: of the all-zero result when ``row_width == 0`` (default: ``val``'s).

    Example:
        >>> crow, col, val = torch.tensor([0, 2, 3, 3]), torch.tensor([1, 2, 0]), torch.tensor([0.5, 0.5, 1.0])
        >>> g3_diffuse(crow, col, val, torch.tensor([[0, 1]]), 2)
        tensor([[0.5000, 0.2500, 0.2500]])
    """
    b, s = seeds.shape
    n = crow.shape[0] - 1
    if row_width == 0:
        return torch.zeros(b, n, dtype=val.dtype if dtype is None else dtype, device=seeds.device)
    at, ok = csr_row_slots(crow, seeds, row_width)
    v = val[at]
    v = torch.where(ok, v * (1.0 / s), torch.zeros_like(v))
    y = torch.zeros(b, n, dtype=v.dtype, device=v.device)
    return y.scatter_add_(1, col[at].flatten(1), v.flatten(1))


def g3_top_up(cos_all: Tensor, cand_ids: Tensor, seeds: Tensor, y: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """G3RAG's ``m`` passages after the seeds: the largest positive ``y``, then the top-up.

    ``y`` (the diffusion, ``-inf`` at the seeds) gives the passages of largest positive value,
    sorted; when fewer than ``m`` are positive the rest are the best-cosine candidates not yet
    chosen, then the best-cosine passages of the corpus (two rankings, so that no cosine is
    rounded by a bonus). Ties: lowest corpus id.

    Args:
        cos_all: ``(B, N)`` cosine of every passage to the query.
        cand_ids: ``(B, C)`` the dense candidates.
        seeds: ``(B, s)`` the seeds.
        y: ``(B, N)`` the diffusion with the seeds masked to ``-inf``.
        m: ``>= 1`` passages to pick.

    Returns:
        ``(indices, values)``, both ``(B, m)``: ``y`` for diffused passages, cosine for top-ups
        (in ``cos_all``'s dtype).
    """
    b, n = cos_all.shape
    y_val, y_idx = topk_stable(y, m)
    positive = y_val > 0
    taken = torch.zeros(b, n, dtype=torch.bool, device=cos_all.device)
    taken.scatter_(1, seeds, True)
    taken.scatter_(1, torch.where(positive, y_idx, seeds[:, :1].expand_as(y_idx)), True)
    is_cand = torch.zeros_like(taken).scatter_(1, cand_ids, True)
    ninf = torch.full_like(cos_all, float("-inf"))
    c_val, c_idx = topk_stable(torch.where(taken | ~is_cand, ninf, cos_all), min(m, cand_ids.shape[1]))
    _, r_idx = topk_stable(torch.where(taken | is_cand, ninf, cos_all), m)
    n_cand = torch.isfinite(c_val).sum(1, keepdim=True)
    slot = torch.arange(m, device=cos_all.device).unsqueeze(0).expand(b, -1)
    fill_idx = torch.where(
        slot < n_cand,
        c_idx.gather(1, slot.clamp_max(c_idx.shape[1] - 1)),
        r_idx.gather(1, (slot - n_cand).clamp_min(0)),
    )
    # diffused passages first (already sorted by y), then the fill, per row
    n_pos = positive.sum(1, keepdim=True)
    fill = fill_idx.gather(1, (slot - n_pos).clamp_min(0))
    idx = torch.where(slot < n_pos, y_idx, fill)
    val = torch.where(slot < n_pos, y_val.to(cos_all.dtype), cos_all.gather(1, fill))
    return idx, val


def g3_retrieve(
    query: Tensor,
    embeddings: Tensor,
    crow: Tensor,
    col: Tensor,
    val: Tensor,
    k: int = 5,
    *,
    candidates: int = 10,
    seeds: int = 2,
    row_width: int | None = None,
    seed_scorer: Callable[..., Tensor] | None = None,
    query_texts: Sequence[str] | None = None,
) -> RetrievalOutput:
    r"""G3RAG retrieval: the function :class:`~geograph.G3Retriever` calls (bitwise the same result).

    Dense top-``candidates`` by cosine; ``seed_scorer(query, candidate_ids, query_texts)``
    (default: the cosine) keeps the best ``seeds``; :func:`g3_diffuse`; then :func:`g3_top_up`
    for the ``k - seeds`` passages after the seeds.

    Args:
        query: ``(B, D)``.
        embeddings: ``(N, D)`` unit-norm passage embeddings.
        crow, col, val: ``T`` in CSR (:class:`~geograph.G3Graph` buffers).
        k: ``seeds <= k <= N``.
        row_width: the largest out-degree of ``T`` (``None``: read from ``crow``, a host read).

    Shape:
        ``indices (B, k)``, ``scores (B, k)`` in the query's floating dtype: the seed score for
        seeds, ``y`` for diffused passages, cosine for top-ups.

    Example:
        >>> from geograph import G3Retriever
        >>> x = torch.nn.functional.normalize(torch.randn(40, 8, generator=torch.Generator().manual_seed(0)), dim=1)
        >>> model = G3Retriever(x)
        >>> g = model.graph
        >>> out = g3_retrieve(x[:3], model.dense.embeddings, g.crow, g.col, g.val, 5)
        >>> ref = model(x[:3], k=5)
        >>> torch.equal(out.indices, ref.indices), torch.equal(out.scores, ref.scores)
        (True, True)
    """
    candidates, seeds = check_g3_options(candidates, seeds, embeddings.shape[0])
    if row_width is None:
        row_width = int((crow[1:] - crow[:-1]).max()) if crow.shape[0] > 1 else 0
    return _retrieve(
        query,
        embeddings,
        crow,
        col,
        val,
        k,
        candidates=candidates,
        seeds=seeds,
        row_width=row_width,
        seed_scorer=seed_scorer,
        query_texts=query_texts,
    )


def _retrieve(
    query: Tensor,
    embeddings: Tensor,
    crow: Tensor,
    col: Tensor,
    val: Tensor,
    k: int,
    *,
    candidates: int,
    seeds: int,
    row_width: int,
    seed_scorer: Callable[..., Tensor] | None,
    query_texts: Sequence[str] | None,
    owner: str = "the corpus",
) -> RetrievalOutput:
    """:func:`g3_retrieve` with validated options (the query and ``k`` are checked here)."""
    check_same_device(query, "query", crow.device, owner)
    check_tensor(query, "query", 2, finite=False)
    check_finite_where(query, None, "query")
    k = check_positive_int(k, "k")
    n = embeddings.shape[0]
    if k < seeds:
        raise ValueError(f"k ({k}) must be at least seeds ({seeds}): the seeds come first")
    if k > n:
        raise ValueError(f"k ({k}) exceeds the corpus size {n}")
    if query.shape[1] != embeddings.shape[1]:
        raise ValueError(f"query must have shape (B, D={embeddings.shape[1]}), got {tuple(query.shape)}")
    # one (B, N) cosine matrix serves the candidates and the top-up
    cos_all = normalize(query.to(embeddings.dtype)) @ embeddings.T
    cand_scores, cand_ids = topk_stable(cos_all, candidates)
    if seed_scorer is None:
        seed_score = cand_scores
    else:
        seed_score = torch.as_tensor(seed_scorer(query, cand_ids, query_texts)).to(cand_scores)
        if tuple(seed_score.shape) != tuple(cand_ids.shape):
            raise ValueError(f"seed_scorer returned shape {tuple(seed_score.shape)}, expected {tuple(cand_ids.shape)}")
    seed_vals, pos = topk_by_key(seed_score, cand_ids, seeds)
    seed_ids = cand_ids.gather(1, pos)
    m = k - seeds
    if m == 0:
        return RetrievalOutput(indices=seed_ids, scores=seed_vals.to(query.dtype))
    y = g3_diffuse(crow, col, val, seed_ids, row_width, embeddings.dtype)
    y = y.scatter(1, seed_ids, float("-inf"))
    idx, val_ = g3_top_up(cos_all, cand_ids, seed_ids, y, m)
    scores = torch.cat([seed_vals.to(val_.dtype), val_], 1).to(query.dtype)
    return RetrievalOutput(indices=torch.cat([seed_ids, idx], 1), scores=scores)
