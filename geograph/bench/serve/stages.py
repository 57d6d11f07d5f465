"""Where a served request's time goes, from the server's own timings: ``geograph bench serve`` reads
``geograph_stage_seconds`` (:mod:`geograph.serve.prometheus`) from ``/metrics`` before and after a
phase of load, and reports each stage's mean seconds a request over that phase."""

from __future__ import annotations

import re

__all__ = ["STAGES", "Snapshot", "breakdown", "parse_stages", "read_stages"]

#: the stages the server times, in the order of a request's life (:data:`geograph.serve.api.STAGES`)
STAGES = ("queue", "tokenise", "encode", "method", "serialise")

#: ``(endpoint, stage) -> (sum of seconds, count)``
Snapshot = dict[tuple[str, str], tuple[float, float]]

_LINE = re.compile(
    r'^geograph_stage_seconds_(sum|count)\{(?=[^}]*endpoint="(?P<endpoint>[^"]*)")'
    r'(?=[^}]*stage="(?P<stage>[^"]*)")[^}]*\}\s+(?P<value>\S+)$'
)


def parse_stages(text: str) -> Snapshot:
    """The stage sums and counts of a ``/metrics`` body (Prometheus text format).

    Example:
        >>> body = '''geograph_stage_seconds_sum{endpoint="/retrieve",stage="encode"} 1.5
        ... geograph_stage_seconds_count{endpoint="/retrieve",stage="encode"} 3.0'''
        >>> parse_stages(body)
        {('/retrieve', 'encode'): (1.5, 3.0)}
    """
    out: dict[tuple[str, str], list[float]] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m is None:
            continue
        row = out.setdefault((m["endpoint"], m["stage"]), [0.0, 0.0])
        row[0 if m.group(1) == "sum" else 1] += float(m["value"])
    return {key: (row[0], row[1]) for key, row in out.items()}


def read_stages(url: str, timeout: float = 30.0) -> Snapshot:
    """The stage sums and counts ``url/metrics`` reports now (empty when the server has no metrics)."""
    import requests

    try:
        r = requests.get(url.rstrip("/") + "/metrics", timeout=timeout)
    except requests.RequestException:
        return {}
    return parse_stages(r.text) if r.status_code == 200 else {}


def breakdown(before: Snapshot, after: Snapshot) -> dict[str, dict[str, float]]:
    """Per endpoint, each stage's mean milliseconds a request between two snapshots, and their total.

    Example:
        >>> b = {("/retrieve", "encode"): (1.0, 2.0)}
        >>> a = {("/retrieve", "encode"): (2.0, 6.0), ("/retrieve", "queue"): (0.4, 4.0)}
        >>> breakdown(b, a)
        {'/retrieve': {'queue': 100.0, 'encode': 250.0, 'total': 350.0}}
    """
    out: dict[str, dict[str, float]] = {}
    for endpoint in sorted({e for e, _ in after}):
        row: dict[str, float] = {}
        for stage in STAGES:
            s1, n1 = after.get((endpoint, stage), (0.0, 0.0))
            s0, n0 = before.get((endpoint, stage), (0.0, 0.0))
            if n1 - n0 > 0:
                row[stage] = 1000.0 * (s1 - s0) / (n1 - n0)
        if row:
            row["total"] = sum(row.values())
            out[endpoint] = row
    return out
