"""Saved artefacts (CorpusGraph, G3Graph, PoincareProjection): atomic saves, one-line load errors naming the file."""

from __future__ import annotations

import io
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from geograph import CorpusGraph, G3Graph, PoincareProjection, _io

ROOT = Path(__file__).resolve().parents[1]


def unit(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(n, d, generator=torch.Generator().manual_seed(seed)), dim=1)


def corpus_graph(seed: int) -> CorpusGraph:
    return CorpusGraph.from_knn(unit(40, 6, seed), 3)


def g3_graph(seed: int) -> G3Graph:
    return G3Graph.build(unit(40, 6, seed), max_degree=5)


def projection(seed: int) -> PoincareProjection:
    torch.manual_seed(seed)
    return PoincareProjection(6, 3, hidden=8)


def graph_state(g: CorpusGraph) -> tuple:
    return g.embeddings, g.edge_index


def g3_state(g: G3Graph) -> tuple:
    return g.embeddings, g.density, g.crow, g.col, g.val


def proj_state(p: PoincareProjection) -> tuple:
    return tuple(p.state_dict().values())


# kind -> (build(seed), target(tmp_path), save(obj, target), load(target), state(obj))
KINDS = {
    "CorpusGraph": (corpus_graph, lambda t: t / "graph", lambda o, t: o.save(t), CorpusGraph.load, graph_state),
    "G3Graph": (g3_graph, lambda t: t / "g3", lambda o, t: o.save(t), G3Graph.load, g3_state),
    "PoincareProjection": (
        projection,
        lambda t: t / "proj.pt",
        lambda o, t: o.save(t),
        PoincareProjection.load,
        proj_state,
    ),
}


def same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


def assert_one_line_naming(exc: BaseException, path: Path) -> None:
    msg = str(exc)
    assert "\n" not in msg, f"not one line: {msg!r}"
    assert str(path) in msg, f"{path} not named in {msg!r}"


class Killed(BaseException):
    """A simulated SIGKILL: nothing after it runs in the writer (no rename, no clean-up)."""


