"""CorpusGraph: passage embeddings plus an undirected sparse passage graph, with builders."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from geograph._checks import check_positive_int, check_tensor
from geograph.graphs._base import PassageGraph
from geograph.graphs.updates import (
    KnnState,
    PassageId,
    UpdateReport,
    add_passages,
    kept_lists,
    knn_unit,
    remove_passages,
)
from geograph.knn.build import self_topk
from geograph.knn.ivf_place import IVFCells, make_cells
from geograph.knn.policy import DEFAULT_RECALL_TARGET, IVFOptions, resolve_index
from geograph.ops.adjacency import clean_edge_index, csr_rowptr
from geograph.ops.similarity import normalize, unit_rows
from geograph.outputs import true_first

__all__ = ["CorpusGraph"]


class CorpusGraph(PassageGraph):
    """Passage embeddings ``(V, D)`` and an undirected graph over the passages, stored sparse.

    The graph is kept as a clean ``edge_index (2, E)`` (both directions, sorted by source, no
    duplicates, no self loops: those are dropped by every builder) and its CSR row pointer;
    nothing ``V x V`` is ever materialised. Isolated passages are allowed.

    A :class:`torch.nn.Module` whose tensors are buffers (``embeddings``, ``edge_index``,
    ``rowptr``): ``.to(device)``, ``.to(dtype)``, ``.cuda()`` and ``state_dict()`` carry the
    whole graph, and a module holding it (:class:`~geograph.ISORetriever`) moves it along.
    ``.to(dtype)`` casts only the embeddings; the integer index buffers keep their dtype.

    Builders: :meth:`from_knn`, :meth:`from_groups`, :meth:`from_mentions`,
    :meth:`from_edge_index`; :meth:`save_pretrained` / :meth:`from_pretrained` an artefact directory
    (:mod:`geograph.artefacts`); :meth:`set_ids`, :meth:`add` and :meth:`remove` change the corpus.

    Args:
        embeddings: ``(V, D)`` floating passage embeddings (finite).
        edge_index: ``(2, E)`` integer node pairs, either direction.
        name: how the graph was built (kept in :meth:`save_pretrained`).

    Example:
        >>> g = CorpusGraph(torch.eye(3), torch.tensor([[0, 1], [1, 1]]))
        >>> g.num_edges, g.degree().tolist()
        (1, [1, 1, 0])
    """

    _artefact_layout = "CorpusGraph"

    embeddings: Tensor
    edge_index: Tensor
    rowptr: Tensor

    def __init__(self, embeddings: Tensor, edge_index: Tensor, *, name: str = "edge_index") -> None:
        super().__init__()
        check_tensor(embeddings, "embeddings", 2)
        if embeddings.shape[0] < 1:
            raise ValueError("embeddings must hold at least one passage")
        if isinstance(edge_index, Tensor):
            edge_index = edge_index.to(embeddings.device)
        clean = clean_edge_index(edge_index, embeddings.shape[0])
        self._hold(embeddings, clean, csr_rowptr(clean[0], embeddings.shape[0]), name=name)

    def _hold(self, embeddings: Tensor, edge_index: Tensor, rowptr: Tensor, *, name: str) -> None:
        """Hold a clean ``edge_index`` and its row pointer as given (on a :meth:`_bare` graph: a loaded
        graph's memory-mapped tensors, no copy)."""
        self.name = name
        self._start()
        self.knn_state: KnnState | None = None  # a k-NN graph's directed lists, kept for updates
        self.register_buffer("embeddings", embeddings)
        self.register_buffer("edge_index", edge_index)
        self.register_buffer("rowptr", rowptr)

    def _kept_state(self) -> KnnState | None:
        return self.knn_state

    # -- properties ---------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return int(self.rowptr.shape[0]) - 1  # (a shape: no read of the embeddings in a traced forward)

    @property
    def num_edges(self) -> int:
        """Undirected edges (each stored in both directions)."""
        return int(self.edge_index.shape[1]) // 2

    @property
    def col(self) -> Tensor:
        """CSR column indices (the targets of :attr:`edge_index`, grouped by source)."""
        return self.edge_index[1]

    @property
    def device(self) -> torch.device:
        return self.rowptr.device

    def degree(self) -> Tensor:
        """``(V,)`` long node degrees."""
        return self.rowptr[1:] - self.rowptr[:-1]

    def extra_repr(self) -> str:
        return f"nodes={self.num_nodes}, edges={self.num_edges}, dim={self.embeddings.shape[1]}, name={self.name!r}"

    # -- builders -----------------------------------------------------------------------
    @classmethod
    def from_edge_index(cls, embeddings: Tensor, edge_index: Tensor) -> CorpusGraph:
        """A graph from given node pairs ``(2, E)`` (either direction; moved to the embeddings' device)."""
        return cls(embeddings, edge_index, name="edge_index")

    @classmethod
    def from_knn(
        cls,
        embeddings: Tensor,
        k: int,
        *,
        chunk_size: int = 4096,
        faiss: bool = False,
        index: str = "exact",
        nlist: int | None = None,
        nprobe: int | None = None,
        sample: int | None = None,
        seed: int = 0,
        recall_target: float | None = DEFAULT_RECALL_TARGET,
        progress: bool = False,
        reserve: int = 0,
    ) -> CorpusGraph:
        """Each passage links to its ``k`` most cosine-similar other passages (union, undirected).

        ``index="exact"`` (default) scans every pair with the tiled all-pairs routine
        (:func:`~geograph.knn.allpairs.tiled_topk`, tiles of ``chunk_size``: memory
        ``O(chunk_size^2 + V k)``, time ``O(V^2 D)``). ``index="ivf"`` joins IVF cells instead
        (:func:`~geograph.knn.ivf_join.ivf_self_topk`: ``nlist`` cells trained on ``sample``
        passages, each joined with its ``nprobe`` nearest; the scores are exact, a pair whose
        cells never meet is missed; with ``nprobe`` left out, it is chosen on sampled rows so
        that the join finds ``recall_target`` of each row's exact neighbours, or the build falls
        back to the exact scan, and the recall is measured on other sampled rows: see
        :func:`~geograph.knn.ivf_join.ivf_self_topk`; ``None`` skips both); ``index="auto"`` is exact up to
        :data:`~geograph.knn.policy.AUTO_EXACT_MAX` passages and IVF above, and logs its
        choice. ``faiss=True`` uses an exact FAISS inner-product index when ``faiss`` is
        installed (the same neighbours up to ties). ``k`` clamps to ``V - 1``. Ties: lowest
        index first. ``progress`` shows a bar with ETA. :attr:`build_info` records the index,
        the seconds of each stage and, for IVF, ``nprobe`` and the measured recall.

        The directed lists are kept for :meth:`add` and :meth:`remove` (an IVF build also keeps its
        cells, the centroids and row cells the join hands back, :class:`~geograph.knn.ivf_place.IVFCells`,
        so that an update scans only the cells the changed passages meet;
        ``build_info["seconds"]["update_cells"]`` times keeping them); ``reserve`` more entries
        a row (``k + reserve`` computed, the first ``k`` linked) spare :meth:`remove` the rescan
        of a row until it has lost more than ``reserve`` neighbours.
        """
        check_tensor(embeddings, "embeddings", 2)
        k = check_positive_int(k, "k")
        check_positive_int(chunk_size, "chunk_size")
        if isinstance(reserve, bool) or not isinstance(reserve, int) or reserve < 0:
            raise ValueError(f"reserve must be a non-negative integer, got {reserve!r}")
        v = embeddings.shape[0]
        k_asked, k = k, min(k, v - 1)
        kept = None
        if k < 1:
            graph = cls(embeddings, torch.zeros(2, 0, dtype=torch.long, device=embeddings.device), name="knn")
            graph.build_info = {"k": k_asked}
            return graph
        if embeddings.dtype in (torch.float16, torch.bfloat16) and embeddings.device.type == "cpu":
            z = normalize(embeddings.float())  # CPU matrix products of half floats are slow and round the scores
        else:
            z = unit_rows(embeddings)  # in the embeddings' dtype (float64 stays float64); unit rows: no copy
        seconds: dict[str, Any] = {}
        report: dict[str, Any] = {}
        join_cells = None  # the IVF join's (centroids, assign)
        index = "faiss-flat" if faiss else resolve_index(index, v, "CorpusGraph.from_knn")
        if faiss:
            idx = _faiss_knn(z, k + 1)
        else:
            lists = self_topk(
                z,
                min(k + reserve, v - 1),
                index=index,
                ivf=IVFOptions(nlist=nlist, nprobe=nprobe, sample=sample, seed=seed, recall_target=recall_target),
                block=chunk_size,
                progress="k-NN graph" if progress else False,
            )
            idx, seconds = lists.indices, lists.seconds
            report = {} if lists.ivf is None else lists.ivf.as_dict()
            kept = kept_lists(lists.values, idx, k_asked + reserve, exact=index == "exact")
            idx = idx[:, :k]
            join_cells = lists.cells
            del lists
        del z
        if idx.shape[1] > k:  # FAISS returns the passage itself among the k + 1
            self_hit = idx == torch.arange(v, device=idx.device).unsqueeze(1)
            idx = idx.gather(1, true_first(~self_hit, k))
        src = torch.arange(v, device=idx.device).repeat_interleave(k)
        dst = idx.reshape(-1)
        ok = dst >= 0  # an IVF row with fewer than k candidates
        graph = cls(embeddings, torch.stack([src[ok], dst[ok]]), name=f"knn{k}")
        graph.build_info = {"index": index, "k": k_asked, "seconds": seconds, **report}
        if kept is not None:
            cells = None
            if index == "ivf" and not report.get("exact", False):  # the join's cells, for local updates
                t0 = time.perf_counter()
                if join_cells is not None:  # the join's own: not trained a second time
                    cells = IVFCells(join_cells[0], join_cells[1].to(torch.long), int(report["nprobe"]))
                else:
                    cells = make_cells(
                        knn_unit(embeddings),
                        nlist=nlist,
                        nprobe=report.get("nprobe", nprobe),
                        sample=sample,
                        seed=seed,
                        block=chunk_size,
                    )
                seconds["update_cells"] = time.perf_counter() - t0
            graph.knn_state = KnnState(
                kept, k_asked, exact=index == "exact" or bool(report.get("exact")), cells=cells, union=True
            )
        return graph

    @classmethod
    def from_groups(cls, embeddings: Tensor, groups: Iterable[Sequence[int]]) -> CorpusGraph:
        """Co-occurrence: passages listed in the same group are all linked (a clique per group).

        ``groups`` is any iterable of lists of passage indices (e.g. the passages of one
        training instance); singletons add nothing.
        """
        src, dst = [], []
        v = embeddings.shape[0]
        for group in groups:
            g = torch.as_tensor(list(group), dtype=torch.long)
            if g.numel() and (int(g.min()) < 0 or int(g.max()) >= v):
                raise ValueError(f"group {list(group)[:5]} holds a passage index outside [0, {v})")
            if g.numel() > 1:
                a, b = torch.meshgrid(g, g, indexing="ij")
                src.append(a.reshape(-1))
                dst.append(b.reshape(-1))
        if not src:
            return cls(embeddings, torch.zeros(2, 0, dtype=torch.long, device=embeddings.device), name="groups")
        return cls(embeddings, torch.stack([torch.cat(src), torch.cat(dst)]).to(embeddings.device), name="groups")

    @classmethod
    def from_mentions(
        cls,
        embeddings: Tensor,
        titles: Sequence[str],
        texts: Sequence[str],
        *,
        min_title_len: int = 4,
        case_sensitive: bool = False,
    ) -> CorpusGraph:
        """Hyperlink-like graph: passage ``u`` links to ``v`` when ``u``'s text mentions ``v``'s title.

        A zero-LLM stand-in for Wikipedia hyperlinks on multi-hop corpora. All titles are
        matched in one pass over each text with an Aho-Corasick automaton (``pyahocorasick``),
        at word boundaries; titles shorter than ``min_title_len`` characters are ignored (too
        ambiguous), and a passage sharing a title with others links to all of them. A passage
        does not link to itself. Matching is case-insensitive unless ``case_sensitive``.
        """
        try:
            import ahocorasick
        except ImportError as exc:  # pragma: no cover - declared dependency
            raise ImportError(
                "from_mentions needs pyahocorasick (a dependency of geograph-rag): pip install 'pyahocorasick>=2.0'"
            ) from exc
        v = embeddings.shape[0]
        if len(titles) != v or len(texts) != v:
            raise ValueError(f"need one title and one text per passage ({v}), got {len(titles)} and {len(texts)}")

        def fold(s: str) -> str:
            return s if case_sensitive else s.casefold()

        by_title: dict[str, list[int]] = {}
        for i, t in enumerate(titles):
            key = fold(str(t).strip())
            if len(key) >= min_title_len:
                by_title.setdefault(key, []).append(i)
        src, dst = [], []
        if by_title:
            auto = ahocorasick.Automaton()
            for key, ids in by_title.items():
                auto.add_word(key, (len(key), ids))
            auto.make_automaton()
            for u, text in enumerate(texts):
                body = fold(str(text))
                for end, (length, ids) in auto.iter(body):
                    start = end - length + 1
                    if (start > 0 and body[start - 1].isalnum()) or (end + 1 < len(body) and body[end + 1].isalnum()):
                        continue  # inside a longer word
                    for w in ids:
                        if w != u:
                            src.append(u)
                            dst.append(w)
        ei = torch.tensor([src, dst], dtype=torch.long) if src else torch.zeros(2, 0, dtype=torch.long)
        return cls(embeddings, ei.to(embeddings.device), name="mentions")

    # -- updates (geograph.graphs.updates) ----------------------------------------------
    def add(
        self, embeddings: Tensor, ids: Sequence[PassageId], *, groups: Iterable[Sequence[PassageId]] | None = None
    ) -> UpdateReport:
        """Add passages in place, appended in order; the graph equals a rebuild on the new corpus.

        A k-NN graph computes the new rows' lists by the exact tiled scan and merges them into
        the existing rows' lists where they rank above the last entry (one batched block of
        new x old similarities), then makes the union graph again (see
        :mod:`geograph.graphs.updates`). A groups graph takes the new ``groups`` (lists of
        ids). Other graphs are refused. ``embeddings``: ``(M, D)`` in the corpus's dtype and
        device; ``ids``: ``M`` new ids.
        """
        return add_passages(self, embeddings, ids, groups=groups)

    def remove(self, ids: Iterable[PassageId]) -> UpdateReport:
        """Remove passages in place (the rest keep their order); equal to a rebuild without them.

        A k-NN row that lost a neighbour keeps the rest of its list and is scanned again (that
        row only) when fewer than ``k`` remain; other graphs drop the removed passages' edges.
        """
        return remove_passages(self, ids)


def _faiss_knn(z: Tensor, k: int) -> Tensor:
    try:
        import faiss
    except ImportError as exc:
        raise ImportError("faiss=True needs faiss-cpu or faiss-gpu installed") from exc
    x = z.detach().cpu().float().contiguous().numpy()
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    _, idx = index.search(x, k)
    return torch.from_numpy(idx).long().to(z.device)
