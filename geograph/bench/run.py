"""``geograph bench run --config configs/bench/<name>.yaml``: every method, every data set, one table.

For each labelled BEIR-format data set of the config (and any ``--data DIR`` given):

1. the corpus and queries are embedded once (through the on-disk cache) and split honestly
   (:func:`geograph.bench.common.tuning_split`: SciFact tuned on train and reported on test;
   a set without a train split tuned on the first half of its queries, reported on the rest);
2. every method's grid is searched on the tuning split by the data set's primary metric (the
   other metrics break ties), and the chosen values are saved;
3. on the reported split every method runs on the same dense top-``candidates`` lists
   (rerankers reorder them; ISO-RAG and G3RAG retrieve from the corpus, G3RAG from its own
   dense top-``g3.candidates``), and each method's per-query metrics are compared with dense
   by a paired bootstrap (95% interval of the mean difference);
4. speed in the same run: ms/query at B = 1 and B = ``speed.batch`` of each method (rerankers:
   the reranking of precomputed candidates; retrievers: query embedding to top-k), and of the
   slow reference where one exists (scipy Dijkstra for Maniscope, GraphRicciCurvature for
   Ricci-Filtration, numpy + networkx PageRank for ISO-RAG, dense numpy for G3RAG), with the ratio.

Writes ``results.json``, ``results.md`` and ``results.png`` (quality gain vs ms/query) under
``out`` and prints a table. Chains (e.g. ``[ricci, maniscope]``) run the stages in order with
each stage's tuned values: a stage's dropped candidates stay dropped.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from geograph.bench.common import DEFAULT_DATA, Split, time_calls, tuning_split
from geograph.metrics import paired_bootstrap, per_query
from geograph.pipeline import dense_candidates, run_ids

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "bench" / "default.yaml"
LABELS = {"dense": "dense", "maniscope": "Maniscope", "ricci": "Ricci-Filtration", "iso": "ISO-RAG",
          "iso_trained": "ISO-RAG + f_theta", "g3": "G3RAG"}
# a ranker maps (query (b, D), dense candidate indices (b, M)) to (corpus indices, scores), -inf = dropped
Ranker = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


# ---------------------------------------------------------------- configuration

def load_config(path: str | Path) -> dict:
    """Read a bench YAML config and check it (clear errors for unknown keys and methods)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"config {path} not found")
    cfg = yaml.safe_load(path.read_text()) or {}
    known = {"out", "candidates", "metrics", "bootstrap", "speed", "datasets", "methods", "chains", "cache"}
    unknown = set(cfg) - known
    if unknown:
        raise SystemExit(f"{path}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
    cfg.setdefault("out", "bench-results/run")
    cfg.setdefault("candidates", 20)
    cfg.setdefault("metrics", ["nDCG@10", "Recall@5", "Recall@10"])
    cfg.setdefault("bootstrap", {})
    cfg["bootstrap"] = {"samples": 10000, "seed": 0, **cfg["bootstrap"]}
    cfg["speed"] = {"batch": 64, "single": 16, "repeat": 3, **(cfg.get("speed") or {})}
    cfg.setdefault("datasets", [{"name": "scifact"}])
    cfg.setdefault("methods", {})
    cfg.setdefault("chains", [])
    bad = set(cfg["methods"]) - set(METHODS)
    if bad:
        raise SystemExit(f"{path}: unknown methods {sorted(bad)}; known: {sorted(METHODS)}")
    for chain in cfg["chains"]:
        if len(chain) < 2 or any(m not in cfg["methods"] or METHODS[m].kind != "rerank" for m in chain):
            raise SystemExit(f"{path}: chain {chain} must list >= 2 configured rerankers "
                             f"({[m for m, c in METHODS.items() if c.kind == 'rerank']})")
    for ds in cfg["datasets"]:
        if "name" not in ds and "path" not in ds:
            raise SystemExit(f"{path}: each data set needs a name (in ../shared/data) or a path")
        ds.setdefault("primary", cfg["metrics"][0])
        if ds["primary"] not in cfg["metrics"]:
            raise SystemExit(f"{path}: primary metric {ds['primary']!r} is not in metrics {cfg['metrics']}")
    return cfg


def dataset_root(entry: dict) -> tuple[str, Path]:
    """``(name, folder)`` of a config entry: ``name: demo`` is the shipped corpus, other names
    live in ../shared/data, ``path`` is any BEIR folder."""
    from geograph.data import DEMO_PATH

    if "path" in entry:
        root = Path(entry["path"])
        name = entry.get("name", root.name)
    else:
        name = entry["name"]
        root = DEMO_PATH if name == "demo" else DEFAULT_DATA / name
    if not (root / "corpus.jsonl").is_file():
        raise SystemExit(f"data set {name!r}: {root} is not a BEIR-format folder (no corpus.jsonl)")
    return name, root


def grid_points(grid: dict) -> list[dict]:
    """All combinations of a ``{name: [values]}`` grid (lists in YAML become tuples)."""
    if not grid:
        return [{}]
    names = list(grid)
    values = [[tuple(v) if isinstance(v, list) else v for v in grid[n]] for n in names]
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]


