"""Adding and removing passages of a :class:`~geograph.DenseRetriever` in place.

The exact scan reads the embeddings buffer, so an update is the new buffer: the same module a
constructor given the final corpus makes. An IVF index already built keeps its trained
cells: new passages are added to the faiss lists and removed ones dropped with
``remove_ids``; faiss labels stay fixed while rows are renumbered, so a label-to-row table maps
the index's answers to rows. Its recall against the exact scan is what the build's is, as long
as the new passages resemble the ones the cells were trained on (measured in the tests).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from geograph.graphs.updates import PassageId, UpdateReport, check_new_rows, passage_ids
from geograph.ops.similarity import normalize

if TYPE_CHECKING:
    from geograph.methods.dense.module import DenseRetriever

__all__ = ["dense_add", "dense_remove", "labels_to_rows"]


def labels_to_rows(model: DenseRetriever, labels: Tensor) -> Tensor:
    """The rows of faiss labels (``-1`` stays ``-1``): the identity until an update renumbers rows."""
    table = getattr(model, "_ivf_rows", None)
    if table is None:
        return labels
    table = table.to(labels.device)
    return torch.where(labels >= 0, table[labels.clamp_min(0)], labels)


def dense_add(model: DenseRetriever, embeddings: Tensor, ids: Sequence[PassageId]) -> UpdateReport:
    """:meth:`geograph.DenseRetriever.add`."""
    t0 = time.perf_counter()
    check_new_rows(embeddings, model.embeddings)
    known = passage_ids(model, model.num_passages)
    new = known.check_new(ids, embeddings.shape[0])
    n, m = model.num_passages, len(new)
    z = normalize(embeddings)
    if model._ivf is not None:
        table = getattr(model, "_ivf_rows", None)
        if table is None:
            table = torch.arange(n)
        labels = torch.arange(len(table), len(table) + m)
        model._ivf.add_with_ids(z.detach().float().cpu().contiguous().numpy(), labels.numpy())
        model._ivf_rows = torch.cat([table, torch.arange(n, n + m)])
    model.embeddings = torch.cat([model.embeddings, z])
    known.add(new)
    return UpdateReport(m, 0, n + m, 0, 0, time.perf_counter() - t0)


def dense_remove(model: DenseRetriever, ids: Iterable[PassageId] | PassageId) -> UpdateReport:
    """:meth:`geograph.DenseRetriever.remove`."""
    t0 = time.perf_counter()
    known = passage_ids(model, model.num_passages)
    rows, keep = known.removal(ids)
    n = model.num_passages
    if model._ivf is not None:
        table = getattr(model, "_ivf_rows", None)
        if table is None:
            table = torch.arange(n)
        gone = torch.isin(table, rows) & (table >= 0)
        model._ivf.remove_ids(gone.nonzero().squeeze(1).numpy().astype("int64"))
        pos = torch.cumsum(keep.long(), 0) - 1
        model._ivf_rows = torch.where((table >= 0) & ~gone, pos[table.clamp_min(0)], torch.full_like(table, -1))
    model.embeddings = model.embeddings[keep.to(model.embeddings.device)]
    known.keep(keep)
    return UpdateReport(0, int(rows.numel()), n - int(rows.numel()), 0, 0, time.perf_counter() - t0)
