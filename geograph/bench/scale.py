"""``geograph bench scale``: corpus graphs and dense retrieval at corpus scale, ANN vs exact.

For each size N (positional arguments) and each ``--generators`` synthetic corpus (384-d unit vectors that
reproduce all-MiniLM-L6-v2's geometry, fitted to the cached SciFact passage embeddings;
see :func:`fit_generators`), in a fresh process per build (peak resident memory
of that process): the k-NN graph (k = 10) and the G3 graph (``max_degree`` 128) built with
``--index`` (default ``ivf``), the time of every stage, and against exact references in the
same run:

- k-NN edge recall@10 on ``--check-rows`` uniformly sampled rows (each row's exact top-10 by
  the tiled scan against the whole corpus);
- G3: the certified and re-done rows; on the sampled rows, edge recall and the L1 error of the
  row-normalised weights against the exact rows. Up to ``--exact-limit`` passages the exact
  rows use the exact density of every passage (one tiled pass over all pairs) and the
  density's largest error is reported over all rows; above it the exact rows use the build's
  own density (isolating the candidate error) and the density error is measured on the
  sampled rows (exact raw density, normalised by the build's exact extremes);
- ``DenseRetriever`` IVF recall@20 and ms/query at B=64 next to the exact scan (same
  queries, warmed, repeated: median and spread), on held-out draws of the generator;
- the ``nprobe`` each IVF build and the dense index chose for its recall target (``exact``
  where a build fell back to the exact scan; JSON: ``build_info`` / ``calibration`` with the
  recall each measured on its own sampled rows).

With ``--ray [ADDRESS]`` both builds are made again with their tiles on Ray
(:mod:`geograph.distributed`; alone: a local Ray on this machine), each in a fresh process that
connects and warms the workers before its clock starts (both timed and reported apart): the
wall time against the single-process build, the overhead, the tasks, and whether the two graphs
are equal (the same edges and density; weights within 1e-6). The peak RSS of a Ray build is the
driver's only (the workers are Ray's processes).

Then the real sets at their own size (SciFact, MuSiQue by default): the same recalls, and
whether ISO-RAG and G3RAG return the same top-k with IVF-built graphs as with exact ones on
every query (an IVF forced at small N: ``nlist`` from :func:`~geograph.functional.knn_policy.default_nlist`).

The generators are checked by printing, next to real SciFact, the pairwise-cosine histogram
and the 1st / 10th-neighbour cosine quantiles of a synthetic sample of the same size (and of
2Wiki's first 5,183 passages, a second real corpus). Measured: both generators match SciFact's
pairwise histogram and mean cosine (0.131); the mixture's 1st / 10th-neighbour medians are
0.61 / 0.50 (SciFact 0.68 / 0.53, 2Wiki 0.55 / 0.40), the Gaussian's 0.46 / 0.40: the mixture
is the realistic case and the Gaussian the hard one for an IVF index (no topics to cut along).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import resource
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from geograph.bench.common import DEFAULT_DATA, time_calls, write_json
from geograph.console import format_table, make_parser

GENERATORS = ("mixture", "gauss")
BUILDS = ("knn", "g3", "dense")
KNN_K = 10
MAX_DEGREE = 128
RAY_FORMATS = {"tasks": "12d", "equal": ">12"}


# -- generators ------------------------------------------------------------------------------
def fit_generators(real: np.ndarray, *, clusters: int = 512, seed: int = 0) -> dict:
    """Two Gaussian models of real unit embeddings ``(n, D)``.

    - ``mixture``: spherical k-means with ``clusters`` centres (512 on SciFact's 5,183: about 10
      passages a centre, so the local structure survives); a point is its cluster's mean
      plus a residual drawn from the pooled within-cluster covariance scaled by the cluster's
      own residual variance, then normalised (topics of various spread, as real corpora).
    - ``gauss``: one Gaussian with the corpus mean and covariance, normalised (no topic
      structure: the harder case for IVF, whose cells then cut through dense regions).
    """
    import faiss

    x = np.ascontiguousarray(real, dtype=np.float32)
    km = faiss.Kmeans(
        x.shape[1], clusters, niter=25, seed=seed, spherical=True, verbose=False, min_points_per_centroid=1
    )
    km.train(x)
    _, lab = km.index.search(x, 1)
    lab = lab[:, 0]
    means = np.stack([x[lab == c].mean(0) if (lab == c).any() else km.centroids[c] for c in range(clusters)])
    resid = x - means[lab]
    scale = np.array([resid[lab == c].var() if (lab == c).sum() > 1 else resid.var() for c in range(clusters)])
    cov_w = np.cov(resid.T / np.sqrt(scale[lab] / resid.var()))
    weights = np.bincount(lab, minlength=clusters) / len(lab)
    return {
        "mixture": {
            "means": means,
            "scale": scale / resid.var(),
            "chol": np.linalg.cholesky(cov_w + 1e-9 * np.eye(x.shape[1])),
            "weights": weights,
        },
        "gauss": {"mean": x.mean(0), "chol": np.linalg.cholesky(np.cov(x.T) + 1e-9 * np.eye(x.shape[1]))},
    }


def generate(model: dict, kind: str, n: int, *, seed: int = 0, chunk: int = 100_000) -> np.ndarray:
    """``n`` float32 unit vectors from a fitted generator (chunked: memory ``O(n D)``)."""
    rng = np.random.default_rng(seed)
    m = model[kind]
    d = m["chol"].shape[0]
    out = np.empty((n, d), dtype=np.float32)
    for s in range(0, n, chunk):
        c = min(chunk, n - s)
        eps = rng.standard_normal((c, d)) @ m["chol"].T
        if kind == "mixture":
            lab = rng.choice(len(m["weights"]), size=c, p=m["weights"])
            x = m["means"][lab] + np.sqrt(m["scale"][lab])[:, None] * eps
        else:
            x = m["mean"] + eps
        out[s : s + c] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def geometry(x: np.ndarray, *, pairs: int = 200_000, seed: int = 0) -> dict:
    """Pairwise-cosine histogram (random pairs) and 1st / 10th-neighbour cosine quantiles."""
    from geograph.functional.allpairs import tiled_topk

    rng = np.random.default_rng(seed)
    i, j = rng.integers(len(x), size=pairs), rng.integers(len(x), size=pairs)
    keep = i != j
    cos = np.einsum("nd,nd->n", x[i[keep]], x[j[keep]])
    edges = np.array([-0.2, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 1.0])
    hist = np.histogram(cos, bins=edges)[0] / keep.sum()
    t = torch.from_numpy(x)
    v, _ = tiled_topk(t, t, 10, exclude_self=True)
    q = [0.1, 0.5, 0.9]
    return {
        "bins": edges.tolist(),
        "hist": hist.tolist(),
        "mean_cos": float(cos.mean()),
        "nn1": np.quantile(v[:, 0].numpy(), q).tolist(),
        "nn10": np.quantile(v[:, 9].numpy(), q).tolist(),
    }


# -- one build in a fresh process ------------------------------------------------------------
def _rss_mb() -> float:
    """Peak resident memory of this process so far, MB: ``VmHWM`` (reset by ``exec``, so a spawned
    child does not inherit its parent's peak, as ``ru_maxrss`` does), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _child(task: dict, queue) -> None:
    try:
        torch.set_num_threads(task["threads"])
        x = torch.from_numpy(np.load(task["path"], mmap_mode="c"))  # mapped copy-on-write: pages read from the file
        with contextlib.ExitStack() as stack:
            out: dict = {}
            if task.get("ray") is not None:
                executor, out["ray"] = _enter_ray(stack, task["ray"], x)
            base = _rss_mb()
            t0 = time.perf_counter()
            _build(task, x, out)
            out.update(seconds=time.perf_counter() - t0, peak_rss_mb=_rss_mb(), base_rss_mb=base)
            if "ray" in out:
                out["ray"]["tasks"] = executor.tasks
        queue.put(out)
    except BaseException as exc:  # report, do not hang the parent
        queue.put({"error": f"{type(exc).__name__}: {exc}"})
        raise


def _enter_ray(stack: contextlib.ExitStack, address: str, x: torch.Tensor):
    """Connect (or start a local Ray) and warm its workers with a small build, both timed apart from the build."""
    from geograph.distributed import on_ray
    from geograph.graphs.corpus_graph import CorpusGraph

    t0 = time.perf_counter()
    executor = stack.enter_context(on_ray(address))
    connect = time.perf_counter() - t0
    t0 = time.perf_counter()
    CorpusGraph.from_knn(x[:2048], 5, chunk_size=256)  # every worker imports torch and geograph once
    warm = time.perf_counter() - t0
    executor.tasks = 0
    return executor, {
        "address": address,
        "cpus": executor.session["cpus"],
        "connect_seconds": connect,
        "warmup_seconds": warm,
    }


def _build(task: dict, x: torch.Tensor, out: dict) -> None:
    """One build of ``task["kind"]``; its graph arrays saved to ``task["out"]``."""
    if task["kind"] == "knn":
        from geograph.graphs.corpus_graph import CorpusGraph

        g = CorpusGraph.from_knn(x, KNN_K, index=task["index"], nprobe=task["nprobe"], progress=task["progress"])
        np.save(task["out"], g.edge_index.numpy())
        out["stages"] = g.build_info.get("seconds", {})
        out["build_info"] = g.build_info
    else:
        from geograph.graphs.g3_graph import G3Graph

        g = G3Graph.build(
            x,
            max_degree=MAX_DEGREE,
            index=task["index"],
            nprobe=task["nprobe"],
            candidates=task["candidates"],
            density_sample=task["density_sample"],
            ranking=task["ranking"],
            progress=task["progress"],
        )
        np.savez(task["out"], crow=g.crow.numpy(), col=g.col.numpy(), val=g.val.numpy(), density=g.density.numpy())
        info = g.build_info
        out["stages"] = {k: info[k] for k in ("density_seconds", "candidate_seconds", "edge_seconds") if k in info}
        out["build_info"] = info


def _probes(info: dict) -> str:
    """The cells an IVF build probed (``exact`` when its recall target sent it to the exact scan; ``-``: not IVF)."""
    if info.get("exact"):
        return "exact"
    return str(info["nprobe"]) if info.get("nprobe") else "-"


#: the table's text columns
SCALE_FORMATS = {"kNN nprobe": "s", "G3 nprobe": "s", "dense nprobe": "s"}


def build_in_child(task: dict) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(task, queue))
    proc.start()
    out = queue.get()
    proc.join()
    if "error" in out:
        raise RuntimeError(f"{task['kind']} build failed: {out['error']}")
    return out


