"""Graphs and GraphRicciCurvature fixtures shared by the Ricci tests."""

import json
from pathlib import Path

import numpy as np
import torch

from geograph.ops.adjacency import query_graph

REF = Path(__file__).parent / "data" / "graphriccicurvature"  # GraphRicciCurvature 0.6.1 outputs (tests/data/README.md)
SCIFACT = Path(__file__).parent / "data" / "scifact_candidates.npz"


def load_fixture(name):
    return json.loads((REF / name).read_text())


def denominator_case():
    """The weighted karate-club fixture: ``(json, adj (n, n), lengths (n, n) float64)``."""
    d = load_fixture("denominator_case_0.6.1.json")
    weights = edge_dict(d["input_weights"])
    n = 1 + max(max(e) for e in weights)
    lengths = torch.zeros(n, n, dtype=torch.float64)
    for (u, v), w in weights.items():
        lengths[u, v] = lengths[v, u] = w
    return d, dense_adj(weights, n), lengths


def edge_dict(d):
    return {tuple(sorted(map(int, k.split("-")))): v for k, v in d.items()}


def seed_embeddings(seed):
    """The fixture graphs' embeddings, as their ``graph_construction`` describes them."""
    x = np.random.default_rng(seed).standard_normal((21, 384))
    return torch.from_numpy(x / np.linalg.norm(x, axis=1, keepdims=True))


def dense_adj(edges, n):
    adj = torch.zeros(n, n, dtype=torch.bool)
    for u, v in edges:
        adj[u, v] = adj[v, u] = True
    return adj


def scifact_graphs(count=24, top=20):
    """Query graphs of real MiniLM embeddings: SciFact query + its dense top-``top``."""
    data = np.load(SCIFACT)
    q = torch.from_numpy(data["query"][:count].astype(np.float64))
    docs = torch.from_numpy(data["docs"][:count, :top].astype(np.float64))
    return q, docs


def real_adjacency(count=24, top=20):
    q, docs = scifact_graphs(count, top)
    adj, _, _ = query_graph(q, docs)
    return adj


def random_adjacency(rng, count, n, *, p_range=(0.2, 0.7)):
    """Connected random graphs: a random spanning tree plus Erdos-Renyi edges."""
    out = torch.zeros(count, n, n, dtype=torch.bool)
    for b in range(count):
        perm = rng.permutation(n)
        for i in range(1, n):
            u, v = perm[i], perm[rng.integers(0, i)]
            out[b, u, v] = out[b, v, u] = True
        extra = np.triu(rng.random((n, n)) < rng.uniform(*p_range), 1)
        extra = torch.from_numpy(extra | extra.T)
        out[b] |= extra
    out &= ~torch.eye(n, dtype=torch.bool)
    return out


def edges_of(adj):
    return [tuple(e) for e in torch.triu(adj, 1).nonzero().tolist()]