# ---------------------------------------------------------------- methods

@dataclass
class Context:
    """One data set: its split, the dense candidates of both halves, and built artefacts."""

    name: str
    split: Split
    candidates: int
    tune_cands: Tensor
    report_cands: Tensor
    cache: dict = field(default_factory=dict)

    @property
    def corpus(self) -> Tensor:
        return self.split.corpus


def _batched(ranker: Ranker, query: Tensor, cands: Tensor, batch: int = 64) -> tuple[Tensor, Tensor]:
    outs = [ranker(query[s : s + batch], cands[s : s + batch]) for s in range(0, query.shape[0], batch)]
    width = max(o[0].shape[1] for o in outs)
    pad = lambda t, v: torch.nn.functional.pad(t, (0, width - t.shape[1]), value=v)  # noqa: E731
    return torch.cat([pad(o[0], 0) for o in outs]), torch.cat([pad(o[1].double(), float("-inf")) for o in outs])


class Method:
    """A row of the table: a grid, a ranker per grid point and, where one exists, a reference."""

    kind = "rerank"
    reference_name: Optional[str] = None

    def ranker(self, ctx: Context, params: dict, cfg: dict) -> Ranker:
        raise NotImplementedError

    def reference(self, ctx: Context, params: dict, cfg: dict) -> Optional[Callable[[Tensor, Tensor], Any]]:
        """The slow reference for one query: ``(query (D,), candidate indices (M,))`` to the
        corpus indices it returns, best first (a 1-D int64 array)."""
        return None


class Dense(Method):
    def ranker(self, ctx, params, cfg):
        from geograph.retrievers import DenseRetriever

        model = DenseRetriever(ctx.corpus)

        def run(q, c):
            out = model(q, c.shape[1])
            return out.indices, out.scores

        return run


def reranker(model, corpus: Tensor) -> Ranker:
    """A reranking module as a ranker over candidate indices (with an optional mask, for chains)."""

    def run(q, c, mask=None):
        out = model(q, corpus[c], mask)
        return c.gather(1, out.order), out.scores.gather(1, out.order)

    return run


class ManiscopeMethod(Method):
    reference_name = "sklearn + scipy Dijkstra"

    def ranker(self, ctx, params, cfg):
        from geograph import Maniscope

        return reranker(Maniscope(**params), ctx.corpus)

    def reference(self, ctx, params, cfg):
        from geograph.bench.reference import maniscope_reference

        corpus = ctx.corpus.double().numpy()

        def ref(q, c):
            c = np.asarray(c)
            return c[maniscope_reference(q.double().numpy(), corpus[c], **params)[2]]

        return ref


