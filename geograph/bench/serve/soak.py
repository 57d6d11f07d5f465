"""The soak of ``geograph bench serve``: mixed requests under load checked against their answers alone, and
the server's memory before and after."""

from __future__ import annotations

import random
from typing import Any

from geograph.bench.serve.load import closed_loop, summarise
from geograph.bench.serve.process import Server
from geograph.bench.serve.workload import Workload

SCORE_TOL = 1e-6


def same_answer(got: Any, want: Any) -> bool:
    """Equal ids / order and dropped lists, scores within 1e-6.

    Example:
        >>> a = {"ids": ["a"], "scores": [0.5], "dropped": []}
        >>> same_answer(a, {"ids": ["a"], "scores": [0.5 + 1e-7], "dropped": []})
        True
    """
    if not isinstance(got, dict) or not isinstance(want, dict):
        return False
    keys = ("ids", "dropped") if "ids" in want else ("order", "dropped")
    if any(got.get(k) != want.get(k) for k in keys):
        return False
    a, b = got.get("scores") or [], want.get("scores") or []
    return len(a) == len(b) and all(abs(x - y) <= SCORE_TOL for x, y in zip(a, b))


def soak(server: Server, work: Workload, n: int, pool: int, clients: int, timeout: float) -> dict[str, Any]:
    """``n`` mixed requests from a pool of ``pool`` whose answers were fetched alone first."""
    import requests

    calls = work.mixed(pool)
    session = requests.Session()
    alone = []
    for _, path, body in calls:  # one at a time: each answer is computed in a batch of one
        r = session.post(server.url + path, json=body, timeout=timeout)
        alone.append((r.status_code, r.json() if r.status_code == 200 else None))
    bad_alone = sum(s != 200 for s, _ in alone)
    rng = random.Random(len(calls))
    warm, _ = closed_loop(server.url, [calls[rng.randrange(pool)] for _ in range(min(n, 2 * pool))], clients, timeout)
    before = server.rss()
    picks = [rng.randrange(pool) for _ in range(n)]
    got, seconds = closed_loop(server.url, [calls[i] for i in picks], clients, timeout)
    after = server.rss()
    wrong = sum(not same_answer(g[1], alone[i][1]) for i, g in zip(picks, got) if g[0] == 200)
    growth = {p: after[p] - before[p] for p in before if p in after}
    out = summarise([calls[i] for i in picks], got, seconds)
    out.update(
        pool=pool,
        alone_not_200=bad_alone,
        wrong=wrong,
        warmup_requests=len(warm),
        rss_before_mb=before,
        rss_after_mb=after,
        rss_growth_mb=growth,
        max_rss_growth_mb=max(growth.values()) if growth else float("nan"),
        processes_gone=sorted(set(before) - set(after)),
    )
    return out
