"""A synthetic G3 graph (random CSR transition, 10 edges a row) over the prepared corpus, in both formats."""

import json
import sys
from pathlib import Path

import torch

from geograph import G3Graph
from geograph.data import Encoder, load_corpus

root = Path(sys.argv[1])
ds = load_corpus(root / "corpus")
enc = Encoder(cache=root / "cache")
emb = enc.encode(ds.passages())
n, deg = emb.shape[0], 10
g = torch.Generator().manual_seed(2)
crow = torch.arange(0, n * deg + 1, deg)
col = torch.randint(0, n, (n * deg,), generator=g).view(n, deg).sort(dim=1).values.reshape(-1)
val = torch.full((n * deg,), 1.0 / deg)
t = torch.sparse_csr_tensor(crow, col, val, (n, n))
graph = G3Graph(emb, t, torch.rand(n, generator=g), band=(0.1, 0.7), beta=0.4, max_degree=deg)
graph.save_pretrained(root / "g3-new", encoder=enc, ids=ds.doc_ids)
old = root / "g3-old"
old.mkdir(exist_ok=True)
torch.save({k: getattr(graph, k) for k in ("embeddings", "density", "crow", "col", "val")}, old / "g3graph.pt")
meta = {"format": 1, "band": [0.1, 0.7], "beta": 0.4, "max_degree": deg, "num_nodes": n, "nnz": n * deg, "dim": 384}
meta.update(files={"g3graph.pt": (old / "g3graph.pt").stat().st_size}, build={})
(old / "g3graph.json").write_text(json.dumps(meta))
print("prepared", graph)