# -- exact references on sampled rows --------------------------------------------------------
def exact_knn_rows(z: torch.Tensor, rows: torch.Tensor, k: int) -> torch.Tensor:
    from geograph.functional.allpairs import tiled_pairs

    return tiled_pairs(z[rows], z, k, exclude=rows)[1]


def knn_recall(edge_index: np.ndarray, rows: np.ndarray, ref: np.ndarray) -> float:
    """Share of each sampled row's exact top-k found among its graph neighbours."""
    order = np.argsort(edge_index[0], kind="stable")
    src, dst = edge_index[0][order], edge_index[1][order]
    hits = 0
    for r, want in zip(rows.tolist(), ref.tolist()):
        lo, hi = np.searchsorted(src, r), np.searchsorted(src, r, side="right")
        hits += len(set(dst[lo:hi].tolist()) & set(want))
    return hits / ref.size


def exact_g3_rows(z: torch.Tensor, rows: torch.Tensor, penalty: torch.Tensor, band=(0.1, 0.7)) -> list[dict]:
    """Each sampled row's exact top-``MAX_DEGREE`` weights, normalised: ``[{col: weight}]``."""
    from geograph.functional.allpairs import tiled_pairs

    def score(s, cols):
        ok = (s >= band[0]) & (s <= band[1])
        w = torch.where(ok, s * torch.sqrt((1 - s * s).clamp_min(0)), torch.zeros_like(s))
        return w * penalty[cols]

    val, col, _ = tiled_pairs(z[rows], z, MAX_DEGREE, exclude=rows, score=score)
    out = []
    for v, c in zip(val.tolist(), col.tolist()):
        d = {ci: vi for ci, vi in zip(c, v) if vi > 0}
        tot = sum(d.values())
        out.append({ci: vi / tot for ci, vi in d.items()} if tot > 0 else {})
    return out


