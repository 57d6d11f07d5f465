"""Memory-mapped artefacts share their pages between processes (measured from /proc, never timed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from geograph import CorpusGraph
from geograph.artefacts import TENSORS

ROOT = Path(__file__).resolve().parents[1]

#: loads a graph, touches every byte of its tensors, prints what /proc says of its memory, and
#: waits for a line on stdin (so that a second process loads while the first still holds it)
LOADER = """
import json, sys, torch, warnings
from geograph import CorpusGraph
warnings.simplefilter("ignore", DeprecationWarning)
g = CorpusGraph.from_pretrained(sys.argv[1])
touched = float(g.embeddings.sum()) + float(g.edge_index.sum())
mapped = {"Rss": 0, "Pss": 0, "Shared_Clean": 0, "Private_Clean": 0, "Private_Dirty": 0}
inside = False
for line in open("/proc/self/smaps"):
    head = line.split()
    if "-" in head[0] and len(head) >= 5:
        inside = line.rstrip().endswith(sys.argv[2])
    elif inside and head[0].rstrip(":") in mapped:
        mapped[head[0].rstrip(":")] += int(head[1])
rollup = {}
for line in open("/proc/self/smaps_rollup"):
    head = line.split()
    if head[0].rstrip(":") in ("Rss", "Pss", "Shared_Clean", "Private_Clean", "Private_Dirty"):
        rollup[head[0].rstrip(":")] = int(head[1])
print(json.dumps({"file": mapped, "process": rollup}), flush=True)
sys.stdin.readline()
"""


def measure(path: Path, suffix: str) -> list[dict]:
    """Two processes loading ``path`` one after the other, the first still alive: their /proc figures (KiB)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs, out = [], []
    try:
        for _ in range(2):
            p = subprocess.Popen(
                [sys.executable, "-c", LOADER, str(path), suffix],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(p)
            out.append(json.loads(p.stdout.readline()))
    finally:
        for p in procs:
            p.communicate("\n", timeout=60)
    return out


def write_former(path: Path, g: CorpusGraph) -> None:
    """The former layout (two torch.save files and graph.json), for the comparison."""
    path.mkdir()
    torch.save(g.embeddings, path / "embeddings.pt")
    torch.save(g.edge_index, path / "edge_index.pt")
    meta = {"format": 1, "name": g.name, "num_nodes": g.num_nodes, "num_edges": g.num_edges}
    meta.update(dim=int(g.embeddings.shape[1]), build={})
    (path / "graph.json").write_text(json.dumps(meta))


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs /proc/self/smaps (Linux)")
def test_two_processes_share_one_copy_of_a_loaded_graph(tmp_path, capsys):
    v, d = 130_000, 384  # ~200 MB of embeddings
    emb = torch.randn(v, d, generator=torch.Generator().manual_seed(0))
    ring = torch.arange(v)
    g = CorpusGraph(emb, torch.stack([ring, (ring + 1) % v]))
    g.save_pretrained(tmp_path / "new")
    write_former(tmp_path / "old", g)
    del emb, g
    size_kib = (tmp_path / "new" / TENSORS).stat().st_size // 1024
    first, second = measure(tmp_path / "new", TENSORS)
    old = measure(tmp_path / "old", "embeddings.pt")
    with capsys.disabled():
        print(f"\ntensors file: {size_kib} KiB")
        for label, m in (("mapped, 1st", first), ("mapped, 2nd", second), ("torch.load, 1st", old[0])):
            print(f"{label}: file mapping {m['file']}; process {m['process']}")
        print(f"torch.load, 2nd: process {old[1]['process']}")
    # the second process's pages of the file are the first one's: shared, each charged half (Pss)
    assert second["file"]["Rss"] >= 0.95 * size_kib
    assert second["file"]["Shared_Clean"] >= 0.95 * size_kib
    assert second["file"]["Pss"] <= 0.55 * second["file"]["Rss"]
    assert second["file"]["Private_Dirty"] < 0.01 * size_kib
    # the former format reads the tensors into each process's private memory
    assert old[1]["process"]["Private_Dirty"] - second["process"]["Private_Dirty"] >= 0.9 * size_kib
