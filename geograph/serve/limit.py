"""The encoder's limit as ``geograph serve`` runs it: texts/s of request texts encoded by the
server's own path, in as many processes as it has workers, one thread each.

``python -m geograph.serve.limit --batch B --workers W [--repeat R] [--backend NAME] [--encoder DIR]``
reads a JSON list of texts on stdin and prints one JSON line (what :func:`serving_limit` returns);
``geograph bench serve`` runs it (the benchmark drives the server's code from outside).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any


def _serving_worker(
    encoder: str | None, backend: str, share: list[str], batch: int, repeat: int, barrier: Any
) -> list[tuple[float, float]]:
    """One server worker's encoding, in its own process: the wall and the CPU seconds (this process,
    its threads included) of each timed pass over ``share``."""
    import time

    from geograph.serve.corpus import TextEncoder, one_thread

    enc = TextEncoder(encoder, memory=0, backend=backend)
    enc.warm()
    seconds = []
    with one_thread():
        for n in range(repeat + 1):  # the first pass untimed
            barrier.wait()  # the workers encode at the same time, as a loaded server's do
            t, c = time.perf_counter(), time.process_time()
            for start in range(0, len(share), batch):
                # a tag makes every pass's texts new to the tokens the encoder keeps
                enc.encode_requests([f"{x} {n}" for x in share[start : start + batch]])
            seconds.append((time.perf_counter() - t, time.process_time() - c))
    return seconds[1:]


def serving_limit(
    encoder: str | None, texts: list[str], *, batch: int, workers: int, repeat: int, backend: str = "torch"
) -> dict[str, Any]:
    """The encoder's texts/s as the server runs it: ``workers`` processes (one a server worker), each
    with one intra-op thread, encoding its share of ``texts`` in batches of ``batch`` through the
    server's own path (:meth:`geograph.serve.corpus.TextEncoder.encode_requests`: tokenized, padded
    to buckets, nothing cached), all at once; the sum of their rates, median of ``repeat`` passes
    after one untimed pass; ``cpu_s_per_text``, the CPU seconds a text's encoding took (median).

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
    rates = [sum(len(s) / run[n][0] for s, run in zip(shares, runs)) for n in range(repeat)]
    cpu = [sum(run[n][1] for run in runs) / len(texts) for n in range(repeat)]
    return {
        "texts": len(texts),
        "batch_size": batch,
        "workers": workers,
        "threads_per_worker": 1,
        "backend": backend,
        "texts_per_s": statistics.median(rates),
        "spread": [min(rates), max(rates)],
        # CPU seconds a text's encoding takes (all workers' CPU over the texts): what the benchmark
        # counts as the workers' encoding, robust to other load on the machine, unlike the rate
        "cpu_s_per_text": statistics.median(cpu),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m geograph.serve.limit", description=__doc__)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--backend", default="torch")
    p.add_argument("--encoder")
    args = p.parse_args(argv)
    texts = json.loads(sys.stdin.read())
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        p.error("stdin must hold a non-empty JSON list of texts")
    try:
        out = serving_limit(
            args.encoder, texts, batch=args.batch, workers=args.workers, repeat=args.repeat, backend=args.backend
        )
    except ValueError as e:
        p.error(str(e))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
