r"""Running top-``k`` lists fed by tiles of scores: a compiled kernel on CPU, ``torch`` elsewhere.

Every tile of the k-NN engine (the exact scan's tiles, the IVF join's cell blocks, the rows' own
probes) is made by matrix products; what is kept of it goes through :func:`offer_rows` (each tile
row offers its scores to that row's list), :func:`offer_cols` (each chosen tile column offers its
scores to that column's list: the other side of a symmetric join) or :func:`offer_tile` (both
sides of a join tile in one kernel call; :class:`TileOffers` pays the kernel's set-up once for a
join's thousands of tiles). On CPU the lists are kept by a numba kernel, parallel over lists,
with their worst entry at the root: short lists (up to 32 entries) sorted worst first, longer
ones as min-heaps. A candidate below its list's current ``k``-th entry costs one comparison, one
above it replaces the root and moves past the entries it beats (a heap: sifts down, ``O(log k)``),
so selecting costs about one pass over the tile. On other devices (CUDA) and while tracing, the
candidates are merged by :func:`~geograph.knn.allpairs.merge_topk`.

Either way the kept set is exact: each list holds the ``k`` best of what was offered to it,
ranked by value, equal values by the lowest id (the tie rule of every geograph ranking), so the
lists equal the tiled top-``k`` of the same scores whatever the tiling. The entries of a list come
in no fixed order (worst first or a heap on CPU); :func:`~geograph.knn.allpairs.sort_topk` orders
them. ``-inf``, NaN and excluded pairs never enter; a list offered fewer than ``k`` candidates
keeps ``-inf`` and id ``-1`` in its other slots.

Memory: the kernel reads the tile in place and writes the lists in place (no ``(R, C)``
temporaries: the optional ``scale`` factors are applied inside it, with the same rounding as a
``torch`` product of the two).

Compilation: the kernel compiles on first use per dtype (float32, float64) and is cached on disk
by numba (the package's ``__pycache__``; where it cannot write one, in memory for the process).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor

from geograph import _checks

__all__ = [
    "new_lists",
    "offer_rows",
    "offer_cols",
    "offer_tile",
    "TileOffers",
    "offer_lists",
    "compiled",
    "kernel_threads",
]

#: held while a parallel kernel runs: numba's ``workqueue`` threading layer aborts when two threads
#: launch parallel kernels at once (the kernels spread over every numba thread anyway); re-entrant,
#: as a :class:`TileOffers` holds it across its tiles and the offers made inside it
_LOCK = threading.RLock()

_KERNELS: dict[str, Any] = {}


def _heap_kernels() -> dict[str, Any]:
    """The numba kernels, compiled (or loaded from numba's cache) on first use."""
    if not _KERNELS:
        from geograph.knn import _heap

        _KERNELS.update(
            rows=_heap.rows_kernel, cols=_heap.cols_kernel, tile=_heap.tile_kernel, lists=_heap.lists_kernel
        )
    return _KERNELS


def compiled(t: Tensor) -> bool:
    """Whether lists on ``t``'s device are kept by the compiled kernel (CPU, float32 / float64, not tracing)."""
    return t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64) and not _checks.tracing()


def kernel_threads() -> int:
    """The threads a kernel runs on: torch's count (``torch.set_num_threads``), at most numba's."""
    import numba

    return max(1, min(torch.get_num_threads(), int(numba.config.NUMBA_NUM_THREADS)))  # type: ignore[attr-defined]


@contextmanager
def _kernel_threads_held() -> Iterator[int]:
    """The kernel lock held and numba set to :func:`kernel_threads` (yielded) for the block, torch's
    own thread count kept."""
    import numba

    threads = kernel_threads()
    before = torch.get_num_threads()
    with _LOCK:
        try:
            numba.set_num_threads(threads)
            yield threads
        finally:
            if torch.get_num_threads() != before:  # numba's OpenMP layer shares the count with torch
                torch.set_num_threads(before)


