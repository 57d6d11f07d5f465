"""The bench YAML: reading and checking it, data set folders, grids."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from geograph import configs
from geograph.bench.common import DEFAULT_DATA

DEFAULT_CONFIG = configs.HERE / "bench" / "default.yaml"
KNOWN_KEYS = {"out", "candidates", "metrics", "bootstrap", "speed", "datasets", "methods", "chains", "cache"}
SPEED_DEFAULTS = {
    "batch": 64,
    "single": 16,
    "repeat": 5,
    "min_time": 1.0,
    "reference_repeat": 5,
    "reference_min_time": 1.0,
}


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a bench YAML config (a file or a shipped config's name, see :func:`geograph.configs.resolve`)
    and check it (clear errors for unknown keys and methods).

    ``speed``: ``batch`` and ``single`` (queries timed at B = batch and one by one), ``repeat``
    and ``min_time`` (every timing of ours is warmed up, then repeated ``repeat`` times, or
    fewer but at least 3 once ``min_time`` seconds of work are done), and the same for the
    references (``reference_repeat``, ``reference_min_time``; a repeat is one pass over the
    reference's queries).
    """
    import yaml

    from geograph.bench.run.methods import METHODS

    try:
        path = configs.resolve(path)  # a file, or a shipped config's name (bench/smoke)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    cfg = yaml.safe_load(path.read_text()) or {}
    unknown = set(cfg) - KNOWN_KEYS
    if unknown:
        raise SystemExit(f"{path}: unknown keys {sorted(unknown)}; known: {sorted(KNOWN_KEYS)}")
    cfg.setdefault("out", "bench-results/run")
    cfg.setdefault("candidates", 20)
    cfg.setdefault("metrics", ["nDCG@10", "Recall@5", "Recall@10"])
    cfg.setdefault("bootstrap", {})
    cfg["bootstrap"] = {"samples": 10000, "seed": 0, **cfg["bootstrap"]}
    cfg["speed"] = {**SPEED_DEFAULTS, **(cfg.get("speed") or {})}
    bad_speed = set(cfg["speed"]) - set(SPEED_DEFAULTS)
    if bad_speed:
        raise SystemExit(f"{path}: unknown speed keys {sorted(bad_speed)}; known: {sorted(SPEED_DEFAULTS)}")
    if int(cfg["speed"]["repeat"]) < 1 or int(cfg["speed"]["reference_repeat"]) < 1:
        raise SystemExit(f"{path}: speed repeats must be >= 1")
    cfg.setdefault("datasets", [{"name": "scifact"}])
    cfg.setdefault("methods", {})
    cfg.setdefault("chains", [])
    bad = set(cfg["methods"]) - set(METHODS)
    if bad:
        raise SystemExit(f"{path}: unknown methods {sorted(bad)}; known: {sorted(METHODS)}")
    for chain in cfg["chains"]:
        if len(chain) < 2 or any(m not in cfg["methods"] or METHODS[m].kind != "rerank" for m in chain):
            raise SystemExit(
                f"{path}: chain {chain} must list >= 2 configured rerankers "
                f"({[m for m, c in METHODS.items() if c.kind == 'rerank']})"
            )
    for ds in cfg["datasets"]:
        if "name" not in ds and "path" not in ds:
            raise SystemExit(f"{path}: each data set needs a name (in $GEOGRAPH_DATA) or a path")
        ds.setdefault("primary", cfg["metrics"][0])
        if ds["primary"] not in cfg["metrics"]:
            raise SystemExit(f"{path}: primary metric {ds['primary']!r} is not in metrics {cfg['metrics']}")
    return cfg


def dataset_root(entry: dict[str, Any]) -> tuple[str, Path]:
    """``(name, folder)`` of a config entry: ``name: demo`` is the shipped corpus, other names
    live in the data folder (``$GEOGRAPH_DATA``, else ``./data``), ``path`` is any BEIR folder
    (or a shipped corpus's name: :func:`~geograph.data.corpus_path`)."""
    from geograph.data import SHIPPED_CORPORA, corpus_path

    if "path" in entry:
        root = corpus_path(entry["path"])
        name = entry.get("name", root.name)
    else:
        name = entry["name"]
        root = SHIPPED_CORPORA.get(name, DEFAULT_DATA / name)
    if not (root / "corpus.jsonl").is_file():
        raise SystemExit(f"data set {name!r}: {root} is not a BEIR-format folder (no corpus.jsonl)")
    return name, root


def grid_points(grid: dict[str, Any]) -> list[dict[str, Any]]:
    """All combinations of a ``{name: [values]}`` grid (lists in YAML become tuples)."""
    if not grid:
        return [{}]
    names = list(grid)
    values = [[tuple(v) if isinstance(v, list) else v for v in grid[n]] for n in names]
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]
