"""Embedding and corpus graphs on Ray: equal to the single-process builds, retried past a lost worker.

The tests that need Ray share one local Ray with 2 CPUs, started once per test session (the
``ray_local`` fixture; its start shows as the setup time of the first of them with
``--durations``); they are marked ``integration``. The executor tests without Ray run in the
fast loop: they check that any order of running the tiles gives the single-process graph.
"""

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from conftest import require
from geograph.graphs.corpus_graph import CorpusGraph
from geograph.graphs.g3_graph import G3Graph
from geograph.knn.allpairs import tile_executor


def corpus(n=1200, d=24, seed=0):
    """Clustered unit vectors (topics, as real embeddings), fixed seed."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(12, d, generator=g)
    x = centres[torch.randint(0, 12, (n,), generator=g)] + 0.6 * torch.randn(n, d, generator=g)
    return torch.nn.functional.normalize(x, dim=1)


KNN = {
    "exact": dict(index="exact", chunk_size=256),
    "ivf": dict(index="ivf", nlist=16, nprobe=4, chunk_size=256),
}
G3 = {
    "exact": dict(index="exact", block=256, max_degree=24),
    "ivf-weight": dict(index="ivf", nlist=16, nprobe=4, block=256, max_degree=24, density_sample=300),
    "ivf-cosine": dict(index="ivf", nlist=16, nprobe=4, block=256, max_degree=12, ranking="cosine", candidates=48),
}


def assert_same_knn(a: CorpusGraph, b: CorpusGraph) -> None:
    assert torch.equal(a.edge_index, b.edge_index)
    assert torch.equal(a.embeddings, b.embeddings)


def assert_same_g3(a: G3Graph, b: G3Graph) -> None:
    assert torch.equal(a.crow, b.crow) and torch.equal(a.col, b.col)  # same edges, same order
    torch.testing.assert_close(a.val, b.val, atol=1e-6, rtol=0)
    assert torch.equal(a.density, b.density)  # same rho
    assert a.build_info.get("certified") == b.build_info.get("certified")


# -- any executor: the tiles in another order give the same graph (no Ray needed) --------------
def reversed_executor(fn, shared, items):
    """Runs the tiles last first, on copies of the shared inputs (as a remote worker would)."""
    shared = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in shared.items()}
    for item in reversed(list(items)):
        yield item, fn(shared, item)


reversed_executor.parallelism = 3


@pytest.mark.parametrize("name", KNN)
def test_executor_knn_equals_local(name):
    if name != "exact":
        require("faiss")
    x = corpus()
    with tile_executor(reversed_executor):
        got = CorpusGraph.from_knn(x, 8, **KNN[name])
    assert_same_knn(got, CorpusGraph.from_knn(x, 8, **KNN[name]))


@pytest.mark.parametrize("name", G3)
def test_executor_g3_equals_local(name):
    if name != "exact":
        require("faiss")
    x = corpus()
    with tile_executor(reversed_executor):
        got = G3Graph.build(x, **G3[name])
    assert_same_g3(got, G3Graph.build(x, **G3[name]))


def test_executor_is_scoped_to_the_block():
    calls = []

    def counting(fn, shared, items):
        calls.append(len(items))
        yield from ((i, fn(shared, i)) for i in items)

    x = corpus(600)
    with tile_executor(counting):
        CorpusGraph.from_knn(x, 5, chunk_size=128)
    n = len(calls)
    CorpusGraph.from_knn(x, 5, chunk_size=128)
    assert n >= 1 and calls[0] == 5 and len(calls) == n  # 600 rows / 128 = 5 tiles; nothing after the block


# -- nothing imports Ray unless asked ------------------------------------------------------------
@pytest.mark.integration
def test_import_does_not_load_ray():
    code = (
        "import sys, geograph, geograph.cli, geograph.commands.build_graph, geograph.commands.embed, "
        "geograph.distributed, geograph.bench.scale\n"
        "from geograph.cli import main\n"
        "import contextlib, io\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['--help'])\n"
        "    try:\n"
        "        main(['build-graph', '--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


# -- on a local Ray ------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def ray_local():
    """One local Ray with 2 CPUs for the whole session (its start is this fixture's setup time)."""
    require("ray", "the ray extra")
    from geograph.distributed import ray_session

    with ray_session(num_cpus=2) as session:
        yield session


@pytest.mark.integration
@pytest.mark.parametrize("name", KNN)
def test_ray_knn_equals_single_process(ray_local, name):
    if name != "exact":
        require("faiss")
    from geograph.distributed import knn_graph

    x = corpus()
    got = knn_graph(x, 8, **KNN[name])
    assert got.build_info["ray"]["tasks"] >= 2  # the tiles ran as Ray tasks
    assert_same_knn(got, CorpusGraph.from_knn(x, 8, **KNN[name]))


@pytest.mark.integration
@pytest.mark.parametrize("name", G3)
def test_ray_g3_equals_single_process(ray_local, name):
    if name != "exact":
        require("faiss")
    from geograph.distributed import g3_graph

    x = corpus()
    got = g3_graph(x, **G3[name])
    assert got.build_info["ray"]["tasks"] >= 2
    assert_same_g3(got, G3Graph.build(x, **G3[name]))


def _kill_a_tile_worker(stop: threading.Event, killed: list) -> None:
    """SIGKILL the first Ray worker of this test session seen running a tile (a process this test started)."""
    psutil = require("psutil")
    me = psutil.Process(os.getpid())
    while not stop.is_set() and not killed:
        for p in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if p.name().startswith("ray::geograph_tile"):
                    os.kill(p.pid, signal.SIGKILL)
                    killed.append(p.pid)
                    return
        time.sleep(0.01)


def _build_while_killing(**options):
    from geograph.distributed import knn_graph

    x = corpus(6000, 32, seed=1)
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_a_tile_worker, args=(stop, killed))
    killer.start()
    try:
        graph = knn_graph(x, 10, chunk_size=128, **options)
    finally:
        stop.set()
        killer.join()
    return x, graph, killed