class RicciMethod(Method):
    reference_name = "GraphRicciCurvature 0.6.1"

    def ranker(self, ctx, params, cfg):
        from geograph import RicciFiltration

        return reranker(RicciFiltration(**params), ctx.corpus)

    def reference(self, ctx, params, cfg):
        return lambda q, c: np.asarray(c)[ricci_filtration_reference(q, ctx.corpus[torch.as_tensor(c)], **params)]


def ricci_filtration_reference(query: Tensor, docs: Tensor, *, percentile: float = 50.0, eta: float = 1.0,
                               **flow) -> np.ndarray:
    """Ricci-Filtration for one query with GraphRicciCurvature's 20-step flow: kept candidates by cosine.

    The query graph is :func:`geograph.rerankers.query_graph`'s (its percentile is numpy's);
    curvature and flow are GraphRicciCurvature's. Returns the kept candidate positions, best first.
    """
    from geograph.bench.reference import ricci_reference
    from geograph.rerankers import query_graph

    adj, _, _ = query_graph(query[None].double(), docs[None].double(), percentile=percentile)
    n = adj.shape[1]
    edges = [tuple(e) for e in torch.triu(adj[0], 1).nonzero().tolist()]
    _, lengths = ricci_reference(edges, n, iterations=flow.get("iterations", 20))
    keep = np.array([lengths[(0, j)] <= eta for j in range(1, n)])
    d = docs.double().numpy()
    cos = d @ query.double().numpy() / (np.linalg.norm(d, axis=1) * np.linalg.norm(query.double().numpy()))
    kept = np.flatnonzero(keep)
    return kept[np.argsort(-cos[kept], kind="stable")]


class ISOMethod(Method):
    kind = "retrieve"
    reference_name = "numpy + networkx PageRank"
    trained = False

    def _graph(self, ctx, cfg):
        from geograph import CorpusGraph

        key = ("knn", cfg.get("knn", 10))
        if key not in ctx.cache:
            ctx.cache[key] = CorpusGraph.from_knn(ctx.corpus, cfg.get("knn", 10))
        return ctx.cache[key]

    def _projection(self, ctx, cfg):
        if not self.trained:
            return None
        key = ("f_theta", cfg.get("knn", 10), cfg.get("epochs", 5))
        if key not in ctx.cache:
            from geograph.bench.iso import train_projection

            ctx.cache[key] = train_projection(self._graph(ctx, cfg), epochs=cfg.get("epochs", 5))
        return ctx.cache[key]

    def model(self, ctx, params, cfg):
        from geograph import ISORetriever

        params = dict(params)
        beta = params.pop("beta", 0.4)
        key = ("iso", self.trained, cfg.get("knn", 10), beta)
        if key not in ctx.cache:  # phi and the kept edges are computed once per beta
            ctx.cache[key] = ISORetriever(self._graph(ctx, cfg), projection=self._projection(ctx, cfg), beta=beta)
        model = ctx.cache[key]
        for name, value in params.items():
            setattr(model, name, value)
        return model

    def ranker(self, ctx, params, cfg):
        k = cfg["k"]

        def run(q, c):
            out = self.model(ctx, params, cfg)(q, k)
            return out.indices, out.scores

        return run

    def reference(self, ctx, params, cfg):
        return iso_method_reference(ctx, params, cfg, self._graph(ctx, cfg), self._projection(ctx, cfg))


