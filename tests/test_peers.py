"""The k-NN peers comparison of ``geograph bench scale --peers``: each builder's lists on small data
(shape, ids, the row itself left out) and their recall, against brute-force numpy neighbours."""

import argparse
import importlib.util
import os

import numpy as np
import pytest
import torch

from conftest import require
from geograph.bench.scale.peers import default_peer_nlist, drop_self, run_peer
from geograph.bench.scale.peers_compare import (
    add_peer_args,
    compare_peers,
    exact_rows_numpy,
    frontier,
    numpy_recall,
    peer_tasks,
)

require("faiss")

#: where the peers installed apart live (``pip install --target``), if anywhere
PEER_PATH = os.environ.get("GEOGRAPH_PEER_PATH", "/tmp/peers-pkgs")


def corpus(n=3000, d=24, topics=30, seed=0):
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((topics, d))
    x = c[rng.integers(topics, size=n)] + 0.6 * rng.standard_normal((n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def brute(x, k):
    """Every row's exact top-k other rows by a float64 stable sort (ties lowest index)."""
    s = x.astype(np.float64) @ x.astype(np.float64).T
    np.fill_diagonal(s, -np.inf)
    return np.argsort(-s, axis=1, kind="stable")[:, :k]


def brute_recall(ids, ref):
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(ids, ref)]))


def args_for(builders, **over):
    p = argparse.ArgumentParser()
    add_peer_args(p)
    extra = [f"--peer-path={PEER_PATH}"] if os.path.isdir(PEER_PATH) else []
    args = p.parse_args(["--peer-builders", *builders, *extra])
    args.check_rows, args.gauss_max = 400, 10**9
    for k, v in over.items():
        setattr(args, k, v)
    return args


def installed(module):
    import sys

    if os.path.isdir(PEER_PATH) and PEER_PATH not in sys.path:
        sys.path.append(PEER_PATH)
    return importlib.util.find_spec(module) is not None


