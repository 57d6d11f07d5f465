"""The work counters of the exact transport simplex (numba-free, so importing it compiles nothing).

The compiled kernels (:mod:`geograph.transport._numba.simplex`, :mod:`geograph.transport._numba.ricci`)
count into int64 arrays whose last axis has the columns below; :class:`SimplexStats` is what the
Python side returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SimplexStats"]

# columns of a counts array
STAT_PROBLEMS = 0
STAT_WARM = 1
STAT_PIVOTS = 2
STAT_DUAL = 3
N_STATS = 4


@dataclass(frozen=True)
class SimplexStats:
    """Work of the exact transport simplex over one call (sums over its transport problems).

    Attributes:
        problems: transport problems the simplex solved (an edge with ``d(x, y) < 1e-7`` or an
            empty Kantorovich-Rubinstein support has none: its curvature is set directly).
        warm_started: problems that started from the previous flow step's basis (the others
            started cold, by the matrix-minimum rule).
        pivots: primal simplex pivots.
        dual_steps: dual simplex steps that made warm-started bases feasible.
    """

    problems: int
    warm_started: int
    pivots: int
    dual_steps: int

    @classmethod
    def from_counts(cls, counts: np.ndarray) -> SimplexStats:
        """From the kernels' ``(..., 4)`` int64 counts (per-chunk rows are summed)."""
        total = np.asarray(counts, dtype=np.int64).reshape(-1, N_STATS).sum(0)
        return cls(
            problems=int(total[STAT_PROBLEMS]),
            warm_started=int(total[STAT_WARM]),
            pivots=int(total[STAT_PIVOTS]),
            dual_steps=int(total[STAT_DUAL]),
        )
