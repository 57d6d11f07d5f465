"""Evaluate runs against qrels with the batched metrics of :mod:`geograph.functional.metrics`."""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import torch
from torch import Tensor

from geograph.functional.metrics import hit_all_at_k, mrr_at_k, ndcg_at_k, precision_at_k, recall_at_k

__all__ = ["relevance_tensors", "evaluate", "METRICS"]

METRICS = {
    "nDCG": lambda g, r, k: ndcg_at_k(g, r, k),
    "Recall": lambda g, r, k: recall_at_k(g, r, k),
    "P": lambda g, r, k: precision_at_k(g, k),
    "MRR": lambda g, r, k: mrr_at_k(g, k),
    "HitAll": lambda g, r, k: hit_all_at_k(g, r, k),
}


def relevance_tensors(
    run: Sequence[Sequence[str]], qrels: Sequence[Mapping[str, float]]
) -> tuple[Tensor, Tensor]:
    """Build ``gains (B, K)`` and ``relevant (B, R)`` from ranked ids and per-query judgements.

    Args:
        run: for each query, the retrieved ids best first (lists may differ in length; a
            repeated id counts once, at its first rank).
        qrels: for each query, ``{id: relevance}``; entries with relevance <= 0 are ignored.

    Returns:
        ``(gains, relevant)`` as float64, zero padded.
    """
    if len(run) != len(qrels):
        raise ValueError(f"run has {len(run)} queries but qrels has {len(qrels)}")
    b = len(run)
    k = max((len(r) for r in run), default=0)
    rel_lists = [[float(v) for v in q.values() if float(v) > 0] for q in qrels]
    r = max((len(x) for x in rel_lists), default=0)
    gains = torch.zeros(b, k, dtype=torch.float64)
    relevant = torch.zeros(b, max(r, 1), dtype=torch.float64)
    for i, (ids, judged) in enumerate(zip(run, qrels)):
        seen = set()
        for rank, doc in enumerate(ids):
            if doc not in seen:
                seen.add(doc)
                gains[i, rank] = max(float(judged.get(doc, 0.0)), 0.0)
        if rel_lists[i]:
            relevant[i, : len(rel_lists[i])] = torch.tensor(rel_lists[i], dtype=torch.float64)
    return gains, relevant


def evaluate(
    run: Sequence[Sequence[str]],
    qrels: Sequence[Mapping[str, float]],
    metrics: Iterable[str] = ("nDCG@10", "Recall@10"),
) -> dict[str, float]:
    """Mean of each metric (``"nDCG@10"``, ``"Recall@5"``, ``"P@1"``, ``"MRR@10"``, ``"HitAll@5"``).

    Example:
        >>> evaluate([["a", "b"]], [{"b": 1}], ["nDCG@2", "MRR@2", "HitAll@1"])
        {'nDCG@2': 0.6309..., 'MRR@2': 0.5, 'HitAll@1': 0.0}
    """
    if not run:
        raise ValueError("run is empty: nothing to evaluate")
    gains, relevant = relevance_tensors(run, qrels)
    out = {}
    for name in metrics:
        metric, _, k = name.partition("@")
        if metric not in METRICS or not k.isdigit():
            raise ValueError(f"unknown metric {name!r}; use one of {sorted(METRICS)} with @k")
        out[name] = float(METRICS[metric](gains, relevant, int(k)).mean())
    return out
