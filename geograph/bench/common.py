"""Timing and reporting helpers for the benchmarks (public API only, warm-up, medians)."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

DEFAULT_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def sync(device: torch.device | str | None = None) -> None:
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize()


def time_calls(fn: Callable[[], Any], *, repeat: int = 5, warmup: int = 1, device=None) -> dict[str, float]:
    """Median and spread (min, max) of ``repeat`` timed calls of ``fn`` in seconds, after warm-up."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "repeat": repeat}


def write_json(name: str, payload: dict, out_dir: str | Path = "bench-results") -> Path:
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    target = path / f"{name}.json"
    target.write_text(json.dumps(payload, indent=2, default=float))
    return target


def resolve_data(path: str | None, name: str) -> Path:
    """``path``, else the shared data folder ``<repo>/../shared/data/<name>``."""
    p = Path(path) if path else DEFAULT_DATA / name
    if not p.is_dir():
        raise SystemExit(f"data folder {p} not found; pass --data DIR (a BEIR-format folder)")
    return p
