"""One synthetic corpus size of ``geograph bench scale``: the builds in fresh processes, checked against exact
rows, the Ray builds and the dense retriever."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch

from geograph.bench.scale.dense import dense_compare
from geograph.bench.scale.harness import KNN_K, build_in_child
from geograph.bench.scale.ray_compare import ray_compare
from geograph.bench.scale.references import exact_knn_rows, g3_check, knn_recall


def run_size(x: np.ndarray, queries: np.ndarray, args: argparse.Namespace, tmp: Path, label: str) -> dict[str, Any]:
    n = len(x)
    path = tmp / f"{label}.npy"
    np.save(path, x)
    common = dict(
        path=str(path), threads=torch.get_num_threads(), index=args.index, nprobe=args.nprobe, progress=args.progress
    )
    res: dict[str, Any] = {"N": n}
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
