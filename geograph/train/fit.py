"""Fitting f_theta on a corpus graph in one call (the benchmarks' path; ``python -m train fit``
is the configurable one)."""

from __future__ import annotations

import torch

from geograph.graphs.corpus_graph import CorpusGraph
from geograph.projection import PoincareProjection


def train_projection(graph: CorpusGraph, *, epochs: int, seed: int = 0) -> PoincareProjection:
    """f_theta (32-d, hidden 256, lr 3e-3) fitted on ``graph`` alone by Lightning on the CPU:
    triplets with 8 hard negatives per node, new negatives every epoch (:func:`~geograph.train.data.triplet_loader`),
    batch 1024.

    Args:
        graph: the corpus graph (embeddings ``(V, D)`` and edges) to fit on.
        epochs: training epochs.
        seed: seeds the initialisation and the negative draws.

    Returns:
        The projection, in eval mode.
    """
    import lightning as L

    from geograph.train.data import TripletDataset, hard_negatives, triplet_loader
    from geograph.train.module import PoincareModule

    torch.manual_seed(seed)
    model = PoincareModule(in_dim=int(graph.embeddings.shape[1]), out_dim=32, hidden=256, lr=3e-3)
    model.attach(graph)
    data = TripletDataset(graph, hard=hard_negatives(graph, 8), seed=seed)
    loader = triplet_loader(data, batch_size=1024, seed=seed)  # new negatives every epoch
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=loader)
    return model.projection.eval()