def _run(name: str, *args: Any) -> None:
    """Run kernel ``name`` on numpy views of ``args`` with torch's thread count, torch's count kept."""
    kernel = _heap_kernels()[name]
    arrays = [a.numpy() if isinstance(a, Tensor) else a for a in args]
    with _kernel_threads_held():
        kernel(*arrays)


def new_lists(n: int, k: int, like: Tensor) -> tuple[Tensor, Tensor]:
    """``n`` empty lists of ``k`` entries: ``-inf`` values and id ``-1``, on ``like``'s device and dtype."""
    return like.new_full((n, k), float("-inf")), torch.full((n, k), -1, dtype=torch.long, device=like.device)


_EMPTY = torch.empty(0)
_EMPTY_NP = {torch.float32: np.empty(0, np.float32), torch.float64: np.empty(0, np.float64)}


def offer_rows(
    best_v: Tensor,
    best_i: Tensor,
    rows: Tensor,
    s: Tensor,
    cols: Tensor,
    *,
    exclude: Tensor | None = None,
    scale: Tensor | None = None,
) -> None:
    """Tile row ``r`` offers ``s[r, c] * scale[c]`` with id ``cols[c]`` to list ``rows[r]``, in place.

    Args:
        best_v, best_i: ``(N, k)`` running lists (made by :func:`new_lists`, fed only by these functions).
        rows: ``(R,)`` distinct list rows of the tile's rows.
        s: ``(R, C)`` scores.
        cols: ``(C,)`` long ids of the tile's columns.
        exclude: ``(R,)`` the id tile row ``r`` never keeps (itself), or ``None``.
        scale: ``(C,)`` factors of the columns' scores, or ``None``.

    Example:
        >>> from geograph.knn.allpairs import sort_topk
        >>> v, i = new_lists(2, 2, torch.zeros(1))
        >>> offer_rows(v, i, torch.tensor([0, 1]), torch.tensor([[0.5, 0.9, 0.5], [0.1, 0.2, 0.3]]),
        ...            torch.tensor([7, 1, 3]), exclude=torch.tensor([1, -1]))
        >>> sort_topk(v, i)
        (tensor([[0.5000, 0.5000],
                [0.3000, 0.2000]]), tensor([[3, 7],
                [3, 1]]))
    """
    k = best_v.shape[1]
    if k == 0 or s.numel() == 0:
        return
    if compiled(best_v):
        excl = torch.full((s.shape[0],), -1, dtype=torch.long) if exclude is None else exclude
        sc = _EMPTY.to(s.dtype) if scale is None else scale.to(s.dtype).contiguous()
        _run("rows", s.contiguous(), cols.contiguous(), sc, best_v, best_i, rows.contiguous(), excl.contiguous())
        return
    from geograph.knn.allpairs import merge_topk

    ranked = s if scale is None else s * scale
    if exclude is not None:
        ranked = ranked.masked_fill(exclude.unsqueeze(1) == cols, float("-inf"))
    tv, ti = merge_topk(ranked, cols.expand(s.shape[0], -1), min(k, s.shape[1]))
    ti = ti.masked_fill(~(tv > float("-inf")), -1)
    _merge(best_v, best_i, rows, tv, ti)


