"""The encoder's limit in ``geograph bench serve``: its batched texts/s in this process, what text
throughput is measured against."""

from __future__ import annotations

import os
from typing import Any


def encoder_limit(encoder: str | None, texts: list[str], repeat: int, backend: str = "torch") -> dict[str, Any]:
    """Batched texts/s of the encoder in this process (batches of 64, distinct texts, warmed up,
    median of ``repeat`` passes), with one torch thread and with all usable CPUs: the better one."""
    import torch

    from geograph.bench.common import time_calls
    from geograph.data import Encoder

    model = Encoder(encoder, cache=False, progress=False, backend=backend).model
    before = torch.get_num_threads()
    runs: dict[int, dict[str, Any]] = {}
    try:
        for n in sorted({1, len(os.sched_getaffinity(0))}):
            torch.set_num_threads(n)
            t = time_calls(
                lambda: model.encode(texts, batch_size=64, normalize_embeddings=True), repeat=repeat, warmup=1
            )
            runs[n] = {
                "texts_per_s": len(texts) / t["median"],
                "spread": [len(texts) / t["max"], len(texts) / t["min"]],
            }
    finally:
        torch.set_num_threads(before)
    best = max(runs, key=lambda n: runs[n]["texts_per_s"])
    return {
        "texts": len(texts),
        "batch_size": 64,
        "threads": best,
        "texts_per_s": runs[best]["texts_per_s"],
        "by_threads": runs,
    }


def serving_limit(
    encoder: str | None, texts: list[str], *, batch: int, workers: int, repeat: int, backend: str = "torch"
) -> dict[str, Any]:
    """The encoder's texts/s as the server runs it (:func:`geograph.serve.limit.serving_limit`: its
    workers, one thread each, its bucketed encoding of request texts), measured in a subprocess
    (``python -m geograph.serve.limit``: the benchmark drives the server's code from outside, as
    it does the server)."""
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "geograph.serve.limit", "--batch", str(batch), "--workers", str(workers)]
    cmd += ["--repeat", str(repeat), "--backend", backend] + ([] if encoder is None else ["--encoder", encoder])
    done = subprocess.run(cmd, input=json.dumps(texts), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the serving limit failed: {done.stderr.strip()[-2000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out
