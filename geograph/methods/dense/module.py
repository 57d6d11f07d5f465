"""Exact dense retrieval by chunked matrix products."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch import Tensor, nn

from geograph._checks import check_finite_float, check_positive_int, check_same_device, check_tensor, tracing
from geograph.graphs.updates import PassageId, PassageIds, UpdateReport
from geograph.knn.allpairs import sort_topk, tiled_topk
from geograph.knn.exact import exact_rows
from geograph.knn.faiss_ivf import build_ivf_index
from geograph.knn.ivf_recall import sample_recall
from geograph.knn.policy import (
    DEFAULT_RECALL_ROWS,
    QUERY_POINTS_PER_CELL,
    check_ivf,
    default_nlist,
    resolve_index,
)
from geograph.methods.dense.updates import dense_add, dense_remove, labels_to_rows
from geograph.ops.similarity import normalize, unit_rows
from geograph.outputs import RetrievalOutput

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("geograph.dense")

#: recall@:data:`DENSE_RECALL_K` ``nprobe="auto"`` asks of sampled corpus passages used as queries
DENSE_RECALL_TARGET = 0.99
#: the list length of that recall (the first-stage pool of the rerankers is about this size)
DENSE_RECALL_K = 20


class _IVFIndex(Protocol):
    """What the retriever uses of a faiss IVF index (:func:`~geograph.knn.faiss_ivf.build_ivf_index`)."""

    nprobe: int
    ntotal: int
    d: int

    def search(self, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]: ...

    def add_with_ids(self, x: np.ndarray, ids: np.ndarray) -> None: ...

    def remove_ids(self, ids: np.ndarray) -> int: ...


class DenseRetriever(nn.Module):
    r"""Exact top-k retrieval by cosine similarity, :math:`s_u = \cos(h_q, h_u)`.

    The corpus is scanned in chunks of ``chunk_size`` passages; each chunk's top-k is merged
    into a running top-k, so memory is ``O(B * (chunk_size + k))`` whatever the corpus size.
    This is the baseline every benchmark row is compared with.

    Ties: equal scores are returned lowest corpus index first (across chunks too), the rule of
    every geograph ranking (:func:`~geograph.outputs.topk_stable`).

    Device and dtype: the query must be on the module's device (else ``ValueError`` naming
    both); it is scored in the corpus's dtype and the scores come back in the query's
    floating dtype.

    Compilation: ``torch.compile(model, fullgraph=True)`` and ``torch.export.export(model,
    (query,), {"k": k})`` work (tested); ``k`` is static. A traced call skips the NaN check.

    Args:
        embeddings: ``(V, D)`` passage embeddings (normalised here; stored as a buffer, so
            ``.to(device)`` moves the corpus and ``state_dict()`` carries it). Rows that already
            have unit norm (within 1e-6) are held as given, not copied: a memory-mapped corpus
            stays shared between processes.
        chunk_size: passages scored per matrix product.
        index: ``"exact"`` (the chunked scan), ``"ivf"`` (a faiss IVF-Flat index over ``nlist``
            lists, default about ``4 sqrt(V)``, trained on ``sample`` passages; its candidates
            are re-scored exactly) or ``"auto"`` (exact up to
            :data:`~geograph.knn.policy.AUTO_EXACT_MAX` passages).
        nprobe: lists an IVF query scans, or ``"auto"`` (default): when the index is built (on
            the first call), :data:`~geograph.knn.policy.DEFAULT_RECALL_ROWS` sampled
            passages are searched as queries at 1, 2, 4, ... lists until their recall@``recall_k``
            (without the passage itself) against the exact scan reaches ``recall_target``;
            :attr:`calibration` records the choice. Why: the lists a query needs depend on the
            data (``geograph bench scale``, 200k MiniLM-like passages: 32 of 2,048 lists give
            recall@20 0.999 with topics, a Gaussian of the same covariance needs many more). Real
            queries are not passages: check the recall on your own queries (the bench does on
            its generators' held-out draws) or give ``nprobe``.
        recall_target, recall_k: the ``"auto"`` calibration's target and list length.
        persistent: whether ``state_dict()`` carries the corpus. ``False`` is for a module that
            holds the corpus elsewhere and rebuilds this retriever from it after
            ``load_state_dict`` (:class:`~geograph.ISORetriever`, :class:`~geograph.G3Retriever`).

    Shape:
        - query ``(B, D)``; output :class:`~geograph.RetrievalOutput` with ``indices (B, k)``
          and ``scores (B, k)``, best first (ties: lower index first).

    Example:
        >>> corpus = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
        >>> out = DenseRetriever(corpus)(torch.tensor([[0.0, 1.0]]), k=2)
        >>> out.indices, out.scores
        (tensor([[1, 2]]), tensor([[1.0000, 0.8000]]))
    """

    embeddings: Tensor  # a buffer, registered in __init__

    def __init__(
        self,
        embeddings: Tensor,
        *,
        chunk_size: int = 4096,
        index: str = "exact",
        nlist: int | None = None,
        nprobe: int | str = "auto",
        sample: int | None = None,
        seed: int = 0,
        recall_target: float = DENSE_RECALL_TARGET,
        recall_k: int = DENSE_RECALL_K,
        persistent: bool = True,
    ) -> None:
        super().__init__()
        check_tensor(embeddings, "embeddings", 2)
        if embeddings.shape[0] == 0:
            raise ValueError("embeddings is empty: the corpus needs at least one passage")
        self.chunk_size = check_positive_int(chunk_size, "chunk_size")
        n = embeddings.shape[0]
        self.index = resolve_index(index, n, "DenseRetriever")
        self.nlist = default_nlist(n) if nlist is None else check_positive_int(nlist, "nlist")
        if sample is not None:
            check_positive_int(sample, "sample")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if nprobe != "auto" and (isinstance(nprobe, (str, bool)) or not isinstance(nprobe, int) or nprobe < 1):
            raise ValueError(f"nprobe must be a positive integer or 'auto', got {nprobe!r}")
        if not 0.0 < check_finite_float(recall_target, "recall_target") <= 1.0:
            raise ValueError(f"recall_target must be in (0, 1], got {recall_target}")
        self.recall_target, self.recall_k = float(recall_target), check_positive_int(recall_k, "recall_k")
        self._auto = nprobe == "auto"
        self.nprobe: int | None = None if self._auto else cast(int, nprobe)  # checked above
        self.calibration: dict[str, float] | None = None  # what nprobe="auto" chose and measured
        probe = 1 if self.nprobe is None else self.nprobe
        self.sample = check_ivf(n, self.nlist, probe, sample, QUERY_POINTS_PER_CELL) if self.index == "ivf" else sample
        self.seed = seed
        self._ivf: _IVFIndex | None = None  # the faiss index, built on first use from the embeddings buffer
        self._ivf_rows: Tensor | None = None  # faiss label -> row once an update renumbered the rows (dense_updates)
        self.passage_ids: PassageIds | None = None  # the passages' ids once updated (geograph.graphs.updates)
        self.register_load_state_dict_post_hook(_drop_index)  # type: ignore[no-untyped-call]  # unannotated in torch
        self.register_buffer("embeddings", unit_rows(embeddings), persistent=bool(persistent))

    @property
    def num_passages(self) -> int:
        return self.embeddings.shape[0]

    def forward(self, query: Tensor, k: int) -> RetrievalOutput:
        check_same_device(query, "query", self.embeddings.device, "the DenseRetriever")
        check_tensor(query, "query", 2)
        check_positive_int(k, "k")
        if query.shape[1] != self.embeddings.shape[1]:
            raise ValueError(
                f"query must have D={self.embeddings.shape[1]} columns like the corpus, got shape {tuple(query.shape)}"
            )
        if k > self.num_passages:
            raise ValueError(f"k={k} exceeds the corpus size {self.num_passages}")
        q = normalize(query.to(self.embeddings.dtype))
        if self.index == "ivf" and not tracing():
            best_s, best_i = self._search_ivf(q, k)
        else:
            best_s, best_i = tiled_topk(q, self.embeddings, k, block=self.chunk_size)
        return RetrievalOutput(indices=best_i, scores=best_s.to(query.dtype))

    def _apply(self, fn: Callable[[Tensor], Tensor], *args: Any, **kwargs: Any) -> DenseRetriever:
        # .to() / .cuda(): the index follows the new buffers
        self._ivf = self._ivf_rows = None
        out: DenseRetriever = super()._apply(fn, *args, **kwargs)  # type: ignore[no-untyped-call]  # unannotated in torch
        return out

    def _search_ivf(self, q: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """faiss IVF-Flat candidates (``k`` per query from ``nprobe`` lists), re-scored exactly and
        ordered best first, ties lowest index; a query with fewer than ``k`` candidates is
        completed by the exact scan."""
        if self._ivf is None:
            self._ivf = build_ivf_index(self.embeddings, self.nlist, sample=self.sample, seed=self.seed)
        if self.nprobe is None:
            self.nprobe = self._calibrate()
        self._ivf.nprobe = self.nprobe
        _, ids = self._ivf.search(q.detach().float().cpu().contiguous().numpy(), k)
        ids = labels_to_rows(self, torch.from_numpy(ids)).to(q.device)
        ok = ids >= 0
        scores = torch.einsum("bd,bkd->bk", q, self.embeddings[ids.clamp_min(0)]).masked_fill(~ok, float("-inf"))
        vals, ids = sort_topk(scores, ids)
        short = ~torch.isfinite(vals[:, -1])
        if bool(short.any()):
            rows = short.nonzero().squeeze(1)
            ev, ei = tiled_topk(q[rows], self.embeddings, k, block=self.chunk_size)
            vals, ids = vals.index_copy(0, rows, ev), ids.index_copy(0, rows, ei)
        return vals, ids

    def _calibrate(self) -> int:
        """``nprobe="auto"``: the fewest lists (a power of two) at which sampled passages, searched
        as queries, find ``recall_target`` of their exact top-``recall_k`` other passages."""
        n = self.num_passages
        k = min(self.recall_k, n - 1)
        if k < 1:
            return 1
        rows = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + 1))[:DEFAULT_RECALL_ROWS]
        rows = rows.sort().values.to(self.embeddings.device)
        exact = exact_rows(self.embeddings, rows, k, block=self.chunk_size).cpu()
        qn = self.embeddings[rows].detach().float().cpu().contiguous().numpy()
        own = rows.cpu().unsqueeze(1)
        ivf = cast(_IVFIndex, self._ivf)  # built by _search_ivf, the only caller
        nprobe, recall = 1, 0.0
        while True:
            ivf.nprobe = nprobe
            ids = labels_to_rows(self, torch.from_numpy(ivf.search(qn, k + 1)[1]))
            ids = ids.masked_fill(ids == own, -1)  # the passage itself is not one of its neighbours
            recall = sample_recall(ids, torch.arange(len(ids)), exact)
            if recall >= self.recall_target or nprobe >= self.nlist:
                break
            nprobe = min(2 * nprobe, self.nlist)
        self.calibration = {
            "nprobe": nprobe,
            "recall": recall,
            "recall_k": k,
            "rows": len(rows),
            "recall_target": self.recall_target,
        }
        log.info(
            "DenseRetriever: nprobe='auto' chose %d of %d lists (recall@%d %.4f on %d sampled passages)",
            nprobe,
            self.nlist,
            k,
            recall,
            len(rows),
        )
        if 4 * nprobe >= self.nlist:
            log.warning(
                "DenseRetriever: the recall target needs %d of %d IVF lists: little faster than "
                "index='exact' on this corpus (no cluster structure for the lists to cut along)",
                nprobe,
                self.nlist,
            )
        return nprobe

    def save_pretrained(
        self,
        directory: str | Path,
        *,
        encoder: Any = None,
        ids: Sequence[str] | None = None,
        text_keys: Sequence[str] | None = None,
    ) -> Path:
        """Write the retriever as an artefact directory: the corpus (``tensors.safetensors``), the
        trained IVF index (``ivf.faiss``, built and ``nprobe="auto"`` calibrated now if not yet)
        and a manifest of the options, the encoder (``encoder``) and the corpus fingerprint
        (with ``ids``); see :mod:`geograph.artefacts`. With ``ids`` (default: the ids of an
        updated retriever, if they are strings) ``passages.jsonl`` lists them, with
        ``text_keys`` (the embedding cache's key of each passage's text), so that
        ``geograph update`` can apply a changed corpus to the saved retriever."""
        from geograph.artefacts.saved_dense import save_dense

        return save_dense(self, directory, encoder=encoder, ids=ids, text_keys=text_keys)

    @classmethod
    def from_pretrained(
        cls, source: str | Path, *, corpus: Any = None, encoder: Any = None, device: str | torch.device | None = None
    ) -> DenseRetriever:
        """Load a retriever saved by :meth:`save_pretrained`: the corpus memory-mapped, the IVF index
        read back (not trained again), the saved ``nprobe``; it answers as the saved one did. A
        ``corpus`` or ``encoder`` other than the saved one's is refused (one line naming both)."""
        from geograph.artefacts.saved_dense import load_dense

        return load_dense(cls, source, corpus=corpus, encoder=encoder, device=device)

    def set_ids(self, ids: Sequence[PassageId]) -> None:
        """Name the passages (``str`` or ``int``, one per row, unique) for ``add`` and ``remove``
        (default: ``0 .. V-1``)."""
        ids = list(ids)
        if len(ids) != self.num_passages:
            raise ValueError(f"ids: {len(ids)} ids for {self.num_passages} passages")
        self.passage_ids = PassageIds(ids)

    def add(self, embeddings: Tensor, ids: Sequence[PassageId]) -> UpdateReport:
        """Add passages in place (appended in order; ``ids``: one new ``str`` or ``int`` id a row; a
        corpus built without ids names its passages ``0 .. V-1``). Exact: the same module as one
        built on the new corpus. IVF: a built index keeps its cells and takes the new vectors
        (see :mod:`geograph.methods.dense.updates`)."""
        return dense_add(self, embeddings, ids)

    def remove(self, ids: Iterable[PassageId] | PassageId) -> UpdateReport:
        """Remove passages in place (the rest keep their order); a built IVF index drops them."""
        return dense_remove(self, ids)

    def extra_repr(self) -> str:
        probe = "'auto'" if self.nprobe is None else self.nprobe
        ivf = f", index='ivf', nlist={self.nlist}, nprobe={probe}" if self.index == "ivf" else ""
        return f"num_passages={self.num_passages}, dim={self.embeddings.shape[1]}, chunk_size={self.chunk_size}{ivf}"


def _drop_index(module: DenseRetriever, _incompatible: object) -> None:
    """After ``load_state_dict`` the IVF index is rebuilt (and ``nprobe="auto"`` chosen again)
    from the loaded corpus on first use."""
    module._ivf = module._ivf_rows = None
    if module._auto:
        module.nprobe, module.calibration = None, None
