"""The closed-loop load of ``geograph bench serve``: clients that each send their next request when the last
was answered, and the latency summary (req/s, p50 / p99 per kind and overall)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import Any

#: a request: (kind, path, JSON body)
Call = tuple[str, str, dict[str, Any]]
#: its answer: (HTTP status, JSON body or None, seconds)
Answer = tuple[int, Any, float]


def closed_loop(url: str, calls: Sequence[Call], clients: int, timeout: float) -> tuple[list[Answer], float]:
    """Send ``calls`` [(kind, path, body)] from ``clients`` threads, each sending its next call
    when its last one was answered; [(status, body or None, seconds)] in the order of ``calls``
    and the wall seconds of the whole run."""
    import requests

    out: list[Any] = [None] * len(calls)
    lock = threading.Lock()
    nxt = [0]

    def client() -> None:
        s = requests.Session()
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(calls):
                return
            _, path, body = calls[i]
            t = time.perf_counter()
            try:
                r = s.post(url + path, json=body, timeout=timeout)
                got = r.json() if r.headers.get("content-type", "").startswith("application/json") else None
                out[i] = (r.status_code, got, time.perf_counter() - t)
            except requests.RequestException:
                out[i] = (599, None, time.perf_counter() - t)  # no answer at all counts as a 5xx

    threads = [threading.Thread(target=client, daemon=True) for _ in range(min(clients, max(1, len(calls))))]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return out, time.perf_counter() - t


def quantile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank).

    Example:
        >>> quantile([1, 2, 3, 4], 0.5), quantile(range(1, 101), 0.99)
        (2, 99)
    """
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, math.ceil(len(xs) * q) - 1))] if xs else float("nan")


def summarise(calls: Sequence[Call], got: Sequence[Answer], seconds: float) -> dict[str, Any]:
    """req/s, 5xx, and per kind and overall: count, p50, p99, max (ms), p99/p50.

    ``p99_over_p50`` is over all requests; ``worst_kind_p99_over_p50`` the largest ratio of one
    kind. The kinds differ in work (a ``/rerank`` with eight candidate texts encodes nine texts,
    a ``/retrieve`` one or none), so the overall distribution has two modes and its median can
    fall in the gap between them; the per-kind ratio is the tail of requests of equal work.
    """
    rows: dict[str, dict[str, float]] = {}
    for kind in sorted({c[0] for c in calls}) + ["all"]:
        lat = [g[2] for c, g in zip(calls, got) if kind in ("all", c[0])]
        rows[kind] = {
            "requests": len(lat),
            "p50_ms": 1000 * quantile(lat, 0.5),
            "p99_ms": 1000 * quantile(lat, 0.99),
            "max_ms": 1000 * max(lat),
        }
        rows[kind]["p99_over_p50"] = rows[kind]["p99_ms"] / rows[kind]["p50_ms"]
    codes = [g[0] for g in got]
    return {
        "requests": len(got),
        "seconds": seconds,
        "req_per_s": len(got) / seconds,
        "status_5xx": sum(c >= 500 for c in codes),
        "status_other": sum(c != 200 and c < 500 for c in codes),
        "kinds": rows,
        "p99_over_p50": rows["all"]["p99_over_p50"],
        "worst_kind_p99_over_p50": max(r["p99_over_p50"] for k, r in rows.items() if k != "all"),
    }
