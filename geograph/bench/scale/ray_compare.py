"""The builds of ``geograph bench scale`` again with their tiles on Ray, against the single-process build."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from geograph.bench.scale.harness import build_in_child


def ray_compare(
    common: dict[str, Any], args: argparse.Namespace, tmp: Path, label: str, res: dict[str, Any]
) -> dict[str, Any]:
    """The same two builds with their tiles on Ray (fresh process, Ray connected and its workers warmed
    before the clock starts): wall time, overhead against the single-process build, and equality."""
    out: dict[str, Any] = {}
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
