"""Evaluate runs against qrels with the batched metrics of :mod:`geograph.ops.ranking_metrics`."""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from geograph.ops.ranking_metrics import (
    hit_all_at_k,
    hit_answer_at_k,
    mrr_at_k,
    ndcg_at_k,
    precision_at_k,
    recall_at_k,
)

__all__ = [
    "relevance_tensors",
    "evaluate",
    "per_query",
    "paired_bootstrap",
    "normalize_answer",
    "answer_hits",
    "METRICS",
    "ANSWER_METRICS",
]

METRICS = {
    "nDCG": lambda g, r, k: ndcg_at_k(g, r, k),
    "Recall": lambda g, r, k: recall_at_k(g, r, k),
    "P": lambda g, r, k: precision_at_k(g, k),
    "MRR": lambda g, r, k: mrr_at_k(g, k),
    "HitAll": lambda g, r, k: hit_all_at_k(g, r, k),
}
#: metrics over answer strings (they need ``passages`` and ``answers``), ``(contains (B, K), k)``
ANSWER_METRICS = {"HitAns": hit_answer_at_k}

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans({c: " " for c in string.punctuation})


def normalize_answer(text: str) -> str:
    """SQuAD-style answer normalisation: lower case, punctuation and the articles a/an/the removed,
    whitespace collapsed.

    Example:
        >>> normalize_answer("The  G. Stanley-Hall!")
        'g stanley hall'
    """
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def answer_hits(
    run: Sequence[Sequence[str]],
    passages: Mapping[str, str] | Callable[[str], str],
    answers: Sequence[Sequence[str]],
) -> Tensor:
    """``contains (B, K)`` bool: the passage at each rank contains the query's answer or an alias.

    A passage contains an answer when the normalised answer (:func:`normalize_answer`) occurs in
    the normalised passage as a whole-token sequence ("35" matches "35 stores", not "1935").
    A query without answers never hits.

    Args:
        run: for each query, the retrieved ids best first.
        passages: id -> passage text (title and text, as embedded), a mapping or a callable.
        answers: for each query, its answer strings (answer and aliases).

    Returns:
        ``(B, K)`` bool, padded with False.

    Example:
        >>> answer_hits([["a", "b"]], {"a": "Born in 1935.", "b": "It has 35 stores."}, [["35"]]).tolist()
        [[False, True]]
    """
    if len(run) != len(answers):
        raise ValueError(f"run has {len(run)} queries but answers has {len(answers)}")
    text = passages.__getitem__ if isinstance(passages, Mapping) else passages
    k = max((len(r) for r in run), default=0)
    out = torch.zeros(len(run), k, dtype=torch.bool)
    for i, (ids, ans) in enumerate(zip(run, answers)):
        norm = [f" {a} " for a in {normalize_answer(a) for a in ans} if a]
        if not norm:
            continue
        for rank, doc in enumerate(ids):
            body = f" {normalize_answer(text(doc))} "
            out[i, rank] = any(a in body for a in norm)
    return out


def relevance_tensors(run: Sequence[Sequence[str]], qrels: Sequence[Mapping[str, float]]) -> tuple[Tensor, Tensor]:
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


def per_query(
    run: Sequence[Sequence[str]],
    qrels: Sequence[Mapping[str, float]],
    metrics: Iterable[str] = ("nDCG@10", "Recall@10"),
    *,
    passages: Mapping[str, str] | Callable[[str], str] | None = None,
    answers: Sequence[Sequence[str]] | None = None,
) -> dict[str, Tensor]:
    """Each metric per query: ``{name: (Q,) float64}`` (the inputs of a paired test).

    ``HitAns@k`` (an answer string in the top k, :func:`answer_hits`) needs ``passages`` and
    ``answers``; the other metrics read the qrels.

    Example:
        >>> per_query([["a", "b"], ["b"]], [{"b": 1}, {"b": 1}], ["MRR@2"])["MRR@2"].tolist()
        [0.5, 1.0]
        >>> per_query([["a", "b"]], [{"b": 1}], ["HitAns@1", "HitAns@2"], passages={"a": "x", "b": "Paris"},
        ...           answers=[["paris"]])
        {'HitAns@1': tensor([0.], dtype=torch.float64), 'HitAns@2': tensor([1.], dtype=torch.float64)}
    """
    if not run:
        raise ValueError("run is empty: nothing to evaluate")
    gains, relevant = relevance_tensors(run, qrels)
    contains = None
    out = {}
    for name in metrics:
        metric, _, k = name.partition("@")
        if (metric not in METRICS and metric not in ANSWER_METRICS) or not k.isdigit():
            raise ValueError(f"unknown metric {name!r}; use one of {sorted(METRICS) + sorted(ANSWER_METRICS)} with @k")
        if metric in ANSWER_METRICS:
            if passages is None or answers is None:
                raise ValueError(f"{name} needs passages and answers (the data set has no answer strings)")
            if contains is None:
                contains = answer_hits(run, passages, answers)
            out[name] = ANSWER_METRICS[metric](contains, int(k))
        else:
            out[name] = METRICS[metric](gains, relevant, int(k))
    return out


