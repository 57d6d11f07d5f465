"""Triplets (anchor, graph neighbour, non-neighbour) from a saved CorpusGraph."""
from __future__ import annotations

from typing import Optional

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from geograph import CorpusGraph
from geograph.functional.similarity import normalize


def hard_negatives(graph: CorpusGraph, count: int, *, chunk_size: int = 4096) -> Tensor:
    """``(V, count)`` per node: the most cosine-similar nodes that are neither it nor adjacent.

    ``-1`` where a node has fewer than ``count`` such nodes among its ``count + max_degree``
    nearest. Chunked over rows: memory ``O(chunk_size x V)``.
    """
    v = graph.num_nodes
    z = normalize(graph.embeddings.float())
    width = min(v, count + int(graph.degree().max()) + 1)
    keys = graph.edge_index[0] * v + graph.edge_index[1]
    out = []
    for start in range(0, v, chunk_size):
        rows = torch.arange(start, min(start + chunk_size, v))
        idx = (z[rows] @ z.T).topk(width, dim=1).indices
        bad = (idx == rows.unsqueeze(1)) | torch.isin(rows.unsqueeze(1) * v + idx, keys)
        order = torch.sort(bad.to(torch.int8), dim=1, stable=True).indices[:, :count]
        pick = idx.gather(1, order)
        out.append(torch.where(bad.gather(1, order), torch.full_like(pick, -1), pick))
    return torch.cat(out) if out else torch.zeros(0, count, dtype=torch.long)


class TripletDataset(Dataset):
    """One item per directed edge ``(u, v)``: ``(u, v, w)`` with ``w`` a non-neighbour of ``u``.

    ``w`` is a hard negative (:func:`hard_negatives`) with probability ``hard_ratio`` when ``u``
    has one, else a uniformly random node; a random ``w`` that happens to be ``u`` or adjacent
    is redrawn up to 8 times (then kept: on a dense graph a few easy triplets remain). The
    draws depend on ``(seed, epoch, index)`` only, so any worker layout gives the same data.
    """

    def __init__(self, graph: CorpusGraph, *, hard: Optional[Tensor] = None, hard_ratio: float = 0.5,
                 seed: int = 0) -> None:
        if graph.num_edges == 0:
            raise ValueError("the graph has no edges: no positive pairs to train on")
        self.graph = graph
        self.edges = graph.edge_index.T.contiguous()
        self.keys = torch.sort(graph.edge_index[0] * graph.num_nodes + graph.edge_index[1]).values
        self.hard = hard
        self.hard_ratio = float(hard_ratio)
        self.seed = int(seed)
        self.epoch = 0

    def __len__(self) -> int:
        return self.edges.shape[0]

    def _adjacent(self, u: int, w: int) -> bool:
        key = u * self.graph.num_nodes + w
        at = int(torch.searchsorted(self.keys, torch.tensor(key)))
        return at < self.keys.numel() and int(self.keys[at]) == key

    def __getitem__(self, i: int) -> Tensor:
        u, v = (int(x) for x in self.edges[i])
        gen = torch.Generator().manual_seed(hash((self.seed, self.epoch, i)) & 0x7FFFFFFF)
        if self.hard is not None and float(torch.rand((), generator=gen)) < self.hard_ratio:
            cands = self.hard[u][self.hard[u] >= 0]
            if cands.numel():
                return torch.tensor([u, v, int(cands[torch.randint(cands.numel(), (), generator=gen)])])
        w = u
        for _ in range(8):
            w = int(torch.randint(self.graph.num_nodes, (), generator=gen))
            if w != u and not self._adjacent(u, w):
                break
        return torch.tensor([u, v, w])


class GraphDataModule(L.LightningDataModule):
    """Reads a :class:`~geograph.CorpusGraph` saved with ``CorpusGraph.save`` and serves triplets.

    Args:
        graph_dir: directory written by ``CorpusGraph.save`` (e.g. ``geograph build-graph``).
        batch_size: triplets per step.
        hard_negatives: hard negatives kept per node (0 = random negatives only).
        hard_ratio: share of hard negatives in the triplets.
        val_fraction: share of the edges held out for validation triplet accuracy.
        num_workers: DataLoader workers.
        seed: triplet sampling and split seed.
    """

    def __init__(self, graph_dir: str, *, batch_size: int = 512, hard_negatives: int = 8, hard_ratio: float = 0.5,
                 val_fraction: float = 0.1, num_workers: int = 0, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.graph = CorpusGraph.load(graph_dir)
        self.dim = int(self.graph.embeddings.shape[1])

    def setup(self, stage: Optional[str] = None) -> None:
        hp = self.hparams
        hard = hard_negatives(self.graph, hp.hard_negatives) if hp.hard_negatives > 0 else None
        full = TripletDataset(self.graph, hard=hard, hard_ratio=hp.hard_ratio, seed=hp.seed)
        n_val = int(round(len(full) * hp.val_fraction)) if len(full) > 1 else 0
        perm = torch.randperm(len(full), generator=torch.Generator().manual_seed(hp.seed))
        self.train_set = torch.utils.data.Subset(full, perm[n_val:].tolist())
        self.val_set = torch.utils.data.Subset(full, perm[:n_val].tolist()) if n_val else None
        self.full = full

    def train_dataloader(self) -> DataLoader:
        if self.trainer is not None:
            self.full.epoch = int(self.trainer.current_epoch)
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True,
                          num_workers=self.hparams.num_workers)

    def val_dataloader(self):
        if self.val_set is None:
            return []
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers)
