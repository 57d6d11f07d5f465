"""``geograph bench scale``: the command line (its help text is the package's docstring), the printed tables
and the written files."""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from geograph.bench.common import DEFAULT_DATA, write_json
from geograph.bench.scale.generators import GENERATORS, fit_generators, generate, geometry
from geograph.bench.scale.peers_compare import add_peer_args, peers_report
from geograph.bench.scale.real_sets import real_set
from geograph.bench.scale.synthetic import run_size
from geograph.console import format_table, make_parser

BUILDS = ("knn", "g3", "dense")
RAY_FORMATS = {"tasks": "12d", "equal": ">12"}
#: the table's text columns
SCALE_FORMATS = {"kNN nprobe": "s", "G3 nprobe": "s", "dense nprobe": "s"}


#: The first line of ``scale.md`` when it has synthetic corpora: what the ``mixture-N`` / ``gauss-N`` rows are.
SYNTHETIC_NOTE = (
    "Rows `mixture-N` and `gauss-N` are synthetic corpora, not real passages: N unit vectors drawn from\n"
    "generators fitted to SciFact's MiniLM embeddings (`geograph.bench.scale.generators`; `mixture`: topics,\n"
    "`gauss`: one Gaussian with no topics). Rows named after a data set are that real set at its own size."
)


def _probes(info: dict[str, Any]) -> str:
    """The cells an IVF build probed (``exact`` when its recall target sent it to the exact scan; ``-``: not IVF)."""
    if info.get("exact"):
        return "exact"
    return str(info["nprobe"]) if info.get("nprobe") else "-"


def _nprobe_arg(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    from geograph.bench import scale as package

    p = make_parser("geograph bench scale", package.__doc__)
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
        "geograph.knn.policy.default_join_nprobe)",
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
    add_peer_args(p)
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

    if args.peers:
        return peers_report(args, model, {"threads": torch.get_num_threads(), "geometry": geo})
    results: dict[str, Any] = {
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
        "# geograph bench scale\n\n"
        + (f"{SYNTHETIC_NOTE}\n\n" if results["sizes"] else "")
        + "```\n"
        + (format_table(rows, table_cols, SCALE_FORMATS) if rows else "")
        + "\n\n"
        + (format_table(results["real"], real_cols) if results["real"] else "")
        + ("\n\n" + format_table(ray_rows, ray_cols, RAY_FORMATS) if ray_rows else "")
        + "\n```\n"
    )
    print(f"\nwrote {path} and {md}")
    return 0