def iso_method_reference(ctx, params, cfg, graph, projection):
    """The numpy + networkx ISO-RAG of one grid point, from the raw inputs: the corpus
    embeddings, the k-NN edge list and the projected points (never the module's phi)."""
    from geograph.bench.reference import expmap0_reference, iso_reference, iso_reference_prepare

    emb = ctx.corpus.double().numpy()
    edges = graph.edge_index.cpu().numpy()
    z, c = None, 1.0
    if projection is not None:
        with torch.no_grad():
            z = expmap0_reference(projection.eval().mlp(ctx.corpus.to(next(projection.parameters()).dtype))
                                  .double().numpy(), projection.c)
        c = projection.c
    beta = params.get("beta", 0.4)
    key = ("iso-reference", projection is not None, cfg.get("knn", 10), beta)
    if key not in ctx.cache:  # the per-corpus part, once per beta (outside the timed loop)
        ctx.cache[key] = iso_reference_prepare(emb, edges, z=z, c=c, beta=beta)
    kwargs = {name: value for name, value in params.items() if name != "beta"}
    return lambda q, cands: np.asarray(iso_reference(emb, edges, q.double().numpy(), cfg["k"], beta=beta, c=c,
                                                     prepared=ctx.cache[key], **kwargs)[0], dtype=np.int64)


class ISOTrainedMethod(ISOMethod):
    trained = True


class G3Method(Method):
    kind = "retrieve"
    reference_name = "dense numpy T"

    def _graph(self, ctx, params, cfg):
        from geograph import G3Graph

        band = params.get("band", (0.1, 0.7))
        band = tuple(band) if band is not None else None
        max_degree = cfg.get("max_degree", None if ctx.corpus.shape[0] <= 2000 else 128)
        key = ("g3", params.get("beta", 0.4), band, max_degree)
        if key not in ctx.cache:
            ctx.cache[key] = G3Graph.build(ctx.corpus, band=band, beta=params.get("beta", 0.4), max_degree=max_degree)
        return ctx.cache[key]

    def ranker(self, ctx, params, cfg):
        from geograph import G3Retriever

        model = G3Retriever(self._graph(ctx, params, cfg), candidates=cfg.get("candidates", 10),
                            seeds=params.get("seeds", cfg.get("seeds", 2)))

        def run(q, c):
            out = model(q, cfg["k"])
            return out.indices, out.scores

        return run

    def reference(self, ctx, params, cfg):
        from geograph.bench.reference import g3_dense_reference, g3_retrieve_reference

        graph = self._graph(ctx, params, cfg)
        x = ctx.corpus.double().numpy()
        t, _ = g3_dense_reference(x, graph.band, graph.beta, graph.max_degree)
        seeds = params.get("seeds", cfg.get("seeds", 2))
        return lambda q, c: np.asarray(g3_retrieve_reference(
            x, t, q.double().numpy(), candidates=cfg.get("candidates", 10), seeds=seeds, k=cfg["k"])[0], dtype=np.int64)


METHODS: dict[str, Method] = {"maniscope": ManiscopeMethod(), "ricci": RicciMethod(), "iso": ISOMethod(),
                              "iso_trained": ISOTrainedMethod(), "g3": G3Method()}


def chain_ranker(rankers: Sequence[Ranker]) -> Ranker:
    """Rerankers in sequence on the surviving candidates of the previous stage."""

    def run(q, c):
        idx, scores = rankers[0](q, c)
        for nxt in rankers[1:]:
            mask = torch.isfinite(scores)
            idx, scores = nxt(q, idx, mask)
        return idx, scores

    return run


def chain_reference(refs: Sequence[Callable]) -> Callable:
    """The references in sequence: each stage's returned ids are the next stage's candidates."""

    def run(q, c):
        out = np.asarray(c)
        for ref in refs:
            out = ref(q, out)
        return out

    return run


# ---------------------------------------------------------------- protocol

def evaluate_run(dataset, indices: Tensor, scores: Tensor, metrics) -> dict[str, Tensor]:
    return per_query(run_ids(dataset, indices, scores), dataset.qrels_list(), metrics)


