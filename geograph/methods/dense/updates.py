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

from geograph.graphs.updates import PassageId, UpdateReport, appended, check_new_rows, kept_rows, passage_ids
from geograph.ops.similarity import unit_rows

if TYPE_CHECKING:
    from geograph.methods.dense.module import DenseRetriever

__all__ = ["dense_add", "dense_remove", "dense_reorder", "labels_to_rows"]


def labels_to_rows(model: DenseRetriever, labels: Tensor) -> Tensor:
    """The rows of faiss labels (``-1`` stays ``-1``): the identity until an update renumbers rows."""
    table = getattr(model, "_ivf_rows", None)
    if table is None:
        return labels
    table = table.to(labels.device)
    return torch.where(labels >= 0, table[labels.clamp_min(0)], labels)


def _writable_index(model: DenseRetriever) -> None:
    """Copy the inverted lists of an index read memory-mapped (``from_pretrained``) into memory,
    so that faiss can add and remove entries (its mapped lists are read-only)."""
    from geograph.knn.faiss_ivf import import_faiss

    faiss = import_faiss()
    ivf = faiss.extract_index_ivf(model._ivf)
    lists = faiss.downcast_InvertedLists(ivf.invlists)
    if not isinstance(lists, faiss.OnDiskInvertedLists):
        return
    copy = faiss.ArrayInvertedLists(lists.nlist, lists.code_size)
    for cell in range(lists.nlist):
        size = lists.list_size(cell)
        if size:
            copy.add_entries(cell, size, lists.get_ids(cell), lists.get_codes(cell))
    ivf.replace_invlists(copy, True)
    copy.this.disown()  # the index owns the lists now


def dense_add(model: DenseRetriever, embeddings: Tensor, ids: Sequence[PassageId]) -> UpdateReport:
    """:meth:`geograph.DenseRetriever.add`."""
    t0 = time.perf_counter()
    check_new_rows(embeddings, model.embeddings)
    known = passage_ids(model, model.num_passages)
    new = known.check_new(ids, embeddings.shape[0])
    n, m = model.num_passages, len(new)
    z = unit_rows(embeddings)  # as the constructor holds them: unit rows as given, others normalised
    if model._ivf is not None:
        _writable_index(model)
        table = getattr(model, "_ivf_rows", None)
        if table is None:
            table = torch.arange(n)
        labels = torch.arange(len(table), len(table) + m)
        model._ivf.add_with_ids(z.detach().float().cpu().contiguous().numpy(), labels.numpy())
        model._ivf_rows = torch.cat([table, torch.arange(n, n + m)])
    model.embeddings = appended(model.embeddings, z)
    known.add(new)
    return UpdateReport(m, 0, n + m, 0, 0, time.perf_counter() - t0)


def dense_remove(model: DenseRetriever, ids: Iterable[PassageId] | PassageId) -> UpdateReport:
    """:meth:`geograph.DenseRetriever.remove`."""
    t0 = time.perf_counter()
    known = passage_ids(model, model.num_passages)
    rows, keep = known.removal(ids)
    n = model.num_passages
    if model._ivf is not None:
        _writable_index(model)
        table = getattr(model, "_ivf_rows", None)
        if table is None:
            table = torch.arange(n)
        gone = torch.isin(table, rows) & (table >= 0)
        model._ivf.remove_ids(gone.nonzero().squeeze(1).numpy().astype("int64"))
        pos = torch.cumsum(keep.long(), 0) - 1
        model._ivf_rows = torch.where((table >= 0) & ~gone, pos[table.clamp_min(0)], torch.full_like(table, -1))
    model.embeddings = kept_rows(model.embeddings, keep)
    known.keep(keep)
    return UpdateReport(0, int(rows.numel()), n - int(rows.numel()), 0, 0, time.perf_counter() - t0)


def dense_reorder(model: DenseRetriever, order: Sequence[int] | Tensor) -> None:
    """Put a retriever's passages in another order, in place: row ``r`` becomes row ``order[r]``
    before (its id too). Exact: the module a constructor given the reordered corpus makes. A built
    IVF index keeps its cells and lists; its label-to-row table follows the rows.

    Raises:
        ValueError: ``order`` is not a permutation of ``0 .. V-1``.
    """
    n = model.num_passages
    order = torch.as_tensor(order, dtype=torch.long)
    if order.shape != (n,) or not torch.equal(order.sort().values, torch.arange(n)):
        raise ValueError(f"order must be a permutation of the {n} rows, got {tuple(order.shape)} entries")
    inv = torch.empty_like(order)
    inv[order] = torch.arange(n)
    if model._ivf is not None:
        table = getattr(model, "_ivf_rows", None)
        if table is None:
            table = torch.arange(n)
        model._ivf_rows = torch.where(table >= 0, inv[table.clamp_min(0)], table)
    model.embeddings = model.embeddings[order.to(model.embeddings.device)]
    known = model.passage_ids
    if known is not None:
        model.passage_ids = type(known)([known.ids[int(r)] for r in order])