def evaluate(
    run: Sequence[Sequence[str]],
    qrels: Sequence[Mapping[str, float]],
    metrics: Iterable[str] = ("nDCG@10", "Recall@10"),
    **answer_inputs: Any,
) -> dict[str, float]:
    """Mean of each metric (``"nDCG@10"``, ``"Recall@5"``, ``"P@1"``, ``"MRR@10"``, ``"HitAll@5"``,
    ``"HitAns@5"`` with ``passages=`` and ``answers=`` as in :func:`per_query`).

    Example:
        >>> evaluate([["a", "b"]], [{"b": 1}], ["nDCG@2", "MRR@2", "HitAll@1"])
        {'nDCG@2': 0.6309..., 'MRR@2': 0.5, 'HitAll@1': 0.0}
    """
    return {name: float(v.mean()) for name, v in per_query(run, qrels, metrics, **answer_inputs).items()}


def paired_bootstrap(
    method: Tensor, baseline: Tensor, *, samples: int = 10000, level: float = 0.95, seed: int = 0
) -> dict[str, float]:
    """Paired bootstrap of the mean per-query difference ``method - baseline``.

    Queries are resampled with replacement ``samples`` times (the same resample for both
    systems, which is what makes it paired); the interval is the percentile interval of the
    resampled means.

    Args:
        method, baseline: ``(Q,)`` per-query values of one metric on the same queries.
        samples: bootstrap resamples.
        level: coverage of the interval.
        seed: of the resampling generator (results are reproducible).

    Returns:
        ``{"diff", "low", "high", "p_le_0", "queries"}``: the observed mean difference, the
        interval, and the share of resamples whose mean difference is <= 0.

    Example:
        >>> r = paired_bootstrap(torch.tensor([1., 1., 0.]), torch.tensor([0., 1., 0.]), samples=2000)
        >>> round(r["diff"], 4), r["low"] >= 0.0, r["high"] <= 1.0
        (0.3333, True, True)
    """
    a = torch.as_tensor(method, dtype=torch.float64).flatten()
    b = torch.as_tensor(baseline, dtype=torch.float64).flatten()
    if a.shape != b.shape or a.numel() == 0:
        raise ValueError(
            f"method and baseline need the same non-zero number of queries, got {a.numel()} and {b.numel()}"
        )
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if int(samples) < 1:
        raise ValueError(f"samples must be a positive integer, got {samples!r}")
    d = a - b
    g = torch.Generator().manual_seed(int(seed))
    means = torch.empty(int(samples), dtype=torch.float64)
    chunk = max(1, 2**22 // d.numel())
    for s in range(0, int(samples), chunk):
        n = min(chunk, int(samples) - s)
        idx = torch.randint(d.numel(), (n, d.numel()), generator=g)
        means[s : s + n] = d[idx].mean(1)
    tail = (1.0 - level) / 2
    lo, hi = torch.quantile(means, torch.tensor([tail, 1.0 - tail], dtype=torch.float64)).tolist()
    return {
        "diff": float(d.mean()),
        "low": lo,
        "high": hi,
        "p_le_0": float((means <= 0).double().mean()),
        "queries": int(d.numel()),
    }