def tune(ctx: Context, method: Method, cfg: dict, metrics: list[str], primary: str) -> tuple[dict, dict]:
    """Grid search on the tuning split by ``primary`` (then the other metrics, in order)."""
    order = [primary] + [m for m in metrics if m != primary]
    limit = cfg.get("tune_queries")
    sp = ctx.split
    q, c = sp.tune_q, ctx.tune_cands
    dataset = sp.tune
    if limit is not None and limit < q.shape[0]:
        q, c, dataset = q[:limit], c[:limit], sp.tune.query_range(0, limit)
    best, best_key, scores = None, None, {}
    for params in grid_points(cfg.get("grid", {})):
        idx, sc = _batched(method.ranker(ctx, params, cfg), q, c)
        res = {m: float(v.mean()) for m, v in evaluate_run(dataset, idx, sc, order).items()}
        key = tuple(res[m] for m in order)
        if best_key is None or key > best_key:
            best, best_key, scores = params, key, res
    return best, {"queries": int(q.shape[0]), **scores}


def speed(ranker: Ranker, reference, query: Tensor, cands: Tensor, cfg: dict, ref_queries: int, k: int) -> dict:
    """ms/query at B = 1 and B = batch (median of repeats) and of the reference, with ratios; and
    on the reference's queries, the share whose top-``k`` ids equal the reference's."""
    b = min(cfg["batch"], query.shape[0])
    single = min(cfg["single"], query.shape[0])
    qb, cb = query[:b], cands[:b]
    t_b = time_calls(lambda: ranker(qb, cb), repeat=cfg["repeat"])
    t_1 = time_calls(lambda: [ranker(query[i : i + 1], cands[i : i + 1]) for i in range(single)],
                     repeat=cfg["repeat"])
    out = {"batch": b, "single": single, "B1_ms": t_1["median"] / single * 1e3, "Bbatch_ms": t_b["median"] / b * 1e3}
    if reference is not None and ref_queries > 0:
        n = min(ref_queries, query.shape[0])
        reference(query[0], cands[0])  # imports and first-call set-up stay out of the timing
        got: list = []
        t_r = time_calls(lambda: got.extend(reference(query[i], cands[i]) for i in range(n)), repeat=1, warmup=0)
        idx, sc = ranker(query[:n], cands[:n])
        ours = [[i for i, ok in zip(r, f) if ok][:k] for r, f in zip(idx.tolist(), torch.isfinite(sc).tolist())]
        same = sum(list(map(int, ref[:k])) == o for ref, o in zip(got, ours))
        out.update(reference_ms=t_r["median"] / n * 1e3, reference_queries=n, reference_top_k_identical=same / n)
        out["speedup_B1"] = out["reference_ms"] / out["B1_ms"]
        out["speedup_Bbatch"] = out["reference_ms"] / out["Bbatch_ms"]
    return out


def environment() -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "device": "cpu",
            "cpu": platform.processor() or platform.machine(), "python": platform.python_version(), "commit": commit}