def kill_at_write(monkeypatch, step: int) -> None:
    """The ``step``-th file write of a save dies after writing half of its bytes to the temporary file."""
    real = _io.atomic_write
    count = itertools.count()

    def write(path, fn):
        if next(count) != step:
            return real(path, fn)
        buf = io.BytesIO()
        fn(buf)
        data = buf.getvalue()
        Path(path).with_name(f".{Path(path).name}.killed.tmp").write_bytes(data[: len(data) // 2])
        raise Killed

    monkeypatch.setattr(_io, "atomic_write", write)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_killed_save_never_leaves_a_loadable_mix(kind, tmp_path, monkeypatch):
    """Over a previous save, a save killed at each of its file writes leaves the old artefact or none.

    Loading afterwards gives the old artefact exactly, the new one exactly, or a one-line
    ValueError naming the file or directory; never a mix of the two saves or a partial file.
    """
    build, target, save, load, state = KINDS[kind]
    old, new = build(0), build(1)
    path = target(tmp_path)
    outcomes = set()
    for step in itertools.count():
        save(old, path)
        with monkeypatch.context() as m:
            kill_at_write(m, step)
            try:
                save(new, path)
                finished = True
            except Killed:
                finished = False
        try:
            got = state(load(path))
        except ValueError as e:
            assert_one_line_naming(e, path)
            outcomes.add("refused")
        else:
            assert same(got, state(old)) or same(got, state(new)), f"kill at write {step}: a mix of two saves loaded"
            outcomes.add("old" if same(got, state(old)) else "new")
        if finished:
            assert outcomes >= {"new"} and step >= 1
            break
    assert "refused" in outcomes or "old" in outcomes  # some kill did land before the save completed


KILL_SCRIPT = """
import sys, torch
from pathlib import Path
from geograph import CorpusGraph
graphs = [CorpusGraph.from_knn(torch.randn(3000, 64, generator=torch.Generator().manual_seed(s)), 4) for s in (0, 1)]
graphs[0].save(sys.argv[1])
print("saved", flush=True)
i = 1
while True:
    graphs[i % 2].save(sys.argv[1])
    i += 1
"""


@pytest.mark.integration
@pytest.mark.slow
def test_sigkill_during_saves(tmp_path):
    """A process saving two graphs in turn into one directory, SIGKILLed at a few moments."""
    graphs = [
        CorpusGraph.from_knn(torch.randn(3000, 64, generator=torch.Generator().manual_seed(s)), 4) for s in (0, 1)
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for delay in (0.05, 0.23):
        out = tmp_path / f"g{delay}"
        proc = subprocess.Popen(
            [sys.executable, "-c", KILL_SCRIPT, str(out)], env=env, stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout.readline().strip() == "saved"
            time.sleep(delay)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        try:
            g = CorpusGraph.load(out)
        except ValueError as e:
            assert_one_line_naming(e, out)
        else:
            assert any(same(graph_state(g), graph_state(h)) for h in graphs), "a mix of two saves loaded"


def saved(kind, tmp_path):
    """A graph of ``kind`` saved under ``tmp_path``: its directory, loader, data file and metadata file."""
    build, target, save, load, _ = KINDS[kind]
    path = target(tmp_path)
    save(build(0), path)
    data = path / ("embeddings.pt" if kind == "CorpusGraph" else "g3graph.pt")
    return path, load, data, path / ("graph.json" if kind == "CorpusGraph" else "g3graph.json")


@pytest.mark.parametrize("kind", ["CorpusGraph", "G3Graph"])
def test_truncated_files(kind, tmp_path):
    path, load, data, meta = saved(kind, tmp_path)
    full = data.read_bytes()
    data.write_bytes(full[: len(full) // 2])
    with pytest.raises(ValueError, match="truncated") as e:
        load(path)
    assert_one_line_naming(e.value, data)
    # a file written before the sizes were recorded: torch's own error, on one line, naming the file
    m = json.loads(meta.read_text())
    del m["files"]
    meta.write_text(json.dumps(m))
    with pytest.raises(ValueError, match="cannot read") as e:
        load(path)
    assert_one_line_naming(e.value, data)
    data.write_bytes(full)
    load(path)
    meta.write_text(meta.read_text()[:20])  # truncated metadata
    with pytest.raises(ValueError, match="JSON") as e:
        load(path)
    assert_one_line_naming(e.value, meta)


def test_truncated_projection(tmp_path):
    path = projection(0).save(tmp_path / "p.pt")
    full = path.read_bytes()
    path.write_bytes(full[: len(full) - 100])
    with pytest.raises(ValueError, match="cannot read") as e:
        PoincareProjection.load(path)
    assert_one_line_naming(e.value, path)


@pytest.mark.parametrize("kind", ["CorpusGraph", "G3Graph"])
def test_other_format_version(kind, tmp_path):
    path, load, _, meta = saved(kind, tmp_path)
    m = json.loads(meta.read_text())
    m["format"] = 2
    meta.write_text(json.dumps(m))
    with pytest.raises(ValueError, match="format 2, this geograph reads format 1") as e:
        load(path)
    assert_one_line_naming(e.value, meta)


def test_projection_format_version(tmp_path):
    p = projection(0)
    path = p.save(tmp_path / "p.pt")
    assert torch.load(path, weights_only=True)["format"] == 1
    blob = {"kind": "PoincareProjection", "format": 2, "config": p.config(), "state_dict": p.state_dict()}
    torch.save(blob, path)
    with pytest.raises(ValueError, match="format 2, this geograph reads format 1") as e:
        PoincareProjection.load(path)
    assert_one_line_naming(e.value, path)
    del blob["format"]  # written before the format was recorded: format 1
    torch.save(blob, path)
    assert same(proj_state(PoincareProjection.load(path)), proj_state(p))


def test_sizes_that_do_not_match(tmp_path):
    g = corpus_graph(0)
    g.save(tmp_path / "g")
    with pytest.raises(ValueError, match="the corpus is 41 x 6") as e:
        CorpusGraph.load(tmp_path / "g", corpus_shape=(41, 6))
    assert_one_line_naming(e.value, tmp_path / "g" / "graph.json")
    assert same(graph_state(CorpusGraph.load(tmp_path / "g", corpus_shape=(40, 6))), graph_state(g))
    # embeddings of another corpus, saved in place of these (the recorded size updated too)
    meta = json.loads((tmp_path / "g" / "graph.json").read_text())
    torch.save(unit(39, 6, 5), tmp_path / "g" / "embeddings.pt")
    meta["files"]["embeddings.pt"] = (tmp_path / "g" / "embeddings.pt").stat().st_size
    (tmp_path / "g" / "graph.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"expected \(40, 6\)") as e:
        CorpusGraph.load(tmp_path / "g")
    assert_one_line_naming(e.value, tmp_path / "g" / "embeddings.pt")

    t = g3_graph(0)
    t.save(tmp_path / "t")
    with pytest.raises(ValueError, match="the corpus is 40 x 7") as e:
        G3Graph.load(tmp_path / "t", corpus_shape=(40, 7))
    assert_one_line_naming(e.value, tmp_path / "t" / "g3graph.pt")
    blob = torch.load(tmp_path / "t" / "g3graph.pt", weights_only=True)
    blob["density"] = blob["density"][:-1]
    torch.save(blob, tmp_path / "t" / "g3graph.pt")
    meta = json.loads((tmp_path / "t" / "g3graph.json").read_text())
    meta["files"]["g3graph.pt"] = (tmp_path / "t" / "g3graph.pt").stat().st_size
    (tmp_path / "t" / "g3graph.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="density has shape") as e:
        G3Graph.load(tmp_path / "t")
    assert_one_line_naming(e.value, tmp_path / "t" / "g3graph.pt")

    p = projection(0)
    path = p.save(tmp_path / "p.pt")
    with pytest.raises(ValueError, match="the corpus has 7") as e:
        PoincareProjection.load(path, in_dim=7)
    assert_one_line_naming(e.value, path)
    blob = torch.load(path, weights_only=True)
    blob["config"]["hidden"] = 9  # weights of another shape than the configuration
    torch.save(blob, path)
    with pytest.raises(ValueError, match="do not fit the saved configuration.*size mismatch") as e:
        PoincareProjection.load(path)
    assert_one_line_naming(e.value, path)


def test_save_leaves_no_temporary_files_and_usual_permissions(tmp_path):
    corpus_graph(0).save(tmp_path / "g")
    g3_graph(0).save(tmp_path / "t")
    projection(0).save(tmp_path / "p.pt")
    names = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert names == ["edge_index.pt", "embeddings.pt", "g3graph.json", "g3graph.pt", "graph.json", "p.pt"]
    umask = os.umask(0)
    os.umask(umask)
    for p in tmp_path.rglob("*"):
        if p.is_file():
            assert p.stat().st_mode & 0o777 == 0o666 & ~umask, p
