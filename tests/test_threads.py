"""Every public module answers the same called from 8 threads at once as called one after another."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from conftest import require
from geograph import (
    CorpusGraph,
    DenseRetriever,
    G3Graph,
    G3Retriever,
    ISORetriever,
    Maniscope,
    PoincareProjection,
    RicciFiltration,
)

ROOT = Path(__file__).resolve().parents[1]
THREADS, REPEATS = 8, 3
V, D = 120, 8


def unit(n: int, seed: int) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(n, D, generator=torch.Generator().manual_seed(seed)), dim=1)


def candidates(seed: int, n: int = 10):
    g = torch.Generator().manual_seed(seed)
    q, docs = torch.randn(4, D, generator=g), torch.randn(4, n, D, generator=g)
    mask = torch.ones(4, n, dtype=torch.bool)
    mask[seed % 4, n - 1 - seed % 3 :] = False  # padding differs by thread
    return q, docs, mask


def tensors(o) -> tuple[torch.Tensor, ...]:
    if isinstance(o, torch.Tensor):
        return (o,)
    return tuple(v for v in vars(o).values() if isinstance(v, torch.Tensor))


def projection() -> PoincareProjection:
    torch.manual_seed(3)
    return PoincareProjection(D, 4, hidden=16)


GRAPH = CorpusGraph.from_knn(unit(V, 0), 4)
WORDS = ["apple", "river", "stone", "cloud", "tiger", "piano", "forest", "copper", "violet", "harbor", "desert"]
PASSAGES = [f"{WORDS[i % 11]} {WORDS[(3 * i) % 11]} near {WORDS[(5 * i + 1) % 11]} number {i}" for i in range(40)]

# name -> (make module, call(module, thread index) -> output)
CASES = {
    "DenseRetriever": (lambda: DenseRetriever(unit(V, 0)), lambda m, i: m(unit(5, 100 + i), 7)),
    "ISORetriever": (lambda: ISORetriever(GRAPH, m=3, L=10, max_nodes=20), lambda m, i: m(unit(5, 100 + i), 5)),
    "ISORetriever+projection": (
        lambda: ISORetriever(GRAPH, projection=projection(), m=3, L=10, max_nodes=20),
        lambda m, i: m(unit(5, 100 + i), 5),
    ),
    "G3Retriever": (lambda: G3Retriever(unit(V, 0), max_degree=8), lambda m, i: m(unit(5, 100 + i), 5)),
    "Maniscope": (lambda: Maniscope(k=3), lambda m, i: m(*candidates(i))),
    "RicciFiltration-exact": (lambda: RicciFiltration(solver="exact", iterations=5), lambda m, i: m(*candidates(i))),
    "RicciFiltration-sinkhorn": (
        lambda: RicciFiltration(solver="sinkhorn", iterations=2),
        lambda m, i: m(*candidates(i, n=6)),
    ),
    "PoincareProjection": (projection, lambda m, i: m(unit(16, 100 + i))),
    "CorpusGraph.from_knn": (lambda: CorpusGraph, lambda m, i: m.from_knn(unit(60, 100 + i), 3).edge_index),
    "G3Graph.build": (lambda: G3Graph, lambda m, i: m.build(unit(60, 100 + i), max_degree=5).transition.to_dense()),
}


def run_concurrently(call, module) -> list[list[tuple[torch.Tensor, ...]]]:
    """Each of THREADS threads makes REPEATS calls on its own input, all released at once."""
    barrier = threading.Barrier(THREADS)
    results: list = [None] * THREADS
    errors: list = []

    def work(i: int) -> None:
        try:
            barrier.wait()
            results[i] = [tensors(call(module, i)) for _ in range(REPEATS)]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def assert_same_as_sequential(call, module) -> None:
    sequential = [tensors(call(module, i)) for i in range(THREADS)]
    assert len({tuple(torch.cat([x.flatten().double() for x in s]).tolist()) for s in sequential}) > 1, (
        "every thread's input gives the same answer: the test would check nothing"
    )
    concurrent = run_concurrently(call, module)
    for i in range(THREADS):
        for rep in concurrent[i]:
            assert len(rep) == len(sequential[i])
            for got, want in zip(rep, sequential[i]):
                assert torch.equal(got, want), f"thread {i}: a concurrent answer differs from the sequential one"


SLOW = {"RicciFiltration-sinkhorn"}  # about 6 s on 2 cores (32 certified flows)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in CASES])
def test_eight_threads_answer_like_sequential_calls(name):
    make, call = CASES[name]
    assert_same_as_sequential(call, make())


def test_bm25_from_threads():
    require("bm25s")
    from geograph.retrievers.bm25 import BM25Retriever

    bm25 = BM25Retriever(PASSAGES)
    assert_same_as_sequential(lambda m, i: m.retrieve([WORDS[i], f"{WORDS[i + 1]} {WORDS[i + 2]} near"], k=5), bm25)


def test_cross_encoder_scorer_from_threads(tiny_cross_encoder):
    from geograph.scorers import CrossEncoderScorer

    scorer = CrossEncoderScorer(tiny_cross_encoder)
    assert_same_as_sequential(lambda m, i: m([f"query {i}", "another"], [PASSAGES[i : i + 3], PASSAGES[:3]]), scorer)


WORKQUEUE_SCRIPT = """
import threading, torch
from geograph import RicciFiltration
import numba
model = RicciFiltration(solver="exact", iterations=5)
def inputs(i):
    g = torch.Generator().manual_seed(i)
    return torch.randn(6, 8, generator=g), torch.randn(6, 12, 8, generator=g)
want = [model(*inputs(i)).query_edge_length for i in range(8)]
barrier = threading.Barrier(8)
got = [None] * 8
def work(i):
    barrier.wait()
    got[i] = [model(*inputs(i)).query_edge_length for _ in range(3)]
ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
assert numba.threading_layer() == "workqueue", numba.threading_layer()
assert all(torch.equal(x, want[i]) for i in range(8) for x in got[i])
print("ok")
"""


@pytest.mark.integration
def test_exact_ricci_from_threads_on_the_workqueue_layer():
    """numba's fallback layer aborts on concurrent parallel launches; the kernel lock prevents them."""
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", WORKQUEUE_SCRIPT], capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=600
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
