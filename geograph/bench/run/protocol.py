"""The protocol: tune on one split, report on the other, compare with dense, time everything."""

from __future__ import annotations

import datetime
import os
import platform
from typing import Any

import torch
from torch import Tensor

from geograph.bench.common import time_calls, tuning_split
from geograph.bench.run.config import dataset_root, grid_points
from geograph.bench.run.methods import (
    LABELS,
    METHODS,
    Context,
    Dense,
    Method,
    Ranker,
    Reference,
    chain_ranker,
    chain_reference,
)
from geograph.evaluation import ANSWER_METRICS, paired_bootstrap, per_query
from geograph.pipeline import dense_candidates, run_ids


def _batched(ranker: Ranker, query: Tensor, cands: Tensor, batch: int = 64) -> tuple[Tensor, Tensor]:
    outs = [ranker(query[s : s + batch], cands[s : s + batch]) for s in range(0, query.shape[0], batch)]
    width = max(o[0].shape[1] for o in outs)

    def pad(t: Tensor, v: float) -> Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=v)

    return torch.cat([pad(o[0], 0) for o in outs]), torch.cat([pad(o[1].double(), float("-inf")) for o in outs])


def answers_of(dataset: Any) -> list[list[str]] | None:
    """Each query's answer strings (``answer`` and ``answer_aliases`` of queries.jsonl), or None
    when the data set carries no answers."""
    fields = getattr(dataset, "query_fields", None) or {}
    if not any("answer" in fields.get(q, {}) for q in dataset.query_ids):
        return None
    out = []
    for q in dataset.query_ids:
        f = fields.get(q, {})
        ans = f.get("answer")
        out.append(([ans] if isinstance(ans, str) and ans else []) + list(f.get("answer_aliases") or []))
    return out


def applicable(metrics: list[str], dataset: Any) -> list[str]:
    """The metrics a data set supports: answer metrics (HitAns@k) only where queries carry answers."""
    has_answers = answers_of(dataset) is not None
    return [m for m in metrics if has_answers or m.partition("@")[0] not in ANSWER_METRICS]


def evaluate_run(dataset: Any, indices: Tensor, scores: Tensor, metrics: list[str]) -> dict[str, Tensor]:
    """Per-query metrics of a run (``-inf`` scores = not returned); HitAns@k reads the passage
    texts (title and text) and the queries' answers."""
    run = run_ids(dataset, indices, scores)
    metrics = list(metrics)
    extra: dict[str, Any] = {}
    if any(m.partition("@")[0] in ANSWER_METRICS for m in metrics):
        extra = {"passages": dict(zip(dataset.doc_ids, dataset.passages())), "answers": answers_of(dataset)}
    return per_query(run, dataset.qrels_list(), metrics, **extra)