def g3_row_errors(npz, rows: np.ndarray, ref: list[dict]) -> tuple[float, float]:
    """Edge recall and mean L1 of the normalised weights, built vs exact, on the sampled rows."""
    crow, col, val = npz["crow"], npz["col"], npz["val"]
    found = total = 0
    l1 = []
    for r, want in zip(rows.tolist(), ref):
        got = dict(zip(col[crow[r] : crow[r + 1]].tolist(), val[crow[r] : crow[r + 1]].tolist()))
        found += len(set(got) & set(want))
        total += len(want)
        keys = set(got) | set(want)
        l1.append(sum(abs(got.get(c, 0.0) - want.get(c, 0.0)) for c in keys))
    return (found / total if total else 1.0), float(np.mean(l1))


def raw_density(z: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    from geograph.functional.allpairs import tiled_pairs

    q = z if rows is None else z[rows]
    _, _, s = tiled_pairs(
        q,
        z,
        0,
        exclude=True if rows is None else rows,
        row_sum=lambda t: t.clamp_min(0),
        progress="exact density" if rows is None else False,
    )
    return s / z.shape[0]


# -- dense retrieval -------------------------------------------------------------------------
def _nprobe_arg(text: str):
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {value}")
    return value


def dense_compare(x: torch.Tensor, queries: torch.Tensor, *, nprobe, k: int = 20, batch: int = 64) -> dict:
    from geograph.retrievers import DenseRetriever

    exact = DenseRetriever(x)
    t0 = time.perf_counter()
    ivf = DenseRetriever(x, index="ivf", nprobe=nprobe)
    ivf(queries[:1], k)  # builds the faiss index
    build = time.perf_counter() - t0
    hits = 0
    for s in range(0, len(queries), batch):
        a, b = exact(queries[s : s + batch], k).indices, ivf(queries[s : s + batch], k).indices
        hits += int((b.unsqueeze(2) == a.unsqueeze(1)).any(2).sum())
    q = queries[:batch]
    te = time_calls(lambda: exact(q, k), repeat=5)
    ti = time_calls(lambda: ivf(q, k), repeat=5)

    def ms(t):
        return {key: t[key] * 1000 / batch for key in ("median", "min", "max")}

    return {
        "recall@20": hits / (len(queries) * k),
        "nlist": ivf.nlist,
        "nprobe": ivf.nprobe,
        "calibration": ivf.calibration,
        "index_build_s": build,
        "exact_ms_per_query": ms(te),
        "ivf_ms_per_query": ms(ti),
        "speedup": te["median"] / ti["median"],
    }


# -- one synthetic size ----------------------------------------------------------------------
def run_size(x: np.ndarray, queries: np.ndarray, args, tmp: Path, label: str) -> dict:
    n = len(x)
    path = tmp / f"{label}.npy"
    np.save(path, x)
    common = dict(
        path=str(path), threads=torch.get_num_threads(), index=args.index, nprobe=args.nprobe, progress=args.progress
    )
    res: dict = {"N": n}
    z = torch.from_numpy(x)
    rows = torch.from_numpy(np.sort(np.random.default_rng(1).choice(n, size=min(args.check_rows, n), replace=False)))
    if "knn" in args.builds:
        print(f"[{label}] k-NN graph ({args.index}) ...", flush=True)
        res["knn"] = build_in_child(dict(common, kind="knn", out=str(tmp / f"{label}-knn.npy")))
        ref = exact_knn_rows(z, rows, KNN_K).numpy()
        res["knn"]["recall@10"] = knn_recall(np.load(tmp / f"{label}-knn.npy"), rows.numpy(), ref)
    if "g3" in args.builds:
        print(f"[{label}] G3 graph ({args.index}) ...", flush=True)
        res["g3"] = build_in_child(
            dict(
                common,
                kind="g3",
                candidates=args.candidates,
                density_sample=args.density_sample,
                ranking=args.ranking,
                out=str(tmp / f"{label}-g3.npz"),
            )
        )
        res["g3"].update(g3_check(z, rows, np.load(tmp / f"{label}-g3.npz"), args.exact_limit))
    if args.ray is not None:
        res["ray"] = ray_compare(common, args, tmp, label, res)
    if "dense" in args.builds:
        print(f"[{label}] DenseRetriever exact vs IVF ...", flush=True)
        res["dense"] = dense_compare(z, torch.from_numpy(queries), nprobe=args.dense_nprobe)
    return res


def g3_check(z: torch.Tensor, rows: torch.Tensor, g3, exact_limit: int) -> dict:
    """A G3 build's density error and, on ``rows``, its edge recall and weight L1 error against exact rows."""
    n = z.shape[0]
    t0 = time.perf_counter()
    out: dict = {}
    built_rho = torch.from_numpy(g3["density"])
    if n <= exact_limit:
        raw = raw_density(z).double()
        exact_rho = ((raw - raw.min()) / (raw.max() - raw.min())).float()
        out["rho_max_error"] = float((exact_rho - built_rho).abs().max())
        out["rho_error_over"] = "all rows"
        penalty = torch.exp(-0.4 * exact_rho)
        out["reference"] = "exact rows with the exact density of every passage"
    else:
        raw_rows = raw_density(z, rows).double()
        # the build's normalisation is set by exact extremes: recover it from two exact rows
        lo_row, hi_row = int(built_rho.argmin()), int(built_rho.argmax())
        ext = raw_density(z, torch.tensor([lo_row, hi_row])).double()
        exact_rows_rho = (raw_rows - ext[0]) / (ext[1] - ext[0])
        out["rho_max_error"] = float((exact_rows_rho - built_rho[rows].double()).abs().max())
        out["rho_error_over"] = f"{len(rows)} sampled rows"
        penalty = torch.exp(-0.4 * built_rho)
        out["reference"] = "exact rows with the build's density"
    rec, l1 = g3_row_errors(g3, rows.numpy(), exact_g3_rows(z, rows, penalty))
    out.update(edge_recall=rec, weight_l1=l1, check_rows=len(rows), check_seconds=time.perf_counter() - t0)
    return out


# -- Ray against the single-process build -----------------------------------------------------
def ray_compare(common: dict, args, tmp: Path, label: str, res: dict) -> dict:
    """The same two builds with their tiles on Ray (fresh process, Ray connected and its workers warmed
    before the clock starts): wall time, overhead against the single-process build, and equality."""
    out: dict = {}
    for kind in [b for b in ("knn", "g3") if b in res]:  # the builds made in this run
        print(f"[{label}] {kind} graph on Ray ({args.ray}) ...", flush=True)
        extra = (
            {}
            if kind == "knn"
            else dict(candidates=args.candidates, density_sample=args.density_sample, ranking=args.ranking)
        )
        path = tmp / f"{label}-{kind}-ray.{'npy' if kind == 'knn' else 'npz'}"
        r = build_in_child(dict(common, kind=kind, ray=args.ray, out=str(path), **extra))
        local = tmp / f"{label}-{kind}.{'npy' if kind == 'knn' else 'npz'}"
        if kind == "knn":
            same = bool(np.array_equal(np.load(path), np.load(local)))
            r["equal"] = same
        else:
            a, b = np.load(path), np.load(local)
            same = all(np.array_equal(a[f], b[f]) for f in ("crow", "col", "density"))
            r["equal"] = same and bool(np.abs(a["val"] - b["val"]).max(initial=0.0) <= 1e-6)
            r["val_max_diff"] = float(np.abs(a["val"] - b["val"]).max(initial=0.0)) if same else None
        r["single_process_seconds"] = res[kind]["seconds"]
        r["overhead"] = r["seconds"] / res[kind]["seconds"] - 1.0
        out[kind] = r
    return out


# -- real sets -------------------------------------------------------------------------------
def csr_edge_recall(crow: torch.Tensor, col: torch.Tensor, crow2: torch.Tensor, col2: torch.Tensor) -> float:
    """Share of the first graph's edges (CSR) that the second has.

    Example:
        >>> t = torch.tensor
        >>> csr_edge_recall(t([0, 2, 3]), t([1, 0, 0]), t([0, 1, 2]), t([1, 0]))
        0.6666666666666666
    """
    n = crow.numel() - 1

    def key(c, k):
        return torch.repeat_interleave(torch.arange(n), c.diff()) * n + k

    a, b = key(crow, col), key(crow2, col2)
    return float(torch.isin(a, b).sum()) / a.numel() if a.numel() else 1.0


def real_set(name: str, root: str, encoder, args) -> dict:
    from geograph.data import load_beir
    from geograph.graphs.corpus_graph import CorpusGraph
    from geograph.graphs.g3_graph import G3Graph
    from geograph.retrievers import G3Retriever, ISORetriever

    ds = load_beir(root, "test")
    x = encoder.encode(ds.passages())
    q = encoder.encode(ds.queries)
    n = len(x)
    out: dict = {"N": n, "queries": len(ds.queries)}
    z = torch.nn.functional.normalize(x, dim=1)
    exact_knn = CorpusGraph.from_knn(x, KNN_K)
    ivf_knn = CorpusGraph.from_knn(x, KNN_K, index="ivf", nprobe=args.nprobe)
    rows = torch.arange(n)
    ref = exact_knn_rows(z, rows, KNN_K).numpy()
    out["knn_recall@10"] = knn_recall(ivf_knn.edge_index.numpy(), rows.numpy(), ref)
    g_exact = G3Graph.build(x, max_degree=MAX_DEGREE)
    g_ivf = G3Graph.build(
        x,
        max_degree=MAX_DEGREE,
        index="ivf",
        nprobe=args.nprobe,
        candidates=args.candidates,
        density_sample=args.density_sample,
        ranking=args.ranking,
    )
    info = g_ivf.build_info
    out["g3_certified"] = info.get("certified", 0) / n
    out["g3_redone"] = info.get("redone", 0)
    out["rho_max_error"] = float((g_exact.density - g_ivf.density).abs().max())
    out["nprobe"] = info.get("nprobe")
    out["g3_edge_recall"] = csr_edge_recall(g_exact.crow, g_exact.col, g_ivf.crow, g_ivf.col)

    def same(a, b):
        return float((torch.sort(a, 1).values == torch.sort(b, 1).values).all(1).float().mean())

    k = 10
    out["iso_same_topk"] = same(ISORetriever(exact_knn)(q, k=k).indices, ISORetriever(ivf_knn)(q, k=k).indices)
    out["g3_same_topk"] = same(G3Retriever(g_exact)(q, k=5).indices, G3Retriever(g_ivf)(q, k=5).indices)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = make_parser("geograph bench scale", __doc__)
    p.add_argument("sizes", type=int, nargs="*", default=[200_000, 1_000_000], help="corpus sizes (default 200k 1M)")
    p.add_argument(
        "--generators",
        nargs="*",
        default=list(GENERATORS),
        choices=GENERATORS,
        help="synthetic corpora (none: only the real sets)",
    )
    p.add_argument(
        "--gauss-max",
        type=int,
        default=200_000,
        help="largest size the Gaussian generator runs at (default: %(default)s): with no topics, the "
        "recall target makes its builds probe a large share of the corpus or scan it exactly "
        "(200k: 4 and 14 minutes; hours at 1M on two cores)",
    )
    p.add_argument(
        "--builds",
        nargs="+",
        default=list(BUILDS),
        choices=BUILDS,
        help="what to build and check at each size (default: all)",
    )
    p.add_argument("--index", default="ivf", choices=["exact", "ivf", "auto"])
    p.add_argument(
        "--nprobe",
        type=int,
        help="cells each cell meets in the IVF join (default: the builders' own, "
        "geograph.functional.knn_policy.default_join_nprobe)",
    )
    p.add_argument(
        "--dense-nprobe",
        type=_nprobe_arg,
        default="auto",
        help="lists a DenseRetriever query probes, or auto: chosen on sampled passages for recall@20 0.99 "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--candidates",
        type=int,
        default=None,
        help="G3 candidates K' per row (default: max_degree + a quarter; 512 with --ranking cosine)",
    )
    p.add_argument(
        "--ranking",
        default="weight",
        choices=["weight", "cosine"],
        help="G3 candidate ranking: the weight itself, or cosine with the certificate (default weight)",
    )
    p.add_argument(
        "--density-sample",
        type=int,
        default=None,
        help="G3 density columns sampled (default: G3Graph.build's, 8192 for the IVF build; 0 = exact)",
    )
    p.add_argument(
        "--check-rows", type=int, default=2000, help="sampled rows checked against exact (default: %(default)s)"
    )
    p.add_argument(
        "--exact-limit", type=int, default=200_000, help="exact density of all rows up to this N (default: %(default)s)"
    )
    p.add_argument("--queries", type=int, default=640, help="DenseRetriever queries per size (default: %(default)s)")
    p.add_argument("--datasets", nargs="*", default=["scifact", "musique"])
    p.add_argument("--data-root", default=str(DEFAULT_DATA), help="folder of the real sets (default: %(default)s)")
    p.add_argument("--cache", help="embedding cache directory")
    p.add_argument("--progress", action="store_true", help="progress bars of the builds")
    p.add_argument("--out", default="bench-results", help="output folder (default: %(default)s)")
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="also build both graphs with their tiles on Ray (alone: a local Ray on this machine; "
        "'auto' or ray://HOST:PORT: a cluster) and report the overhead against the single-process build",
    )
    args = p.parse_args(argv)

    from geograph.data import Encoder, load_corpus

    encoder = Encoder(cache=args.cache)
    root = Path(args.data_root)
    scifact = encoder.encode(load_corpus(root / "scifact").passages()).numpy()
    wiki = encoder.encode(load_corpus(root / "2wiki-corpus").passages()).numpy()
    model = fit_generators(scifact)
    print(f"generators fitted to the {len(scifact)} SciFact MiniLM embeddings; geometry at N={len(scifact)}:")
    geo = {"real SciFact": geometry(scifact), "real 2Wiki": geometry(wiki[: len(scifact)])}
    for g in args.generators:
        geo[g] = geometry(generate(model, g, len(scifact), seed=7))
    bins = geo["real SciFact"]["bins"]
    cols = [f"[{bins[i]:.1f},{bins[i + 1]:.1f})" for i in range(len(bins) - 1)]
    print(format_table({k: dict(zip(cols, v["hist"])) for k, v in geo.items()}, cols))
    qcols = ["nn1 p10", "nn1 p50", "nn1 p90", "nn10 p10", "nn10 p50", "nn10 p90", "mean cos"]
    print(format_table({k: dict(zip(qcols, v["nn1"] + v["nn10"] + [v["mean_cos"]])) for k, v in geo.items()}, qcols))

    results: dict = {
        "threads": torch.get_num_threads(),
        "index": args.index,
        "nprobe": args.nprobe,
        "gauss_max": args.gauss_max,
        "exact_limit": args.exact_limit,
        "geometry": geo,
        "sizes": {},
        "real": {},
    }
    with tempfile.TemporaryDirectory(prefix="geograph-scale-") as tmp:
        for n in args.sizes:
            for g in args.generators:
                if g == "gauss" and n > args.gauss_max:
                    print(f"[gauss-{n}] skipped: above --gauss-max {args.gauss_max}", flush=True)
                    continue
                x = generate(model, g, n, seed=11)
                qs = generate(model, g, args.queries, seed=12)
                label = f"{g}-{n}"
                results["sizes"][label] = run_size(x, qs, args, Path(tmp), label)
                print(json.dumps(results["sizes"][label], default=float)[:2000], flush=True)
                del x
    for name in args.datasets:
        print(f"[{name}] real set, exact vs IVF ...", flush=True)
        results["real"][name] = real_set(name, str(root / name), encoder, args)

    rows = {}
    for label, r in results["sizes"].items():
        nan = float("nan")  # a build left out by --builds
        k, g, d = r.get("knn", {}), r.get("g3", {}), r.get("dense", {})
        bi, ki = g.get("build_info", {}), k.get("build_info", {})
        rows[label] = {
            "kNN s": k.get("seconds", nan),
            "kNN RSS GB": k.get("peak_rss_mb", nan) / 1024,
            "kNN nprobe": _probes(ki),
            "kNN rec@10": k.get("recall@10", nan),
            "G3 s": g.get("seconds", nan),
            "G3 nprobe": _probes(bi),
            "G3 RSS GB": g.get("peak_rss_mb", nan) / 1024,
            "G3 edge rec": g.get("edge_recall", nan),
            "G3 L1": g.get("weight_l1", nan),
            "certified": bi.get("certified", nan) / r["N"],
            "redone": bi.get("redone", nan),
            "rho err": g.get("rho_max_error", nan),
            "dense nprobe": str(d["nprobe"]) if d.get("nprobe") else "-",
            "dense rec@20": d.get("recall@20", nan),
            "dense x": d.get("speedup", nan),
        }
    table_cols = list(next(iter(rows.values())).keys()) if rows else []
    if rows:
        print("\ncorpus scale (synthetic MiniLM-like 384-d, this machine):")
        print(format_table(rows, table_cols, SCALE_FORMATS))
    ray_rows = {
        f"{label} {kind}": {
            "single s": r["ray"][kind]["single_process_seconds"],
            "Ray s": r["ray"][kind]["seconds"],
            "overhead": r["ray"][kind]["overhead"],
            "tasks": r["ray"][kind]["ray"]["tasks"],
            "connect s": r["ray"][kind]["ray"]["connect_seconds"],
            "warm-up s": r["ray"][kind]["ray"]["warmup_seconds"],
            "equal": str(r["ray"][kind]["equal"]),
        }
        for label, r in results["sizes"].items()
        if "ray" in r
        for kind in ("knn", "g3")
    }
    ray_cols = ["single s", "Ray s", "overhead", "tasks", "connect s", "warm-up s", "equal"]
    if ray_rows:
        print(f"\nRay ({args.ray}) against the single-process build (same machine, same threads):")
        print(format_table(ray_rows, ray_cols, RAY_FORMATS))
    real_cols = ["N", "knn_recall@10", "g3_certified", "g3_redone", "rho_max_error", "iso_same_topk", "g3_same_topk"]
    if results["real"]:
        print("\nreal sets at their own size (IVF forced):")
        print(format_table(results["real"], real_cols))
    path = write_json("scale", results, args.out)
    md = Path(args.out) / "scale.md"
    md.write_text(
        "# geograph bench scale\n\n```\n"
        + (format_table(rows, table_cols, SCALE_FORMATS) if rows else "")
        + "\n\n"
        + (format_table(results["real"], real_cols) if results["real"] else "")
        + ("\n\n" + format_table(ray_rows, ray_cols, RAY_FORMATS) if ray_rows else "")
        + "\n```\n"
    )
    print(f"\nwrote {path} and {md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
