"""Writes the notebooks of this folder (run it after editing the cells below; outputs are not stored).

``python notebooks/build_notebooks.py``. The test suite executes every notebook
(``tests/test_notebooks.py``).
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent

SETUP = """import os
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import matplotlib.pyplot as plt         # figures show inline under Jupyter
import torch
from geograph.data import Encoder, load_demo

data = load_demo()                      # 111 passages, 42 queries (12 single-topic, 30 two-hop), shipped
enc = Encoder()                         # all-MiniLM-L6-v2, offline, cached on disk
corpus = enc.encode(data.passages())
query = enc.encode(data.queries)
print(data, corpus.shape, query.shape)"""

NOTEBOOKS = {
    "quickstart.ipynb": [
        new_markdown_cell(
            "# geograph quickstart\n\nDense retrieval, then the four geometric methods, on the "
            "shipped demo corpus. Everything runs offline on a CPU in seconds."
        ),
        new_code_cell(SETUP),
        new_code_cell("""from geograph import (
    CorpusGraph, DenseRetriever, G3Retriever, ISORetriever, Maniscope, RicciFiltration,
)
from geograph.evaluation import evaluate
from geograph.pipeline import run_ids

dense = DenseRetriever(corpus)(query, k=20)
docs = corpus[dense.indices]                                 # (12, 20, 384) candidates
runs = {"dense": dense.indices}
man = Maniscope(k=5, alpha=0.3)(query, docs)
runs["Maniscope"] = dense.indices.gather(1, man.order)
rf = RicciFiltration()(query, docs)
runs["Ricci-Filtration (kept, by cosine)"] = dense.indices.gather(1, rf.order)
graph = CorpusGraph.from_mentions(corpus, data.titles, data.texts)   # passage -> passage whose title it mentions
runs["ISO-RAG (mention graph)"] = ISORetriever(graph)(query, k=10).indices
runs["G3RAG"] = G3Retriever(corpus)(query, k=5).indices
scores = {"Ricci-Filtration (kept, by cosine)": rf.scores.gather(1, rf.order)}
table = {name: evaluate(run_ids(data, idx, scores.get(name)), data.qrels_list(), ["nDCG@10", "Recall@5"])
         for name, idx in runs.items()}
for name, row in table.items():
    print(f"{name:<38}" + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))
print("Ricci-Filtration keeps", rf.keep.sum(1).tolist(), "of 20 candidates per query")

fig, ax = plt.subplots(figsize=(6, 3))
ax.barh(list(table), [row["nDCG@10"] for row in table.values()])
ax.set_xlabel("nDCG@10 on the demo corpus"); ax.invert_yaxis()
plt.show()"""),
        new_markdown_cell(
            "Returned values are corpus *indices*: `data.doc_ids[i]` is the passage id and "
            "`data.texts[i]` its text (`data.titles[i]` its title)."
        ),
        new_code_cell("""qi = data.query_ids.index("m01")             # a two-hop bridge question
print(data.queries[qi])
for i in runs["ISO-RAG (mention graph)"][qi, :5].tolist():
    print(f"  {data.doc_ids[i]:>8}  {data.titles[i]}: {data.texts[i][:80]}")"""),
    ],
    "ricci_filtration.ipynb": [
        new_markdown_cell(
            "# Ricci-Filtration: flowed query-edge lengths\n\nThe Ricci flow stretches the query "
            "edges of some candidates; the surgery drops those longer than eta = 1."
        ),
        new_code_cell(SETUP),
        new_code_cell("""from geograph import DenseRetriever, RicciFiltration
dense = DenseRetriever(corpus)(query, k=20)
out = RicciFiltration()(query, corpus[dense.indices])
cos = dense.scores
fig, ax = plt.subplots(figsize=(5, 3.5))
ax.scatter(cos[out.keep], out.query_edge_length[out.keep], s=10, label="kept")
ax.scatter(cos[~out.keep], out.query_edge_length[~out.keep], s=10, label="dropped")
ax.axhline(1.0, color="k", lw=0.5)
ax.set_xlabel("cosine to the query"); ax.set_ylabel("flowed query-edge length"); ax.legend()
plt.show()
print("kept per query:", out.keep.sum(1).tolist())
curv = out.query_edge_curvature
print("curvature range of query edges:", float(curv.min()), float(curv.max()))"""),
    ],
    "iso_rag.ipynb": [
        new_markdown_cell(
            "# ISO-RAG: the isoperimetric ratio phi against degree\n\nphi = V(2-hop shell) / "
            "V(closed 1-hop ball) on a passage graph; edges between very different phi are pruned."
        ),
        new_code_cell(SETUP),
        new_code_cell("""from geograph import CorpusGraph, ISORetriever, PoincareProjection
graph = CorpusGraph.from_knn(corpus, 4)
untrained = ISORetriever(graph, beta=0.4)
torch.manual_seed(0)
projected = ISORetriever(graph, projection=PoincareProjection(384, 8, hidden=32), beta=0.4)
deg = graph.degree()
fig, ax = plt.subplots(figsize=(5, 3.5))
ax.scatter(deg, untrained.phi, s=12, label="identity signal")
ax.scatter(deg, projected.phi, s=12, label="random f_theta")
ax.set_xlabel("degree"); ax.set_ylabel("phi"); ax.legend()
plt.show()
print(graph, "pruned share:", round(untrained.pruned_share, 3), round(projected.pruned_share, 3))
print(untrained(query[:3], k=5).indices)"""),
    ],
    "maniscope.ipynb": [
        new_markdown_cell(
            "# Maniscope: geodesic vs cosine\n\nGeodesic distance from the anchor on the "
            "candidates' k-NN graph, against plain cosine to the query."
        ),
        new_code_cell(SETUP),
        new_code_cell("""from geograph import DenseRetriever, Maniscope
dense = DenseRetriever(corpus)(query, k=20)
out = Maniscope(k=5, alpha=0.3)(query, corpus[dense.indices])
finite = torch.isfinite(out.geodesic)
fig, ax = plt.subplots(figsize=(5, 3.5))
ax.scatter(dense.scores[finite], out.geodesic[finite], s=10)
ax.set_xlabel("cosine to the query"); ax.set_ylabel("geodesic distance from the anchor")
plt.show()
print("unreachable candidates:", int((~finite).sum()))"""),
    ],
    "g3rag.ipynb": [
        new_markdown_cell(
            "# G3RAG: the geometric-gain graph\n\nEdge weight x sqrt(1 - x^2) exp(-beta rho_j) "
            "inside the similarity band; one diffusion step from two seeds."
        ),
        new_code_cell(SETUP),
        new_code_cell("""from geograph import G3Graph, G3Retriever
graph = G3Graph.build(corpus, band=(0.1, 0.7), beta=0.4)
fig, ax = plt.subplots(figsize=(5, 3.5))
ax.scatter(graph.density, graph.degree(), s=12)
ax.set_xlabel("normalised density rho"); ax.set_ylabel("out-degree in the band")
plt.show()
out = G3Retriever(graph)(query, k=5)
print(graph)
for q, row in zip(data.queries[:3], out.indices.tolist()):
    print(q, "->", [data.doc_ids[i] for i in row])"""),
    ],
}


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        nb = new_notebook(
            cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
        )
        nbformat.write(nb, HERE / name)


if __name__ == "__main__":
    main()
