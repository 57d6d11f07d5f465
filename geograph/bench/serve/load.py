"""The closed-loop load of ``geograph bench serve``: clients that each send their next request when the last
was answered, and the latency summary (req/s, p50 / p99 per kind and overall).

The clients cost the machine as little as remote clients would, since on a small machine they
share its cores with the server they measure: one asyncio loop (aiohttp) for all of them, one
keep-alive connection each, every body serialised before the clock starts and every answer
parsed after it stops. ``geograph bench serve`` reports the CPU seconds they took
(:func:`cpu_seconds`), so a reader knows how much of the machine the measurement itself used.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Sequence
from typing import Any

#: a request: (kind, path, JSON body)
Call = tuple[str, str, dict[str, Any]]
#: its answer: (HTTP status, JSON body or None, seconds)
Answer = tuple[int, Any, float]


def closed_loop(url: str, calls: Sequence[Call], clients: int, timeout: float) -> tuple[list[Answer], float]:
    """Send ``calls`` [(kind, path, body)] from ``clients`` clients, each sending its next call
    when its last one was answered; [(status, body or None, seconds)] in the order of ``calls``
    and the wall seconds of the whole run (bodies serialised before it, answers parsed after it)."""
    bodies = [json.dumps(body).encode() for _, _, body in calls]
    raw, seconds = asyncio.run(_run(url, [c[1] for c in calls], bodies, clients, timeout))
    out: list[Answer] = []
    for status, kind, data, took in raw:
        got = None
        if data is not None and kind.startswith("application/json"):
            try:
                got = json.loads(data)
            except ValueError:
                got = None
        out.append((status, got, took))
    return out, seconds


async def _run(
    url: str, paths: Sequence[str], bodies: Sequence[bytes], clients: int, timeout: float
) -> tuple[list[tuple[int, str, bytes | None, float]], float]:
    """The closed loop on one event loop: [(status, content type, body bytes or None, seconds)] and
    the wall seconds; a request with no answer at all (refused, reset, timed out) counts as a 599."""
    import aiohttp

    n = len(paths)
    out: list[Any] = [None] * n
    nxt = iter(range(n))
    headers = {"Content-Type": "application/json"}
    limit = aiohttp.ClientTimeout(total=timeout)
    width = min(clients, max(1, n))
    connector = aiohttp.TCPConnector(limit=width, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=limit, skip_auto_headers=("User-Agent",)) as s:

        async def client() -> None:
            for i in nxt:  # one shared iterator: each call is taken by exactly one client
                t = time.perf_counter()
                try:
                    async with s.post(url + paths[i], data=bodies[i], headers=headers) as r:
                        data = await r.read()
                        out[i] = (r.status, r.headers.get("Content-Type", ""), data, time.perf_counter() - t)
                except (TimeoutError, aiohttp.ClientError, OSError):
                    out[i] = (599, "", None, time.perf_counter() - t)

        t = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(width)))
        seconds = time.perf_counter() - t
    return out, seconds


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds the process ``pid`` (default: this one) has used so far, its
    threads included."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


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