@pytest.mark.integration
def test_ray_build_survives_a_killed_worker(ray_local):
    x, graph, killed = _build_while_killing(max_retries=3)
    assert killed, "no tile worker was seen running: the build finished before the fault could be injected"
    assert_same_knn(graph, CorpusGraph.from_knn(x, 10, chunk_size=128))


@pytest.mark.integration
def test_ray_build_without_retries_fails_clearly(ray_local):
    with pytest.raises(RuntimeError, match=r"failed after 0 retries, so nothing was built") as info:
        _, graph, killed = _build_while_killing(max_retries=0)
    assert "\n" not in str(info.value)


# -- embedding on Ray Data -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory):
    """An embedding cache the Ray embedding test fills and the graph build on Ray then reads: the
    build's own test is the graph's tiles on Ray (run alone, it embeds the corpus first)."""
    return tmp_path_factory.mktemp("ray-demo-cache")


@pytest.mark.integration
@pytest.mark.slow
def test_ray_embedding_equals_encoder_and_the_cli_reads_the_cache(ray_local, tmp_path, demo_cache):
    require("sentence_transformers")
    from geograph.cli import main
    from geograph.data import DEMO_PATH, Encoder, load_demo
    from geograph.distributed import embed_corpus

    data = tmp_path / "demo"
    shutil.copytree(DEMO_PATH, data)
    cache = demo_cache
    if any(cache.iterdir()):  # another test filled it first: this one needs an empty cache
        cache = tmp_path / "cache"
    report = embed_corpus(data, cache=cache, concurrency=2, rows_per_shard=32)
    passages = load_demo().passages()
    assert (report.passages, report.cached, report.encoded) == (111, 0, len(set(passages)))
    assert report.shards >= 2  # one per batch of 32, written by two actors
    found, missing = Encoder(cache=cache).cache.get(passages)
    assert missing == []
    # the encoder's own batch noise: batch 64 vs one text at a time differs by at most 1.7e-7 here
    ref = Encoder(cache=False).encode(passages)
    torch.testing.assert_close(torch.from_numpy(__import__("numpy").stack(found)), ref, atol=1e-6, rtol=0)
    again = embed_corpus(data, cache=cache)  # nothing left to do: Ray is not even asked
    assert (again.cached, again.encoded, again.shards) == (111, 0, 0)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):  # what a user runs next finds them
        assert main(["embed", "--data", str(data), "--cache", str(cache)]) == 0
    assert "111 passages: 111 already cached, 0 encoded" in buf.getvalue(), buf.getvalue()


@pytest.mark.integration
def test_cli_build_graph_on_ray_equals_without(ray_local, tmp_path, demo_cache):
    require("sentence_transformers")
    from geograph.cli import main
    from geograph.data import DEMO_PATH

    cache = demo_cache
    outs = {}
    for label, extra in (("ray", ["--ray"]), ("local", [])):
        out = tmp_path / label
        with contextlib.redirect_stdout(io.StringIO()):
            assert (
                main(
                    [
                        "build-graph",
                        "--data",
                        str(DEMO_PATH),
                        "--g3",
                        "--max-degree",
                        "8",
                        "--cache",
                        str(cache),
                        "--out",
                        str(out),
                        *extra,
                    ]
                )
                == 0
            )
        outs[label] = G3Graph.load(out)
    assert_same_g3(outs["ray"], outs["local"])
    meta = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    assert meta["build_info"]["ray"]["address"] == "local"
    assert "ray" not in json.loads((tmp_path / "local" / "manifest.json").read_text())["build_info"]


@pytest.mark.parametrize(
    "argv, option",
    [
        (["embed", "--data", "nowhere"], "--data"),
        (["embed", "--data", "DEMO", "--concurrency", "2", "--num-gpus", "1"], "--num-gpus"),
        (["embed", "--data", "DEMO", "--ray", "--concurrency", "0"], "--concurrency"),
        (["embed", "--data", "DEMO", "--ray", "--batch-size", "0"], "--batch-size"),
        (["build-graph", "--data", "DEMO", "--knn", "3", "--out", "x", "--ray", "--num-gpus", "-1"], "--num-gpus"),
    ],
)
def test_ray_options_bad_input(argv, option, capsys):
    from geograph.cli import main
    from geograph.data import DEMO_PATH

    argv = [str(DEMO_PATH) if a == "DEMO" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and option in err
