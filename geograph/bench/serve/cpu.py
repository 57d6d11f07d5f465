"""Where the machine's CPU goes during a phase of ``geograph bench serve``: the clients (this process),
the server's HTTP front, its inference workers (the encoding apart), the rest of the server's
processes, and everything else on the machine.

On a small machine the clients, the HTTP front and the workers share the same cores, so a
server's rate against the encoder's limit depends on what the others took. The server's
processes are told apart by how LitServe starts them (:func:`roles`); the workers' encoding is
the CPU a text's encoding took when the encoder's limit was measured in the same run (:func:`split`).
"""

from __future__ import annotations

import os
import time
from typing import Any

#: the parts of the machine's CPU a phase reports, in this order
PARTS = ("clients", "front", "workers_encode", "workers_other", "server_other", "outside")


def roles(root: int, workers: int) -> dict[int, str]:
    """The role of each process of the server whose main process is ``root``, by pid: ``workers``
    inference workers (the last processes LitServe spawns), ``front`` (the uvicorn API servers,
    forked from the main process after the workers started) and ``server_other`` (the main
    process, the queue manager, the metrics logger, the resource tracker)."""
    import psutil

    main = psutil.Process(root)
    kids = []
    for p in main.children(recursive=True):
        try:
            kids.append((p.create_time(), p.pid, p.cmdline()))
        except psutil.Error:
            pass
    kids.sort()
    spawned = [(t, pid) for t, pid, cmd in kids if any("multiprocessing.spawn" in c for c in cmd)]
    out = {root: "server_other"}
    out.update({pid: "server_other" for _, pid, _ in kids})
    picked = spawned[-workers:] if workers else []
    out.update({pid: "workers" for _, pid in picked})
    if picked:
        first = min(t for t, _ in picked)
        main_cmd = main.cmdline()
        out.update({pid: "front" for t, pid, cmd in kids if cmd == main_cmd and t > first})
    return out


class CpuMeter:
    """CPU seconds of this process, of each role of a server's processes and of the whole machine,
    between :meth:`start` and :meth:`stop`."""

    def __init__(self, root: int | None, workers: int) -> None:
        self.root, self.workers = root, workers

    def _read(self) -> dict[str, float]:
        import psutil

        def used(p: psutil.Process) -> float:
            t = p.cpu_times()
            return float(t.user + t.system)

        out = dict.fromkeys(("clients", "front", "workers", "server_other"), 0.0)
        out["clients"] = used(psutil.Process())
        if self.root is not None:
            for pid, role in roles(self.root, self.workers).items():
                try:
                    out[role] += used(psutil.Process(pid))
                except psutil.Error:
                    pass
        m = psutil.cpu_times()
        out["machine"] = float(sum(m)) - float(m.idle) - float(getattr(m, "iowait", 0.0))
        out["wall"] = time.monotonic()
        return out

    def start(self) -> None:
        self.before = self._read()

    def stop(self) -> dict[str, float]:
        """Seconds of each part since :meth:`start` (``wall``: the wall seconds)."""
        after = self._read()
        return {k: after[k] - self.before[k] for k in after}


def split(used: dict[str, float], texts: int, cpu_per_text: float, cpus: int) -> dict[str, Any]:
    """The phase's CPU by part (:data:`PARTS`), in seconds and as a share of the machine's
    (wall seconds x ``cpus``).

    ``workers_encode`` is what encoding ``texts`` costs at ``cpu_per_text`` CPU seconds a text
    (measured with the encoder's limit, in the same run; the rest of the workers' time is
    ``workers_other``);
    ``outside`` is the machine's busy time that no process of the measurement took.

    Example:
        >>> used = {"clients": 1.0, "front": 2.0, "workers": 10.0, "server_other": 0.5, "machine": 14.0, "wall": 10.0}
        >>> r = split(used, texts=400, cpu_per_text=0.02, cpus=2)
        >>> r["seconds"]["workers_encode"], r["seconds"]["workers_other"], r["seconds"]["outside"]
        (8.0, 2.0, 0.5)
        >>> r["share"]["clients"]
        0.05
    """
    encode = min(used["workers"], texts * cpu_per_text)
    ours = used["clients"] + used["front"] + used["workers"] + used["server_other"]
    seconds = {
        "clients": used["clients"],
        "front": used["front"],
        "workers_encode": encode,
        "workers_other": used["workers"] - encode,
        "server_other": used["server_other"],
        "outside": max(0.0, used["machine"] - ours),
    }
    capacity = used["wall"] * cpus
    return {
        "seconds": seconds,
        "share": {k: v / capacity for k, v in seconds.items()},
        "capacity_s": capacity,
        "idle_share": max(0.0, 1.0 - sum(seconds.values()) / capacity),
    }


def usable_cpus() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0))