CONFIGS = {
    "geograph": ({}, [{"recall_target": 0.95}, {"nprobe": 4}]),
    "faiss-hnsw": ({"M": 16, "efConstruction": 40}, [{"efSearch": 16}, {"efSearch": 64}]),
    "faiss-ivf": ({"nlist": None}, [{"nprobe": 1}, {"nprobe": 8}]),
    "pynndescent": ({}, [{"n_neighbors": 15}]),
    "usearch": ({}, [{"expansion_search": 32}, {"expansion_search": 128}]),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_each_builder_lists_k_other_rows_and_finds_the_exact_neighbours(name, tmp_path):
    module = {"pynndescent": "pynndescent", "usearch": "usearch"}.get(name)
    if module is not None and not installed(module):
        pytest.skip(f"{module} is not installed (pip install geograph-rag[peers], or GEOGRAPH_PEER_PATH)")
    if name == "pynndescent" and os.environ.get("GEOGRAPH_SLOW_PEERS") is None:
        pytest.skip("pynndescent compiles its numba kernels for minutes: set GEOGRAPH_SLOW_PEERS=1")
    x, k = corpus(), 10
    ref = brute(x, k)
    build, searches = CONFIGS[name]
    out: dict = {}
    run_peer(dict(builder=name, build=build, search=searches, k=k, threads=1, out=str(tmp_path / "l")), x, out)
    assert "missing" not in out and len(out["configs"]) == len(searches)
    recalls = []
    for cfg in out["configs"]:
        ids = np.load(cfg["lists"])
        assert ids.shape == (len(x), k) and ids.dtype == np.int64
        assert ids.min() >= -1 and ids.max() < len(x)
        assert not (ids == np.arange(len(x))[:, None]).any()  # never the row itself
        real = np.where(ids >= 0, ids, len(x) + np.arange(k))  # -1 slots aside, no id twice in a row
        assert all(len(set(r)) == k for r in real)
        assert cfg["build_seconds"] >= 0 and cfg["search_seconds"] >= 0
        recalls.append(brute_recall(ids, ref))
    assert max(recalls) >= 0.95, recalls  # the most accurate setting of each builder is near exact here
    if name in ("faiss-ivf", "faiss-hnsw"):  # more probes / a wider beam never find less here
        assert recalls[0] <= recalls[-1]


@pytest.mark.slow
@pytest.mark.integration
def test_compare_peers_recall_is_numpys_and_the_frontier_is_not_dominated(tmp_path):
    x = corpus(seed=1)
    args = args_for(
        ["geograph", "faiss-ivf", "faiss-hnsw"],
        ivf_nprobe=[1, 2, 16],
        hnsw_ef=[16, 64],
        geograph_targets=[0.98],
        repeats=2,
    )
    res = compare_peers(x, args, tmp_path, "t")
    assert res["N"] == len(x) and res["k"] == 10 and res["check_rows"] == 400
    assert res["matmul_gflops"]["square_2048"] > 0
    keys = set(res["configs"])
    assert {"faiss-ivf nprobe=1", "faiss-ivf nprobe=16", "geograph recall_target=0.98"} <= keys
    rows = np.sort(np.random.default_rng(1).choice(len(x), size=400, replace=False))
    ref = brute(x, 10)[rows]
    ivf1 = res["configs"]["faiss-ivf nprobe=1"]
    assert ivf1["recall"] < 0.97  # a single list misses neighbours: the recall can fail
    assert res["configs"]["faiss-ivf nprobe=16"]["recall"] == 1.0
    geo = res["configs"]["geograph recall_target=0.98"]
    assert geo["recall"] >= 0.975 and geo["report"]["recall_target"] == 0.98  # about the target (sampled rows)
    assert geo["join_gflops"] > 0 and geo["flops"]["join"] > 0 and geo["matmul_gflops"] > 0
    assert geo["rates"]["join % matmul"] == pytest.approx(100 * geo["join_gflops"] / geo["matmul_gflops"])
    assert len(geo["seconds_all"]) == 2 and geo["seconds"] == pytest.approx(float(np.median(geo["seconds_all"])))
    assert [v["target"] for v in res["verdicts"]] == [0.98]
    for c in res["configs"].values():
        assert min(c["seconds_all"]) <= c["seconds"] <= max(c["seconds_all"]) and c["peak_rss_mb"] > 0
    # the frontier: no configuration of the same builder is at least as fast and strictly more accurate
    for name in ("geograph", "faiss-ivf", "faiss-hnsw"):
        pts = {key: c for key, c in res["configs"].items() if c["builder"] == name}
        front = res["builders"][f"{name} frontier"]["frontier"]
        for key in front:
            assert not any(
                o["seconds"] <= pts[key]["seconds"] and o["recall"] > pts[key]["recall"] for o in pts.values()
            )
    assert exact_rows_numpy(x, rows, 10).tolist() == ref.tolist()


def test_recall_against_numpy_neighbours_and_a_bent_list():
    x = corpus(800, seed=2)
    rows = np.arange(0, 800, 7)
    ref = brute(x, 10)
    assert numpy_recall(ref, rows, ref[rows]) == 1.0
    bent = ref.copy()
    bent[:, 0] = (bent[:, 0] + 1) % 800  # one of ten wrong (unless the shifted id is another neighbour)
    want = brute_recall(bent[rows], ref[rows])
    assert numpy_recall(bent, rows, ref[rows]) == pytest.approx(want) and want < 1.0


def test_helpers():
    ids = np.array([[3, 0, 1], [0, 1, 2], [2, 1, 0]])
    assert drop_self(ids, 2).tolist() == [[3, 1], [0, 2], [1, 0]]
    assert frontier([{"name": "a", "seconds": 2, "recall": 0.9}, {"name": "b", "seconds": 1, "recall": 0.95}]) == ["b"]
    assert default_peer_nlist(1_000_000) == 4096 and default_peer_nlist(100) == 2
    now = torch.get_num_threads()  # a count equal to this process's is the default build, not another
    tasks = peer_tasks(args_for(list(CONFIGS), geograph_targets=[0.9, 0.98], geograph_threads=[now, now + 1, now + 6]))
    assert [t[0] for t in tasks][:2] == ["geograph", "geograph"]  # a build per recall target, each its own process
    threads = [t[1].get("threads") for t in tasks if t[0] == "geograph"]
    assert threads == [None, None, now + 1, now + 1, now + 6, now + 6]  # and per thread count
    assert [len(t[2]) for t in tasks if t[0] == "faiss-hnsw"] == [4]  # efSearch values share one build


@pytest.mark.slow
@pytest.mark.integration
def test_peers_report_writes_the_json_and_the_table(tmp_path, capsys):
    import json

    from geograph.bench.scale.generators import fit_generators
    from geograph.bench.scale.peers_compare import peers_report

    model = fit_generators(corpus(2000, d=16, seed=3), clusters=16)
    args = args_for(
        ["faiss-ivf"], ivf_nprobe=[1, 4], sizes=[1500], generators=["mixture"], out=str(tmp_path), repeats=1
    )
    assert peers_report(args, model, {"threads": 1}) == 0
    res = json.loads((tmp_path / "scale-peers.json").read_text())["peers"]["mixture-1500"]
    assert set(res["configs"]) == {"faiss-ivf nprobe=1", "faiss-ivf nprobe=4"} and res["N"] == 1500
    table = (tmp_path / "scale-peers.md").read_text()
    assert "commit " in table and "UTC" in table and "target 0.99: geograph did not run" in table
    assert "faiss-ivf nprobe=4" in table and "GFLOP/s" in table and "faiss-ivf nprobe=4" in capsys.readouterr().out
