"""The size of ``geograph serve``'s inference worker pool: workers per device and torch threads per worker,
for the configuration's ``"auto"`` values."""

from __future__ import annotations

import os
from typing import Literal

#: the most inference workers per device ``workers_per_device="auto"`` starts on the CPU (each
#: holds its own copy of the model, the encoder and the corpus; they serve every endpoint)
MAX_AUTO_WORKERS = 4


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def workers_per_device(workers: int | Literal["auto"], accelerator: str) -> int:
    """Inference workers per device (one pool serves every endpoint): ``workers``, or for
    ``"auto"`` one per usable CPU (at most :data:`MAX_AUTO_WORKERS`) when the server runs on the
    CPU, else 1.

    Why: request texts are encoded on one thread per worker (the price of vectors that do not
    depend on batch-mates, :mod:`geograph.serve.corpus`), so one worker leaves the other cores
    idle under text traffic. More busy workers than cores cost throughput (measured by
    ``geograph bench serve``: docs/serving.md, "Load and latency").

    Example:
        >>> workers_per_device(3, "cpu"), workers_per_device("auto", "cpu") == min(usable_cpus(), MAX_AUTO_WORKERS)
        (3, True)
    """
    if workers != "auto":
        return int(workers)
    if accelerator == "auto":
        import torch

        on_cpu = not torch.cuda.is_available() and not (torch.backends.mps.is_available())
    else:
        on_cpu = accelerator == "cpu"
    return max(1, min(usable_cpus(), MAX_AUTO_WORKERS)) if on_cpu else 1


def worker_threads(threads: int | Literal["auto"], workers: int) -> int:
    """torch intra-op threads of each CPU inference worker: ``threads``, or for ``"auto"`` the
    usable CPUs divided among the ``workers`` (at least 1).

    Why: every worker's OpenMP pool spins at its barriers; with more threads than cores (two
    workers of two threads on two cores) a barrier waits for a thread that is not running, and
    a request text's encoding takes about ten times as long, the source of a long p99 tail.

    Example:
        >>> worker_threads(3, 2), worker_threads("auto", 10**6)
        (3, 1)
    """
    if threads != "auto":
        return int(threads)
    return max(1, usable_cpus() // max(1, workers))