def run(cfg: dict, *, progress: bool = True, cache: Optional[str] = None) -> dict:
    """Run the benchmark of ``cfg`` (see :func:`load_config`); returns the results dict."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from geograph.data import Encoder

    metrics = list(cfg["metrics"])
    k = max(int(m.partition("@")[2]) for m in metrics)
    encoder = Encoder(cache=cache or cfg.get("cache"), progress=False)
    rows = [("dense", None)] + [(m, None) for m in cfg["methods"]] + [("+".join(c), c) for c in cfg["chains"]]
    results = {"config": cfg, "environment": environment(), "datasets": {}}
    columns = (TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, disable=not progress, transient=False) as bar:
        task = bar.add_task("bench", total=len(cfg["datasets"]) * len(rows))
        for entry in cfg["datasets"]:
            name, root = dataset_root(entry)
            bar.update(task, description=f"[{name}] embedding (cached)")
            sp = tuning_split(name, root, encoder)
            m = min(cfg["candidates"], sp.corpus.shape[0])
            ctx = Context(name, sp, m, dense_candidates(sp.corpus, sp.tune_q, m).indices,
                          dense_candidates(sp.corpus, sp.report_q, m).indices)
            primary = entry["primary"]
            out = {"root": str(root), "protocol": sp.protocol, "primary": primary, "candidates": m,
                   "queries_tuned": len(sp.tune.queries), "queries_reported": len(sp.report.queries),
                   "corpus": int(sp.corpus.shape[0]), "methods": {}}
            per_q, tuned = {}, {}
            for key, chain in rows:
                label = " -> ".join(LABELS[s] for s in chain) if chain else LABELS[key]
                mcfg = {"k": k, **(cfg["methods"].get(key) or {})} if not chain else {}
                if chain:
                    stages = [METHODS[s].ranker(ctx, tuned[s], {"k": k, **cfg["methods"][s]}) for s in chain]
                    ranker = chain_ranker(stages)
                    refs = [METHODS[s].reference(ctx, tuned[s], {"k": k, **cfg["methods"][s]}) for s in chain]
                    reference = chain_reference(refs)
                    params, tuning = {s: tuned[s] for s in chain}, {"note": "each stage's tuned values"}
                    ref_n = min(cfg["methods"][s].get("reference_queries", 16) for s in chain)
                    ref_name = " + ".join(METHODS[s].reference_name for s in chain)
                    kind = "rerank"
                elif key == "dense":
                    ranker, reference, params, tuning, ref_n, ref_name, kind = (
                        Dense().ranker(ctx, {}, {}), None, {}, {}, 0, None, "retrieve")
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
                row = {"method": key, "kind": kind, "params": params, "tuning": tuning,
                       "metrics": {mm: float(v.mean()) for mm, v in per_q[label].items()},
                       "mean_returned": float(torch.isfinite(sc).sum(1).double().mean())}
                if label != "dense":
                    row["vs_dense"] = {mm: paired_bootstrap(per_q[label][mm], per_q["dense"][mm], **cfg["bootstrap"])
                                       for mm in metrics}
                bar.update(task, description=f"[{name}] {label}: speed")
                row["speed"] = speed(ranker, reference, sp.report_q, ctx.report_cands, cfg["speed"], ref_n, k)
                row["speed"]["reference"] = ref_name
                out["methods"][label] = row
                bar.advance(task)
            results["datasets"][name] = out
    return results


# ---------------------------------------------------------------- output

def _fmt_params(params: dict) -> str:
    if params and all(isinstance(v, dict) for v in params.values()):
        return "; ".join(f"{k}: {_fmt_params(v)}" for k, v in params.items())
    return ", ".join(f"{k}={list(v) if isinstance(v, tuple) else v}" for k, v in params.items()) or "-"


def table_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the results table (one row per data set and method)."""
    metrics = results["config"]["metrics"]
    b = results["config"]["speed"]["batch"]
    header = ["data set", "method", "queries", *metrics, "Δ primary [95% CI]", "ms/q B=1", f"ms/q B={b}",
              "reference ms/q", f"× ref (B={b})", "same top-k as ref", "tuned"]
    out = []
    for name, ds in results["datasets"].items():
        for label, row in ds["methods"].items():
            sp = row["speed"]
            ci = row.get("vs_dense", {}).get(ds["primary"])
            delta = f"{ci['diff']:+.3f} [{ci['low']:+.3f}, {ci['high']:+.3f}]" if ci else "-"
            out.append([
                name, label, str(ds["queries_reported"]), *(f"{row['metrics'][m]:.3f}" for m in metrics),
                f"{ds['primary']} {delta}", f"{sp['B1_ms']:.3f}", f"{sp['Bbatch_ms']:.3f}",
                f"{sp['reference_ms']:.2f}" if "reference_ms" in sp else "-",
                f"{sp['speedup_Bbatch']:.1f}x" if "speedup_Bbatch" in sp else "-",
                f"{sp['reference_top_k_identical'] * 100:.0f}% of {sp['reference_queries']}" if "reference_ms" in sp
                else "-",
                _fmt_params(row["params"]),
            ])
    return header, out


