"""Saved artefacts (CorpusGraph, G3Graph, PoincareProjection, DenseRetriever): atomic saves, one-line load errors."""

from __future__ import annotations

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
from geograph.artefacts import MANIFEST, TENSORS, corpus_fingerprint
from geograph.artefacts import format as artefact_format
from geograph.retrievers import DenseRetriever

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


def dense(seed: int) -> DenseRetriever:
    return DenseRetriever(unit(40, 6, seed))


def graph_state(g: CorpusGraph) -> tuple:
    return g.embeddings, g.edge_index


def g3_state(g: G3Graph) -> tuple:
    return g.embeddings, g.density, g.crow, g.col, g.val


def proj_state(p: PoincareProjection) -> tuple:
    return tuple(p.state_dict().values())


def dense_state(r: DenseRetriever) -> tuple:
    return (r.embeddings,)


# kind -> (build(seed), load(target), state(obj))
KINDS = {
    "CorpusGraph": (corpus_graph, CorpusGraph.from_pretrained, graph_state),
    "G3Graph": (g3_graph, G3Graph.from_pretrained, g3_state),
    "PoincareProjection": (projection, PoincareProjection.from_pretrained, proj_state),
    "DenseRetriever": (dense, DenseRetriever.from_pretrained, dense_state),
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
    real = _io.atomic_save
    count = itertools.count()

    def save(path, fn):
        if next(count) != step:
            return real(path, fn)
        tmp = Path(path).with_name(f".{Path(path).name}.killed.tmp")
        fn(tmp)
        data = tmp.read_bytes()
        tmp.write_bytes(data[: len(data) // 2])
        raise Killed

    monkeypatch.setattr(_io, "atomic_save", save)  # every file: atomic_write calls it too
    monkeypatch.setattr(artefact_format, "atomic_save", save)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_killed_save_never_leaves_a_loadable_mix(kind, tmp_path, monkeypatch):
    """Over a previous save, a save killed at each of its file writes leaves the old artefact or none.

    Loading afterwards gives the old artefact exactly, the new one exactly, or a one-line
    ValueError naming the directory; never a mix of the two saves or a partial file.
    """
    build, load, state = KINDS[kind]
    old, new = build(0), build(1)
    path = tmp_path / "a"
    outcomes = set()
    for step in itertools.count():
        old.save_pretrained(path)
        with monkeypatch.context() as m:
            kill_at_write(m, step)
            try:
                new.save_pretrained(path)
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
            recorded = json.loads((path / MANIFEST).read_text())["corpus"]
            if recorded is not None:  # the manifest is the one written with these tensors
                assert recorded["embeddings_sha256"] == corpus_fingerprint(got[0]).embeddings_sha256, (
                    f"kill at write {step}: the manifest of one save loaded with the tensors of another"
                )
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
graphs[0].save_pretrained(sys.argv[1])
print("saved", flush=True)
i = 1
while True:
    graphs[i % 2].save_pretrained(sys.argv[1])
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
            g = CorpusGraph.from_pretrained(out)
        except ValueError as e:
            assert_one_line_naming(e, out)
        else:
            assert any(same(graph_state(g), graph_state(h)) for h in graphs), "a mix of two saves loaded"


@pytest.mark.parametrize("kind", list(KINDS))
def test_truncated_files(kind, tmp_path):
    build, load, _ = KINDS[kind]
    path = build(0).save_pretrained(tmp_path / "a")
    data, meta = path / TENSORS, path / MANIFEST
    full = data.read_bytes()
    data.write_bytes(full[: len(full) // 2])
    with pytest.raises(ValueError, match="truncated") as e:
        load(path)
    assert_one_line_naming(e.value, data)
    # a manifest that lists no sizes: the safetensors header itself says the file is short
    m = json.loads(meta.read_text())
    m["files"] = {TENSORS: None}
    meta.write_text(json.dumps(m))
    with pytest.raises(ValueError, match="truncated") as e:
        load(path)
    assert_one_line_naming(e.value, data)
    data.write_bytes(full)
    load(path)
    meta.write_text(meta.read_text()[:20])  # truncated manifest
    with pytest.raises(ValueError, match="JSON") as e:
        load(path)
    assert_one_line_naming(e.value, meta)


def test_sizes_that_do_not_match(tmp_path):
    g = corpus_graph(0)
    g.save_pretrained(tmp_path / "g")
    with pytest.raises(ValueError, match="the corpus is 41 x 6") as e:
        CorpusGraph.load(tmp_path / "g", corpus_shape=(41, 6))
    assert_one_line_naming(e.value, tmp_path / "g" / MANIFEST)
    assert same(graph_state(CorpusGraph.load(tmp_path / "g", corpus_shape=(40, 6))), graph_state(g))
    t = g3_graph(0)
    t.save_pretrained(tmp_path / "t")
    with pytest.raises(ValueError, match="the corpus is 40 x 7") as e:
        G3Graph.load(tmp_path / "t", corpus_shape=(40, 7))
    assert_one_line_naming(e.value, tmp_path / "t" / MANIFEST)
    p = projection(0).save_pretrained(tmp_path / "p")
    with pytest.raises(ValueError, match="the corpus has 7") as e:
        PoincareProjection.from_pretrained(p, corpus=unit(5, 7, 0))
    assert_one_line_naming(e.value, p)


def test_a_graph_from_another_kind_or_no_manifest(tmp_path):
    corpus_graph(0).save_pretrained(tmp_path / "g")
    with pytest.raises(ValueError, match="a saved 'CorpusGraph', not a G3Graph") as e:
        G3Graph.from_pretrained(tmp_path / "g")
    assert_one_line_naming(e.value, tmp_path / "g")
    with pytest.raises(ValueError, match="not a saved G3Graph") as e:
        G3Graph.from_pretrained(tmp_path)
    assert_one_line_naming(e.value, tmp_path)


def test_save_leaves_no_temporary_files_and_usual_permissions(tmp_path):
    corpus_graph(0).save_pretrained(tmp_path / "g")
    g3_graph(0).save_pretrained(tmp_path / "t")
    projection(0).save_pretrained(tmp_path / "p")
    names = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert names == [f"{d}/{f}" for d in "gpt" for f in (MANIFEST, TENSORS)]
    umask = os.umask(0)
    os.umask(umask)
    for p in tmp_path.rglob("*"):
        if p.is_file():
            assert p.stat().st_mode & 0o777 == 0o666 & ~umask, p
