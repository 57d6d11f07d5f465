"""Ricci-Filtration and the Ricci flow written in numpy + POT from the formulas of the Ricci-Filtration
paper and of Ollivier-Ricci curvature, for reference tests.

Follows GraphRicciCurvature 0.6.1 (``OllivierRicci(method="OTD")`` and ``compute_ricci_flow``):
the query graph (``r = 1 - cos``, ``numpy.percentile``, forced query edges, unit lengths),
Floyd-Warshall distances, the lazy measures (GraphRicciCurvature's uniform fallback when the
neighbour weights sum to at most 1e-7), ``ot.emd2`` for W1, kappa 0 where ``d(x, y) < 1e-7``,
the flow normalised to mean length 1 over all edges with its early stop, then the surgery
``w_0j <= eta``, cosine scores on the kept candidates and a stable descending order. Nothing
of geograph is called. (scipy's csgraph is not used for the distances: its dense input drops
the ~1e-10 edges the flow makes, which changes kappa there.) Unlike GraphRicciCurvature, every
component flows and a flow that shrinks every edge to 0 leaves them at 0 (the documented rule
of :func:`geograph.functional.ricci_flow`); GraphRicciCurvature would cut to the largest
component or divide by zero there.
"""

import numpy as np
import ot

ZERO = 1e-7  # GraphRicciCurvature's EPSILON


def ref_query_graph(q, docs, percentile=50.0):
    z = np.concatenate([q[None], docs]).astype(np.float64)
    z = z / np.linalg.norm(z, axis=1, keepdims=True)
    r = 1.0 - z @ z.T
    iu, ju = np.triu_indices(len(z), 1)
    tau = np.percentile(r[iu, ju], percentile)
    adj = np.zeros((len(z), len(z)), dtype=bool)
    sel = (r[iu, ju] >= tau) | (iu == 0)
    adj[iu[sel], ju[sel]] = True
    return adj | adj.T


def ref_curvature(adj, w, alpha, p):
    n = len(adj)
    d = np.where(adj, w, np.inf)
    np.fill_diagonal(d, 0.0)
    for via in range(n):  # Floyd-Warshall
        d = np.minimum(d, d[:, via, None] + d[None, via, :])
    m = np.zeros((n, n))
    for x in range(n):
        nb = np.flatnonzero(adj[x])
        if len(nb) == 0:
            m[x, x] = 1.0
            continue
        e = np.exp(-(w[x, nb] ** p))
        m[x, nb] = (1 - alpha) * (e / e.sum() if e.sum() > ZERO else 1.0 / len(nb))
        m[x, x] = alpha
    kappa = np.zeros((n, n))
    for x, y in zip(*np.nonzero(np.triu(adj, 1))):
        if d[x, y] < ZERO:
            continue
        sx, sy = np.flatnonzero(m[x]), np.flatnonzero(m[y])
        kappa[x, y] = kappa[y, x] = 1.0 - ot.emd2(m[x, sx], m[y, sy], d[np.ix_(sx, sy)]) / d[x, y]
    return kappa


_FLOWS = {}


def ref_flow(adj, *, iterations=20, step=1.0, delta=1e-4, alpha=0.5, p=2.0):
    """``(lengths, curvature, steps taken, converged)`` of the normalised flow from unit lengths."""
    key = (adj.tobytes(), len(adj), iterations, step, delta, alpha, p)
    if key not in _FLOWS:  # the threshold test asks for the same flows twice
        _FLOWS[key] = _ref_flow(adj, iterations, step, delta, alpha, p)
    return _FLOWS[key]


def _ref_flow(adj, iterations, step, delta, alpha, p):
    w = adj.astype(np.float64)
    kappa = ref_curvature(adj, w, alpha, p)
    upper = np.triu(adj, 1)
    if not upper.any():
        return w, kappa, 0, False  # nothing to flow
    for it in range(1, iterations + 1):
        w = np.where(adj, w - step * kappa * w, 0.0)
        total = w[upper].sum()
        w = w * upper.sum() / total if total > 0 else w
        kappa = ref_curvature(adj, w, alpha, p)
        if kappa[upper].max() - kappa[upper].min() < delta:
            return w, kappa, it, True
    return w, kappa, iterations, False


def ref_ricci_filtration(q, docs, *, eta=1.0, percentile=50.0, **flow):
    """One query, real candidates only: ``(keep, length, curvature, scores, order)`` numpy."""
    adj = ref_query_graph(q, docs, percentile)
    w, kappa, _, _ = ref_flow(adj, **flow)
    length, curv = w[0, 1:], kappa[0, 1:]
    keep = length <= eta
    cos = (docs @ q) / (np.linalg.norm(docs, axis=1) * np.linalg.norm(q))
    scores = np.where(keep, cos, -np.inf)
    return keep, length, curv, scores, np.argsort(-scores, kind="stable")