def markdown(results: dict) -> str:
    header, rows = table_rows(results)
    env = results["environment"]
    lines = [f"Generated by `geograph bench run` on {env['date']} (commit {env['commit']}, torch {env['torch']}, "
             f"{env['threads']} CPU threads, no GPU).", ""]
    for name, ds in results["datasets"].items():
        lines.append(f"- **{name}**: {ds['protocol']}; {ds['queries_reported']} queries reported, corpus "
                     f"{ds['corpus']}, dense top-{ds['candidates']} candidates; primary metric {ds['primary']}.")
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", "Δ: mean per-query difference to dense on the reported queries, paired bootstrap "
              f"({results['config']['bootstrap']['samples']} resamples) 95% interval. ms/query: rerankers "
              "time the reranking of the precomputed candidates, retrievers the whole retrieval; the "
              "reference is timed on its first queries in the same run."]
    return "\n".join(lines) + "\n"


def figure(results: dict, path: Path) -> Path:
    """Quality gain (primary metric, with its 95% interval) against ms/query at B = batch, log x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    labels = list(dict.fromkeys(label for ds in results["datasets"].values() for label in ds["methods"]))
    colors = {label: plt.cm.tab10(i % 10) for i, label in enumerate(labels)}
    markers = dict(zip(results["datasets"], itertools.cycle("osD^v")))
    for name, ds in results["datasets"].items():
        for label, row in ds["methods"].items():
            x = row["speed"]["Bbatch_ms"]
            ci = row.get("vs_dense", {}).get(ds["primary"], {"diff": 0.0, "low": 0.0, "high": 0.0})
            ax.errorbar([x], [ci["diff"]], yerr=[[ci["diff"] - ci["low"]], [ci["high"] - ci["diff"]]],
                        fmt=markers[name], color=colors[label], capsize=3, ms=7)
    handles = [Line2D([], [], color=colors[label], marker="o", ls="", label=label) for label in labels]
    handles += [Line2D([], [], color="black", marker=m, ls="", label=f"{name} ({results['datasets'][name]['primary']})")
                for name, m in markers.items()]
    ax.legend(handles=handles, fontsize=7, loc="lower left")
    ax.axhline(0.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel(f"ms/query at B={results['config']['speed']['batch']} (log scale)")
    ax.set_ylabel("gain over dense in the primary metric (95% CI)")
    ax.set_title("geograph bench run: gain over dense vs cost (one point per method and data set)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write(results: dict, out: str | Path) -> dict[str, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "md": out / "results.md", "png": out / "results.png"}
    paths["json"].write_text(json.dumps(results, indent=2, default=lambda o: list(o) if isinstance(o, tuple) else str(o)))
    paths["md"].write_text(markdown(results))
    figure(results, paths["png"])
    return paths


def print_table(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    header, rows = table_rows(results)
    table = Table(title="geograph bench run (tuned values: results.md)", show_lines=False)
    for h in header[:-1]:
        table.add_column(h)
    for r in rows:
        table.add_row(*r[:-1])
    console = Console()
    console.width = max(console.width, 190)
    console.print(table)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="geograph bench run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="bench YAML (default: configs/bench/default.yaml)")
    p.add_argument("--data", nargs="*", default=[], help="more BEIR-format folders with qrels")
    p.add_argument("--out", help="output folder (default: the config's out)")
    p.add_argument("--cache", help="embedding cache directory")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    cfg = load_config(args.config)
    cfg["datasets"] += [{"path": d, "primary": cfg["metrics"][0]} for d in args.data]
    if args.out:
        cfg["out"] = args.out
    results = run(cfg, progress=not args.no_progress, cache=args.cache)
    print_table(results)
    paths = write(results, cfg["out"])
    print("wrote " + ", ".join(str(v) for v in paths.values()))
    return 0