def offer_cols(
    best_v: Tensor,
    best_i: Tensor,
    s: Tensor,
    pick: Tensor,
    owners: Tensor,
    ids: Tensor,
    *,
    scale: Tensor | None = None,
) -> None:
    """Tile column ``pick[p]`` offers ``s[r, pick[p]] * scale[r]`` with id ``ids[r]`` to list
    ``owners[p]``, for every tile row ``r``, in place (the other side of a symmetric join).

    Args:
        best_v, best_i: ``(N, k)`` running lists.
        s: ``(R, C)`` scores.
        pick: ``(P,)`` long positions of the offering columns in ``s``.
        owners: ``(P,)`` distinct list rows of those columns.
        ids: ``(R,)`` long ids of the tile's rows.
        scale: ``(R,)`` factors of the rows' scores, or ``None``.

    Example:
        >>> v, i = new_lists(3, 1, torch.zeros(1))
        >>> offer_cols(v, i, torch.tensor([[0.5, 0.9], [0.7, 0.2]]), torch.tensor([1]), torch.tensor([2]),
        ...            torch.tensor([4, 5]))
        >>> v[2], i[2]
        (tensor([0.9000]), tensor([4]))
    """
    k = best_v.shape[1]
    if k == 0 or pick.numel() == 0 or s.shape[0] == 0:
        return
    if compiled(best_v):
        sc = _EMPTY.to(s.dtype) if scale is None else scale.to(s.dtype).contiguous()
        _run("cols", s.contiguous(), pick.contiguous(), ids.contiguous(), sc, best_v, best_i, owners.contiguous())
        return
    from geograph.knn.allpairs import merge_topk

    st = s.T[pick]
    if scale is not None:
        st = st * scale
    tv, ti = merge_topk(st, ids.expand(st.shape[0], -1), min(k, st.shape[1]))
    ti = ti.masked_fill(~(tv > float("-inf")), -1)
    _merge(best_v, best_i, owners, tv, ti)


def offer_tile(
    best_v: Tensor,
    best_i: Tensor,
    s: Tensor,
    rows: Tensor,
    cols: Tensor,
    first_col: int,
    *,
    exclude_self: bool = False,
    row_scale: Tensor | None = None,
    col_scale: Tensor | None = None,
) -> None:
    """Both sides of one tile of a symmetric join, in place: tile row ``r`` offers
    ``s[r, c] * col_scale[c]`` with id ``cols[c]`` to list ``rows[r]`` for every column (as
    :func:`offer_rows`; with ``exclude_self`` never its own id ``rows[r]``), and every column
    ``c >= first_col`` offers ``s[r, c] * row_scale[r]`` with id ``rows[r]`` to list ``cols[c]``
    (as :func:`offer_cols`). On CPU one kernel call does both (one parallel region a tile).

    Args:
        best_v, best_i: ``(N, k)`` running lists.
        s: ``(R, C)`` scores.
        rows: ``(R,)`` distinct list rows (and ids) of the tile's rows.
        cols: ``(C,)`` long ids of the tile's columns; ``cols[first_col:]`` distinct lists, none of
            them in ``rows``.
        first_col: the first column that also offers itself to its rows (``C``: none).
        exclude_self: row ``r`` never keeps id ``rows[r]``.
        row_scale, col_scale: ``(R,)`` / ``(C,)`` factors of the scores offered by the rows to the
            columns' lists / by the columns to the rows' lists, or ``None``.

    Example:
        >>> from geograph.knn.allpairs import sort_topk
        >>> v, i = new_lists(3, 1, torch.zeros(1))
        >>> s = torch.tensor([[1.0, 0.3, 0.9], [0.3, 1.0, 0.2]])  # rows 0, 1 against ids 0, 1, 2
        >>> offer_tile(v, i, s, torch.tensor([0, 1]), torch.tensor([0, 1, 2]), 2, exclude_self=True)
        >>> sort_topk(v, i)
        (tensor([[0.9000],
                [0.3000],
                [0.9000]]), tensor([[2],
                [0],
                [0]]))
    """
    with TileOffers(best_v, best_i) as offers:
        offers.tile(s, rows, cols, first_col, exclude_self=exclude_self, row_scale=row_scale, col_scale=col_scale)


