"""Synthetic corpus, a pre-filled embedding cache (both cache layouts) and a graph in both formats."""

import json
import sys
from pathlib import Path

import torch

from geograph import CorpusGraph
from geograph.data import EmbeddingCache, Encoder, load_corpus

n, root = int(sys.argv[1]), Path(sys.argv[2])
(root / "corpus").mkdir(parents=True, exist_ok=True)
with open(root / "corpus" / "corpus.jsonl", "w") as f:
    for i in range(n):
        f.write(json.dumps({"_id": f"d{i}", "title": "", "text": f"synthetic passage number {i}"}) + "\n")
ds = load_corpus(root / "corpus")
texts = ds.passages()
emb = torch.nn.functional.normalize(torch.randn(n, 384, generator=torch.Generator().manual_seed(0)), dim=1)
enc = Encoder(cache=root / "cache")
for cache in (
    enc.cache,
    EmbeddingCache(enc.model_name, root / "cache"),
):  # this layout, and the former (no weights key)
    for s in range(0, n, 50_000):
        cache.put(texts[s : s + 50_000], emb[s : s + 50_000].numpy())
g = torch.Generator().manual_seed(1)
src = torch.arange(n).repeat_interleave(10)
dst = torch.randint(0, n, (n * 10,), generator=g)
graph = CorpusGraph(emb, torch.stack([src, dst]), name="random10")
graph.save_pretrained(root / "graph-new", encoder=enc, ids=ds.doc_ids)
old = root / "graph-old"
old.mkdir(exist_ok=True)
torch.save(graph.embeddings, old / "embeddings.pt")
torch.save(graph.edge_index, old / "edge_index.pt")
meta = {"format": 1, "name": graph.name, "num_nodes": n, "num_edges": graph.num_edges, "dim": 384, "build": {}}
meta["files"] = {k: (old / k).stat().st_size for k in ("embeddings.pt", "edge_index.pt")}
(old / "graph.json").write_text(json.dumps(meta))
print("prepared", n, graph)