def tune(
    ctx: Context, method: Method, cfg: dict[str, Any], metrics: list[str], primary: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Grid search on the tuning split by ``primary`` (then the other metrics, in order)."""
    order = [primary] + [m for m in metrics if m != primary]
    limit = cfg.get("tune_queries")
    sp = ctx.split
    q, c = sp.tune_q, ctx.tune_cands
    dataset = sp.tune
    if limit is not None and limit < q.shape[0]:
        q, c, dataset = q[:limit], c[:limit], sp.tune.query_range(0, limit)
    best: dict[str, Any] | None = None
    best_key: tuple[float, ...] | None = None
    scores: dict[str, float] = {}
    for params in grid_points(cfg.get("grid", {})):
        idx, sc = _batched(method.ranker(ctx, params, cfg), q, c)
        res = {m: float(v.mean()) for m, v in evaluate_run(dataset, idx, sc, order).items()}
        key = tuple(res[m] for m in order)
        if best_key is None or key > best_key:
            best, best_key, scores = params, key, res
    assert best is not None  # a grid has at least one point (grid_points)
    return best, {"queries": int(q.shape[0]), **scores}


def _ms(t: dict[str, float], per: int) -> dict[str, float]:
    """Seconds per call (``time_calls``) to ms per query: median, min, max, repeats."""
    return {
        "median": t["median"] / per * 1e3,
        "min": t["min"] / per * 1e3,
        "max": t["max"] / per * 1e3,
        "repeat": t["repeat"],
    }


def speed(
    ranker: Ranker,
    reference: Reference | None,
    query: Tensor,
    cands: Tensor,
    cfg: dict[str, Any],
    ref_queries: int,
    k: int,
) -> dict[str, Any]:
    """ms/query at B = 1 and B = batch, and of the reference, with ratios and their spread.

    Every timing is warmed up (one call, or the reference's first query, outside the timing)
    and repeated ``cfg["repeat"]`` times (``reference_repeat`` for the reference), stopping
    early, after at least 3, once ``min_time`` (``reference_min_time``) seconds of work are done.
    Reported: the median, with ``*_min``/``*_max`` over the repeats; the ratio's range pairs
    the slowest reference repeat with our fastest one and vice versa. On the reference's
    queries, the share whose top-``k`` ids equal the reference's.
    """
    b = min(cfg["batch"], query.shape[0])
    single = min(cfg["single"], query.shape[0])
    qb, cb = query[:b], cands[:b]
    rep = dict(repeat=cfg["repeat"], min_time=cfg["min_time"], warmup=1)
    t_b = _ms(time_calls(lambda: ranker(qb, cb), **rep), b)
    t_1 = _ms(time_calls(lambda: [ranker(query[i : i + 1], cands[i : i + 1]) for i in range(single)], **rep), single)
    out: dict[str, Any] = {
        "batch": b,
        "single": single,
        "B1_ms": t_1["median"],
        "B1_ms_min": t_1["min"],
        "B1_ms_max": t_1["max"],
        "B1_repeats": t_1["repeat"],
        "Bbatch_ms": t_b["median"],
        "Bbatch_ms_min": t_b["min"],
        "Bbatch_ms_max": t_b["max"],
        "Bbatch_repeats": t_b["repeat"],
    }
    if reference is not None and ref_queries > 0:
        n = min(ref_queries, query.shape[0])
        reference(query[0], cands[0])  # imports and first-call set-up stay out of the timing
        got: list[Any] = []

        def one_pass() -> None:
            got.clear()
            got.extend(reference(query[i], cands[i]) for i in range(n))

        t_r = _ms(time_calls(one_pass, repeat=cfg["reference_repeat"], min_time=cfg["reference_min_time"], warmup=0), n)
        idx, sc = ranker(query[:n], cands[:n])
        ours = [[i for i, ok in zip(r, f) if ok][:k] for r, f in zip(idx.tolist(), torch.isfinite(sc).tolist())]
        same = sum(list(map(int, ref[:k])) == o for ref, o in zip(got, ours))
        out.update(
            reference_ms=t_r["median"],
            reference_ms_min=t_r["min"],
            reference_ms_max=t_r["max"],
            reference_repeats=t_r["repeat"],
            reference_queries=n,
            reference_top_k_identical=same / n,
        )
        for tag in ("B1", "Bbatch"):
            out[f"speedup_{tag}"] = out["reference_ms"] / out[f"{tag}_ms"]
            out[f"speedup_{tag}_min"] = out["reference_ms_min"] / out[f"{tag}_ms_max"]
            out[f"speedup_{tag}_max"] = out["reference_ms_max"] / out[f"{tag}_ms_min"]
    return out


def environment() -> dict[str, Any]:
    """Where the run happened: date, commit, versions, CPU and thread counts."""
    from geograph.bench.common import commit as checkout_commit

    commit = checkout_commit()
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "cpu_count": os.cpu_count(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "device": "cpu",
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "commit": commit,
    }


def run(
    cfg: dict[str, Any], *, progress: bool = True, cache: str | None = None, encoder: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Run the benchmark of ``cfg`` (see :func:`~geograph.bench.run.config.load_config`); returns the results dict.

    ``encoder``: :class:`~geograph.data.Encoder` keyword arguments (``model``, ``query_prefix``,
    ``passage_prefix``; default the offline all-MiniLM-L6-v2); its identity is recorded in the results.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from geograph.data import Encoder

    k = max(int(m.partition("@")[2]) for m in cfg["metrics"])
    enc = Encoder(cache=cache or cfg.get("cache"), progress=False, **(encoder or {}))
    rows: list[tuple[str, list[str] | None]] = [("dense", None)] + [(m, None) for m in cfg["methods"]]
    rows += [("+".join(c), c) for c in cfg["chains"]]
    results: dict[str, Any] = {
        "config": cfg,
        "environment": environment(),
        "encoder": enc.identity.as_dict(),
        "datasets": {},
    }
    columns = (TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, disable=not progress, transient=False) as bar:
        task = bar.add_task("bench", total=len(cfg["datasets"]) * len(rows))
        for entry in cfg["datasets"]:
            name, root = dataset_root(entry)
            bar.update(task, description=f"[{name}] embedding (cached)")
            sp = tuning_split(name, root, enc)
            metrics = applicable(list(cfg["metrics"]), sp.test)
            m = min(cfg["candidates"], sp.corpus.shape[0])
            ctx = Context(
                name,
                sp,
                m,
                dense_candidates(sp.corpus, sp.tune_q, m).indices,
                dense_candidates(sp.corpus, sp.report_q, m).indices,
            )
            primary = entry["primary"]
            out: dict[str, Any] = {
                "root": str(root),
                "protocol": sp.protocol,
                "primary": primary,
                "candidates": m,
                "metrics": metrics,
                "queries_tuned": len(sp.tune.queries),
                "queries_reported": len(sp.report.queries),
                "corpus": int(sp.corpus.shape[0]),
                "methods": {},
            }
            per_q: dict[str, dict[str, Tensor]] = {}
            tuned: dict[str, dict[str, Any]] = {}
            reference: Reference | None
            for key, chain in rows:
                label = " -> ".join(LABELS[s] for s in chain) if chain else LABELS[key]
                mcfg = {"k": k, **(cfg["methods"].get(key) or {})} if not chain else {}
                if chain:
                    stages = [METHODS[s].ranker(ctx, tuned[s], {"k": k, **cfg["methods"][s]}) for s in chain]
                    ranker = chain_ranker(stages)
                    refs = [METHODS[s].reference(ctx, tuned[s], {"k": k, **cfg["methods"][s]}) for s in chain]
                    reference = chain_reference([r for r in refs if r is not None]) if None not in refs else None
                    params, tuning = {s: tuned[s] for s in chain}, {"note": "each stage's tuned values"}
                    ref_n = min(cfg["methods"][s].get("reference_queries", 16) for s in chain)
                    ref_name = " + ".join(str(METHODS[s].reference_name) for s in chain)
                    kind = "rerank"
                elif key == "dense":
                    ranker, reference, params, tuning, ref_n, ref_name, kind = (
                        Dense().ranker(ctx, {}, {}),
                        None,
                        {},
                        {},
                        0,
                        None,
                        "retrieve",
                    )
                else:
                    method = METHODS[key]
                    bar.update(task, description=f"[{name}] {label}: tuning")
                    params, tuning = tune(ctx, method, mcfg, metrics, primary)
                    tuned[key] = params
                    ranker = method.ranker(ctx, params, mcfg)
                    reference = method.reference(ctx, params, mcfg)
                    ref_n, ref_name, kind = mcfg.get("reference_queries", 16), method.reference_name, method.kind
                bar.update(task, description=f"[{name}] {label}: report")
                idx, sc = _batched(ranker, sp.report_q, ctx.report_cands)
                per_q[label] = evaluate_run(sp.report, idx, sc, metrics)
                row: dict[str, Any] = {
                    "method": key,
                    "kind": kind,
                    "params": params,
                    "tuning": tuning,
                    "metrics": {mm: float(v.mean()) for mm, v in per_q[label].items()},
                    "mean_returned": float(torch.isfinite(sc).sum(1).double().mean()),
                }
                if label != "dense":
                    row["vs_dense"] = {
                        mm: paired_bootstrap(per_q[label][mm], per_q["dense"][mm], **cfg["bootstrap"]) for mm in metrics
                    }
                bar.update(task, description=f"[{name}] {label}: speed")
                row["speed"] = speed(ranker, reference, sp.report_q, ctx.report_cands, cfg["speed"], ref_n, k)
                row["speed"]["reference"] = ref_name
                out["methods"][label] = row
                bar.advance(task)
            results["datasets"][name] = out
    return results
