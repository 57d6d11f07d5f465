"""Timing and reporting helpers for the benchmarks (public API only, warm-up, medians)."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from geograph.pipeline import Candidates

# the folder holding the real sets (scifact/, musique/, BEIR format): $GEOGRAPH_DATA, else ./data
DEFAULT_DATA = Path(os.environ.get("GEOGRAPH_DATA") or "data")


def sync(device: torch.device | str | None = None) -> None:
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize()


def time_calls(
    fn: Callable[[], Any],
    *,
    repeat: int = 5,
    warmup: int = 1,
    min_time: float | None = None,
    device: torch.device | str | None = None,
) -> dict[str, float]:
    """Median and spread (min, max) of timed calls of ``fn`` in seconds, after ``warmup`` untimed calls.

    ``repeat`` timed calls; with ``min_time``, it stops earlier, after at least 3 calls, once
    the timed calls add up to ``min_time`` seconds (slow references: >= 1 s of work instead
    of 5 repeats). The number of timed calls made is returned as ``repeat``.
    """
    for _ in range(warmup):
        fn()
    sync(device)
    times: list[float] = []
    while len(times) < repeat:
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
        if min_time is not None and len(times) >= min(3, repeat) and sum(times) >= min_time:
            break
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "repeat": len(times)}


def commit() -> str | None:
    """The short commit of the checkout this code runs from (``-dirty`` when tracked files
    changed), ``None`` outside a git checkout."""
    import subprocess

    def git(*argv: str) -> str:
        here = Path(__file__).resolve().parent
        done = subprocess.run(["git", *argv], cwd=here, capture_output=True, text=True, check=True, timeout=10)
        return done.stdout.strip()

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "") if head else None
    except (OSError, subprocess.SubprocessError):
        return None


def provenance() -> dict[str, str]:
    """``{"commit", "date"}`` of a benchmark's JSON: :func:`commit` (``unknown`` outside a
    checkout) and the UTC date."""
    import datetime

    return {"commit": commit() or "unknown", "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")}


def write_json(name: str, payload: dict[str, Any], out_dir: str | Path = "bench-results") -> Path:
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    target = path / f"{name}.json"
    target.write_text(json.dumps(payload, indent=2, default=float))
    return target


def dense_candidate_set(data: str | None, split: str, cache: str | None, m: int) -> tuple[Any, Candidates]:
    """Load a BEIR folder (default SciFact), embed it through the cache, take the dense top-``m``.

    Returns:
        ``(dataset, candidates)``: the :class:`~geograph.data.Dataset` and its
        :class:`~geograph.pipeline.Candidates`.
    """
    from geograph.data import Encoder, load_beir
    from geograph.pipeline import dense_candidates, embed

    dataset = load_beir(resolve_data(data, "scifact"), split)
    print(f"{dataset}: embedding (cached)", flush=True)
    corpus, query = embed(dataset, Encoder(cache=cache))
    return dataset, dense_candidates(corpus, query, m)


def resolve_data(path: str | None, name: str) -> Path:
    """``path`` (a folder, or a shipped corpus's name: :func:`~geograph.data.corpus_path`), else
    ``<name>`` in the data folder (``$GEOGRAPH_DATA``, else ``./data``)."""
    from geograph.data import corpus_path

    p = corpus_path(path) if path else DEFAULT_DATA / name
    if not p.is_dir():
        raise SystemExit(f"data folder {p} not found; pass --data DIR (a BEIR-format folder) or set GEOGRAPH_DATA")
    return p


@dataclass
class Split:
    """A data set embedded once, with a tuning split and a reported split of its queries."""

    test: Any  # the full test Dataset (corpus, titles, texts)
    corpus: torch.Tensor
    tune: Any
    tune_q: torch.Tensor
    report: Any
    report_q: torch.Tensor
    protocol: str


def tuning_split(name: str, root: str | Path, encoder: Any) -> Split:
    """The honest protocol: a split that is tuned on and never reported.

    A folder with ``qrels/train.tsv`` (SciFact) is tuned on train and reported on test;
    otherwise (MuSiQue: 100 test queries only) the first half of the test queries is tuned on
    and the second half reported.
    """
    from geograph.data import load_beir

    test = load_beir(root, "test")
    corpus = encoder.encode(test.passages())
    if (Path(root) / "qrels" / "train.tsv").is_file():
        tune = load_beir(root, "train")
        return Split(
            test,
            corpus,
            tune,
            encoder.encode(tune.queries),
            test,
            encoder.encode(test.queries),
            f"tuned on {name} train, reported on test",
        )
    half = len(test.queries) // 2
    q_all = encoder.encode(test.queries)
    return Split(
        test,
        corpus,
        test.query_range(0, half),
        q_all[:half],
        test.query_range(half, len(test.queries)),
        q_all[half:],
        f"tuned on queries [0, {half}), reported on [{half}, {len(test.queries)})",
    )
