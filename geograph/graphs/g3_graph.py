"""G3RAG's zero-token geometric-gain graph over a corpus: :class:`G3Graph` (build, save, load)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from geograph._checks import check_finite_float, check_positive_int, check_tensor
from geograph.geometry.gain import (
    _unit,
    candidate_cap,
    check_band,
    csr,
    gain_density_info,
    gain_rank,
    gain_transition_edges,
)
from geograph.graphs._base import PassageGraph
from geograph.graphs.g3_updates import G3State, G3UpdateReport, g3_add, g3_remove, ivf_state
from geograph.graphs.updates import PassageId
from geograph.knn.allpairs import DEFAULT_BLOCK
from geograph.knn.build import self_topk
from geograph.knn.ivf_place import IVFCells, make_cells
from geograph.knn.policy import DEFAULT_RECALL_TARGET, IVFOptions, default_join_nlist, resolve_index

__all__ = ["G3Graph"]


#: ``max_degree`` of :meth:`G3Graph.build` and :class:`G3Retriever` unless given
DEFAULT_MAX_DEGREE = 128

#: cosine candidates per row of the IVF build with ``ranking="cosine"`` unless given
#: (``ranking="weight"``: ``max_degree`` plus a quarter)
DEFAULT_CANDIDATES = 512

#: columns sampled for the density of the IVF build unless given
DEFAULT_DENSITY_SAMPLE = 8192

log = logging.getLogger("geograph.g3")


class G3Graph(PassageGraph):
    """Passage embeddings and G3RAG's sparse transition matrix ``T`` (see :func:`~geograph.functional.gain_transition`).

    Embeddings are L2-normalised when the graph is built (stored as given). A
    :class:`torch.nn.Module`: ``T`` is held as three CSR buffers (``crow``, ``col``, ``val``)
    next to ``embeddings`` and ``density``, so ``.to(device)``, ``.to(dtype)`` (floating
    buffers only; the index buffers stay long) and ``state_dict()`` carry the whole graph;
    :attr:`transition` rebuilds the sparse view from them on each access.

    Attributes:
        embeddings: ``(N, D)``.
        transition: sparse CSR ``(N, N)``, rows sum to 1 (0 for a passage with no edge).
        density: ``(N,)`` normalised density ``rho``.
        band, beta, max_degree: the build parameters.
        row_width: the largest out-degree of ``T`` (read once at construction): the padded
            width of a seed's row in :class:`G3Retriever`.

    Example:
        >>> x = torch.nn.functional.normalize(torch.randn(50, 8, generator=torch.Generator().manual_seed(0)), dim=1)
        >>> g = G3Graph.build(x, max_degree=4)
        >>> g.transition.shape, bool((g.degree() <= 4).all())
        (torch.Size([50, 50]), True)
    """

    _artefact_layout = "G3Graph"

    embeddings: Tensor
    density: Tensor
    crow: Tensor
    col: Tensor
    val: Tensor

    def __init__(
        self,
        embeddings: Tensor,
        transition: Tensor,
        density: Tensor,
        *,
        band: tuple[float, float] | None,
        beta: float,
        max_degree: int | None,
    ) -> None:
        super().__init__()
        check_tensor(embeddings, "embeddings", 2)
        n = embeddings.shape[0]
        if (
            not isinstance(transition, Tensor)
            or transition.layout != torch.sparse_csr
            or tuple(transition.shape) != (n, n)
        ):
            raise ValueError(
                f"transition must be a sparse CSR ({n}, {n}) tensor, got {getattr(transition, 'shape', transition)}"
            )
        if not isinstance(density, Tensor) or tuple(density.shape) != (n,):
            raise ValueError(f"density must have shape ({n},), got {tuple(getattr(density, 'shape', ()))}")
        for name, t in (("transition", transition), ("density", density)):
            if t.device != embeddings.device:
                raise ValueError(
                    f"{name} is on {t.device} but embeddings is on {embeddings.device}: "
                    "move one of them with .to() first"
                )
        # copies, not views into the sparse tensor (dynamo cannot trace a view of a sparse base)
        self._hold(
            embeddings,
            density,
            transition.crow_indices().to(torch.long, copy=True),
            transition.col_indices().to(torch.long, copy=True),
            transition.values().clone(),
            band=band,
            beta=beta,
            max_degree=max_degree,
        )

    def _hold(
        self,
        embeddings: Tensor,
        density: Tensor,
        crow: Tensor,
        col: Tensor,
        val: Tensor,
        *,
        band: tuple[float, float] | None,
        beta: float,
        max_degree: int | None,
    ) -> None:
        """Hold ``T``'s CSR parts as given (on a :meth:`_bare` graph: :meth:`build`'s own fresh arrays,
        where a copy at 1M passages x 128 edges would be 1.5 GB more at the peak, or a loaded graph's
        memory-mapped tensors)."""
        self.register_buffer("embeddings", embeddings)
        self.register_buffer("density", density)
        self.register_buffer("crow", crow)
        self.register_buffer("col", col)
        self.register_buffer("val", val)
        self.band = check_band(band)
        self.beta = check_finite_float(beta, "beta")
        self.max_degree = max_degree
        self._start()
        self.update_state: G3State | None = None  # density sums and cosine lists kept for updates (g3_updates)
        self._update_width()
        # (a function: the module pickles)
        self.register_load_state_dict_post_hook(_update_width_after_load)  # type: ignore[no-untyped-call]

    def _update_width(self) -> None:
        self.row_width = int(self.degree().max()) if self.num_nodes else 0

    @classmethod
    def build(
        cls,
        embeddings: Tensor,
        *,
        band: tuple[float, float] | None = (0.1, 0.7),
        beta: float = 0.4,
        max_degree: int | None = DEFAULT_MAX_DEGREE,
        block: int | None = None,
        index: str = "exact",
        candidates: int | None = None,
        nlist: int | None = None,
        nprobe: int | None = None,
        sample: int | None = None,
        density_sample: int | None = None,
        ranking: str = "weight",
        seed: int = 0,
        recall_target: float | None = DEFAULT_RECALL_TARGET,
        progress: bool = False,
    ) -> G3Graph:
        """Build by tiles: memory ``O(block^2 + N x max_degree)`` (``band=None``: the authors' T).

        ``max_degree`` defaults to :data:`DEFAULT_MAX_DEGREE` (128) strongest edges a row: the
        band alone keeps over half of all pairs of real embeddings (61% on 1,824 MuSiQue
        passages), so an unbounded T is ``O(N^2)``. A row with more band edges than that
        loses its weakest ones and is renormalised over the rest (see
        :func:`~geograph.functional.gain_transition`); ``max_degree=None`` is the authors'
        full T (parity, small corpora; it warns above 10,000 passages). Measured with MiniLM
        embeddings, band (0.1, 0.7), 10 candidates, 2 cosine seeds, Recall@5: MuSiQue queries
        50-99 (1,890 passages, full-T mean degree 324): 0.523 (128) vs 0.537 (None) at beta 0.4,
        0.507 vs 0.537 at beta 0.7; SciFact test (300 queries, 5,183 passages, full-T mean
        degree 2,930): 0.680 for both (64 gives 0.517 / 0.510 and 0.680).

        Corpora of millions: ``index="exact"`` ranks every pair's weight (time ``O(N^2 D)``);
        ``index="ivf"`` takes each row's top-``candidates`` list from the IVF join
        (:func:`~geograph.knn.ivf_join.ivf_self_topk` with ``nlist``, ``nprobe``, ``sample``;
        with ``nprobe`` left out it is chosen on sampled rows so that the lists hold
        ``recall_target`` of each row's exact top-``candidates``, or the lists are computed
        exactly, and the recall is measured on other sampled rows; ``None`` skips both)
        and keeps its ``max_degree`` largest weights. ``ranking="weight"`` (default) ranks the
        join's pairs by their weight ``W_ij`` itself (``f(x)`` in the band times the target's
        penalty; each computed block serves both directions), so the lists are the rows'
        answers up to the join's misses; ``ranking="cosine"`` ranks by cosine (below the band's
        ceiling) and proves rows by the certificate of :func:`~geograph.functional.gain_edges`
        (an outside pair weighs at most ``f(x_K')``), recomputing the rows it cannot prove
        against every passage: exact, but the share it proves falls as N grows (measured by
        ``geograph bench scale 20000 50000 --ranking cosine`` on the MiniLM-like generator,
        K'=512: 58% of rows at 20k, 27% at 50k), so its re-done rows
        dominate at scale. ``index="auto"`` is exact up to
        :data:`~geograph.knn.policy.AUTO_EXACT_MAX` passages (logged). ``candidates``
        defaults to :data:`DEFAULT_CANDIDATES`; with ``index="exact"`` and ``candidates`` given,
        the lists come from the exact tiled scan. ``density_sample`` columns estimate the
        density (:func:`~geograph.functional.gain_density`; default: exact for the exact
        build, :data:`DEFAULT_DENSITY_SAMPLE` for IVF; 0 = exact). :attr:`build_info` records what was
        done (certified and redone rows, density error).

        ``block``: tile side (default 4096; for ``max_degree=None`` rows per block, default
        ``2^26 // N``). float16 / bfloat16 embeddings are built in float32 and stored in their
        own dtype.
        """
        band = check_band(band)
        n = embeddings.shape[0]
        index = resolve_index(index, n, "G3Graph.build")
        if max_degree is not None:
            max_degree = check_positive_int(max_degree, "max_degree")
        if ranking not in ("weight", "cosine"):
            raise ValueError(f"ranking must be 'weight' or 'cosine', got {ranking!r}")
        if index == "ivf" and candidates is None:
            candidates = DEFAULT_CANDIDATES if ranking == "cosine" else (max_degree or 0) + (max_degree or 0) // 4
        if index == "ivf" and density_sample is None:
            density_sample = DEFAULT_DENSITY_SAMPLE
        if density_sample == 0:  # exact, whatever the index
            density_sample = None
        if candidates is not None:
            candidates = check_positive_int(candidates, "candidates")
            if max_degree is None:
                raise ValueError("candidates need max_degree: the full T (max_degree=None) uses every pair")
            if candidates < max_degree and candidates < n - 1:
                raise ValueError(
                    f"candidates={candidates} must be at least max_degree={max_degree} "
                    "(each row keeps max_degree of its candidates)"
                )
            candidates = min(candidates, n - 1)
        z = _unit(embeddings)
        info: dict[str, Any] = {"index": index, "passages": n}
        t0 = time.perf_counter()
        dinfo = gain_density_info(
            z, block=block, sample=density_sample, seed=seed, progress="G3 density" if progress else False
        )
        rho = dinfo.density
        info.update(density_seconds=time.perf_counter() - t0, density=dinfo.as_dict())
        del dinfo
        cand, join_cells = None, None
        if candidates is not None and max_degree is not None and max_degree < n:
            t0 = time.perf_counter()
            tile = DEFAULT_BLOCK if block is None else block
            rank: dict[str, Any]
            if ranking == "cosine":
                rank = dict(transform=candidate_cap(band))
            else:
                rank = dict(transform=gain_rank(band), target=torch.exp(-check_finite_float(beta, "beta") * rho.to(z)))
            lists = self_topk(
                z,
                candidates,
                index=index,
                ivf=IVFOptions(nlist=nlist, nprobe=nprobe, sample=sample, seed=seed, recall_target=recall_target),
                block=tile,
                progress="G3 candidates" if progress else False,
                **rank,
            )
            cand, report, join_cells = (lists.values, lists.indices), lists.ivf, lists.cells
            del lists
            info.update(candidates=candidates, ranking=ranking, candidate_seconds=time.perf_counter() - t0)
            if report is not None:
                info.update(nlist=nlist or default_join_nlist(n), **report.as_dict())
        keep = None  # an IVF build's weight lists and cells, kept for updates
        if cand is not None and index == "ivf" and ranking == "weight":  # (exact lists after a fall-back)
            keep = (cand[0].clone(), cand[1].clone())
        t0 = time.perf_counter()
        built = gain_transition_edges(
            z,
            band=band,
            beta=beta,
            max_degree=max_degree,
            block=block,
            density=rho,
            candidates=cand,
            ranking=ranking,
            progress="G3 edges" if progress else False,
            consume=True,
        )
        t, edges = built.transition, built.edges
        del built
        info["edge_seconds"] = time.perf_counter() - t0
        if edges is not None:
            info.update(certified=int(edges.certified.sum()), redone=int(edges.redone.sum()))
        del z, cand, edges
        # T's parts are fresh arrays of this build (not views of another tensor): held without a copy
        crow, col, val = t.crow_indices(), t.col_indices(), t.values()
        del t
        graph = cls._bare()
        graph._hold(
            embeddings,
            rho.to(embeddings.dtype),
            _plain(crow),
            _plain(col),
            _plain(val).to(embeddings.dtype),
            band=band,
            beta=beta,
            max_degree=max_degree,
        )
        if keep is not None:
            t0 = time.perf_counter()
            zu = _unit(embeddings)
            cells = None
            if not info.get("exact", False) and join_cells is not None:  # the join's own cells
                cells = IVFCells(join_cells[0], join_cells[1].to(torch.long), int(info["nprobe"]))
            elif not info.get("exact", False):
                cells = make_cells(
                    zu, nlist=nlist, nprobe=info.get("nprobe", nprobe), sample=sample, seed=seed, block=tile
                )
            graph.update_state = ivf_state(graph, zu, keep[0], keep[1], cells, info["density"]["sample"], block=tile)
            info["update_state_seconds"] = time.perf_counter() - t0
            del keep, zu
        graph.build_info = info
        log.info("G3Graph.build: %s", info)
        return graph

    @property
    def transition(self) -> Tensor:
        """``T`` as a sparse CSR ``(N, N)`` tensor, a view of the ``crow``/``col``/``val`` buffers."""
        return csr(self.crow, self.col, self.val, self.num_nodes)

    @property
    def num_nodes(self) -> int:
        return int(self.crow.shape[0]) - 1  # (a shape: no read of the embeddings in a traced forward)

    @property
    def device(self) -> torch.device:
        return self.crow.device

    def degree(self) -> Tensor:
        """Out-degree of every passage in ``T``."""
        return self.crow[1:] - self.crow[:-1]

    # -- updates (geograph.graphs.g3_updates) ------------------------------------------
    def _kept_state(self) -> G3State | None:
        return self.update_state

    def add(self, embeddings: Tensor, ids: Sequence[PassageId]) -> G3UpdateReport:
        """Add passages in place (appended in order); ``T`` and ``density`` equal the exact build's
        on the new corpus up to float rounding. The density sums move by the new x old block, the
        rows' cosine lists by :func:`~geograph.knn.update.lists_add`, and ``T`` is made
        from the lists, rows they cannot prove recomputed (see :mod:`geograph.graphs.g3_updates`)."""
        return g3_add(self, embeddings, ids)

    def remove(self, ids: Iterable[PassageId]) -> G3UpdateReport:
        """Remove passages in place (the rest keep their order), as :meth:`add` keeps ``T`` exact."""
        return g3_remove(self, ids)

    def extra_repr(self) -> str:
        return (
            f"nodes={self.num_nodes}, nnz={int(self.val.numel())}, band={self.band}, "
            f"beta={self.beta}, max_degree={self.max_degree}"
        )


def _update_width_after_load(module: G3Graph, incompatible_keys: object) -> None:
    module._update_width()


def _plain(t: Tensor) -> Tensor:
    """A tensor on ``t``'s memory that is not a view (no ``_base``): a sparse tensor's parts held
    as buffers without a copy (dynamo cannot trace a view of a sparse base)."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        t.untyped_storage(), t.storage_offset(), t.shape, t.stride()
    )