class TileOffers:
    """Many tiles offered to the same running lists one after another (:func:`offer_tile` each): on
    CPU the compiled kernel's set-up (numpy views of the lists, the thread count, the kernel lock)
    is paid once for all of them, not once a tile, which matters for the IVF join's thousands of
    small tiles. Use as a context manager; on other devices (and while tracing) each tile goes to
    :func:`offer_rows` and :func:`offer_cols`.

    Example:
        >>> from geograph.knn.allpairs import sort_topk
        >>> v, i = new_lists(2, 1, torch.zeros(1))
        >>> with TileOffers(v, i) as offers:
        ...     offers.tile(torch.tensor([[0.4]]), torch.tensor([0]), torch.tensor([1]), 0)
        >>> sort_topk(v, i)
        (tensor([[0.4000],
                [0.4000]]), tensor([[1],
                [0]]))
    """

    def __init__(self, best_v: Tensor, best_i: Tensor) -> None:
        self.best_v, self.best_i = best_v, best_i
        self._kernel: Any = None
        self._threads = 1
        self._held = ExitStack()
        self._lists: tuple[Any, Any] | None = None

    def __enter__(self) -> TileOffers:
        if compiled(self.best_v) and self.best_v.shape[1] > 0:
            self._kernel = _heap_kernels()["tile"]
            self._threads = self._held.enter_context(_kernel_threads_held())
            self._lists = (self.best_v.numpy(), self.best_i.numpy())
        return self

    def __exit__(self, *exc: object) -> None:
        self._lists = None
        self._held.close()

    def tile(
        self,
        s: Tensor,
        rows: Tensor,
        cols: Tensor,
        first_col: int,
        *,
        exclude_self: bool = False,
        row_scale: Tensor | None = None,
        col_scale: Tensor | None = None,
    ) -> None:
        """One tile, as :func:`offer_tile` ``(best_v, best_i, s, rows, cols, first_col, ...)``."""
        n_r, n_c = s.shape
        if self.best_v.shape[1] == 0 or n_r == 0 or n_c == 0:
            return
        if not 0 <= first_col <= n_c:
            raise ValueError(f"first_col={first_col} must be in [0, {n_c}]")
        if self._lists is None:  # torch's merges (CUDA, tracing): each side as its own offer
            excl = rows if exclude_self else None
            offer_rows(self.best_v, self.best_i, rows, s, cols, exclude=excl, scale=col_scale)
            pick = torch.arange(first_col, n_c, device=s.device)
            offer_cols(self.best_v, self.best_i, s, pick, cols[first_col:], rows, scale=row_scale)
            return
        empty = _EMPTY_NP[s.dtype]
        self._kernel(
            s.contiguous().numpy(),
            rows.contiguous().numpy(),
            cols.contiguous().numpy(),
            empty if col_scale is None else col_scale.to(s.dtype).contiguous().numpy(),
            empty if row_scale is None else row_scale.to(s.dtype).contiguous().numpy(),
            first_col,
            exclude_self,
            *self._lists,
            self._threads,
        )


def offer_lists(best_v: Tensor, best_i: Tensor, rows: Tensor, values: Tensor, ids: Tensor) -> None:
    """Lists ``(values, ids)`` ``(R, c)`` offered to the running lists of the distinct ``rows``, in place
    (the merge of partial lists built apart, e.g. by an executor's tiles).

    Example:
        >>> from geograph.knn.allpairs import sort_topk
        >>> v, i = new_lists(1, 2, torch.zeros(1))
        >>> offer_lists(v, i, torch.tensor([0]), torch.tensor([[0.2, 0.8, 0.5]]), torch.tensor([[4, 6, 2]]))
        >>> sort_topk(v, i)
        (tensor([[0.8000, 0.5000]]), tensor([[6, 2]]))
    """
    if best_v.shape[1] == 0 or values.numel() == 0:
        return
    if compiled(best_v):
        _run("lists", values.contiguous(), ids.contiguous(), best_v, best_i, rows.contiguous())
        return
    _merge(best_v, best_i, rows, values, ids)


def _merge(best_v: Tensor, best_i: Tensor, rows: Tensor, values: Tensor, ids: Tensor) -> None:
    from geograph.knn.allpairs import merge_topk

    best_v[rows], best_i[rows] = merge_topk(
        torch.cat([best_v[rows], values], 1), torch.cat([best_i[rows], ids], 1), best_v.shape[1]
    )
