"""The encoder's limit in ``geograph bench serve``: its batched texts/s in this process, what text
throughput is measured against."""

from __future__ import annotations

import os
from typing import Any


def encoder_limit(encoder: str | None, texts: list[str], repeat: int, backend: str = "torch") -> dict:
    """Batched texts/s of the encoder in this process (batches of 64, distinct texts, warmed up,
    median of ``repeat`` passes), with one torch thread and with all usable CPUs: the better one."""
    import torch

    from geograph.bench.common import time_calls
    from geograph.data import Encoder

    model = Encoder(encoder, cache=False, progress=False, backend=backend).model
    before = torch.get_num_threads()
    runs = {}
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


def _serving_worker(
    encoder: str | None, backend: str, share: list[str], batch: int, repeat: int, barrier: Any
) -> list[float]:
    """One server worker's encoding, in its own process: the seconds of each timed pass over ``share``."""
    import time

    from geograph.serve.corpus import TextEncoder, one_thread

    enc = TextEncoder(encoder, memory=0, backend=backend)
    enc.warm()
    seconds = []
    with one_thread():
        for n in range(repeat + 1):  # the first pass untimed
            barrier.wait()  # the workers encode at the same time, as a loaded server's do
            t = time.perf_counter()
            for start in range(0, len(share), batch):
                # a tag makes every pass's texts new to the tokens the encoder keeps
                enc.encode_requests([f"{x} {n}" for x in share[start : start + batch]])
            seconds.append(time.perf_counter() - t)
    return seconds[1:]


def serving_limit(
    encoder: str | None, texts: list[str], *, batch: int, workers: int, repeat: int, backend: str = "torch"
) -> dict[str, Any]:
    """The encoder's texts/s as the server runs it: ``workers`` processes (one a server worker), each
    with one intra-op thread, encoding its share of ``texts`` in batches of ``batch`` through the
    server's own path (:meth:`geograph.serve.corpus.TextEncoder.encode_requests`: tokenized, padded
    to buckets, nothing cached), all at once; the sum of their rates, median of ``repeat`` passes
    after one untimed pass.

    What a server of ``workers`` workers could answer if it did nothing but encode its request
    texts: the limit ``geograph bench serve`` divides the server's texts/s by.
    """
    import multiprocessing as mp
    import statistics
    from concurrent.futures import ProcessPoolExecutor

    if batch < 1 or workers < 1 or repeat < 1:
        raise ValueError(f"batch, workers and repeat must be >= 1, got {batch}, {workers} and {repeat}")
    shares = [texts[i::workers] for i in range(workers)]
    context = mp.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(workers, mp_context=context) as pool:
        barrier = manager.Barrier(workers)
        runs = list(pool.map(_serving_worker, *zip(*[(encoder, backend, s, batch, repeat, barrier) for s in shares])))
    rates = [sum(len(s) / run[n] for s, run in zip(shares, runs)) for n in range(repeat)]
    return {
        "texts": len(texts),
        "batch_size": batch,
        "workers": workers,
        "threads_per_worker": 1,
        "backend": backend,
        "texts_per_s": statistics.median(rates),
        "spread": [min(rates), max(rates)],
    }
