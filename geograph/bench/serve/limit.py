"""The encoder's limit in ``geograph bench serve``: its batched texts/s in this process, what text
throughput is measured against."""

from __future__ import annotations

import os
from typing import Any


def encoder_limit(encoder: str | None, texts: list[str], repeat: int) -> dict[str, Any]:
    """Batched texts/s of the encoder in this process (batches of 64, distinct texts, warmed up,
    median of ``repeat`` passes), with one torch thread and with all usable CPUs: the better one."""
    import torch

    from geograph.bench.common import time_calls
    from geograph.data import Encoder

    model = Encoder(encoder, cache=False, progress=False).model
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
