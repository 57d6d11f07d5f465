"""Slow, trusted per-query reference implementations, for parity tests and benchmarks.

They follow the methods as their authors wrote them (numpy, scikit-learn, scipy,
GraphRicciCurvature), one query at a time. Requires the ``bench`` extra (GraphRicciCurvature: the ``ref`` extra).
"""

from __future__ import annotations

import numpy as np


def maniscope_reference(query: np.ndarray, docs: np.ndarray, *, k: int = 5, alpha: float = 0.3):
    """Maniscope for one query: scikit-learn k-NN, CSR graph, scipy Dijkstra from the anchor.

    Args:
        query: ``(D,)`` query embedding.
        docs: ``(N, D)`` candidate embeddings (real ones only).
        k: neighbours per candidate.
        alpha: weight of the cosine term.

    Returns:
        ``(scores (N,), geodesic (N,), order (N,))`` as numpy arrays (float64 / int64).
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra
    from sklearn.neighbors import NearestNeighbors

    docs = np.asarray(docs, dtype=np.float64)
    query = np.asarray(query, dtype=np.float64)
    n = docs.shape[0]
    dn = docs / np.maximum(np.linalg.norm(docs, axis=1, keepdims=True), np.finfo(np.float64).tiny)
    qn = query / max(np.linalg.norm(query), np.finfo(np.float64).tiny)
    q_cos = np.clip(dn @ qn, -1.0, 1.0)
    anchor = int(np.argmax(q_cos))
    kk = min(k, n - 1)
    if kk > 0:
        nn = NearestNeighbors(n_neighbors=kk, metric="cosine", algorithm="brute").fit(dn)
        dist, idx = nn.kneighbors()  # no X: each point's own entry is excluded
        eps = np.finfo(np.float64).eps
        rows = np.repeat(np.arange(n), kk)
        w = np.clip(dist.ravel(), eps, 2.0)
        g = csr_matrix((w, (rows, idx.ravel())), shape=(n, n))
        g = g.maximum(g.T)  # undirected: union of the directed k-NN links
        geo = dijkstra(g, directed=False, indices=anchor)
    else:
        geo = np.full(n, np.inf)
        geo[anchor] = 0.0
    sim_geo = np.where(np.isfinite(geo), 1.0 / (1.0 + geo), 0.0)
    scores = alpha * q_cos + (1.0 - alpha) * sim_geo
    order = np.argsort(-scores, kind="stable")
    return scores, geo, order


def ricci_reference(
    edges: list[tuple[int, int]],
    num_nodes: int,
    *,
    weights: dict | None = None,
    alpha: float = 0.5,
    exp_power: float = 2,
    iterations: int = 0,
    step: float = 1.0,
    delta: float = 1e-4,
):
    """GraphRicciCurvature 0.6.1 on one graph: ``OllivierRicci(..., method="OTD", proc=1)``.

    Args:
        edges: undirected edges ``(u, v)``.
        num_nodes: nodes ``0 .. num_nodes - 1`` (isolated ones included).
        weights: ``{(u, v): length}``; default 1 on every edge.
        alpha, exp_power: the lazy measures.
        iterations: 0 = initial curvature only; else ``compute_ricci_flow(iterations)``.
        step, delta: of the flow.

    Returns:
        ``(curvature, lengths)``: dicts ``{(u, v): value}`` with ``u < v`` (the initial
        curvature and unit lengths when ``iterations == 0``, else the flowed ones).
    """
    import logging

    import networkx as nx
    from GraphRicciCurvature.OllivierRicci import OllivierRicci

    logging.getLogger("GraphRicciCurvature").setLevel(logging.ERROR)
    g = nx.Graph()
    g.add_nodes_from(range(num_nodes))
    for u, v in edges:
        g.add_edge(int(u), int(v), weight=1.0 if weights is None else float(weights[(u, v)]))
    orc = OllivierRicci(g, alpha=alpha, exp_power=exp_power, method="OTD", proc=1, verbose="ERROR")
    if iterations:
        out = orc.compute_ricci_flow(iterations=iterations, step=step, delta=delta)
    else:
        out = orc.compute_ricci_curvature()
    curv = {(min(u, v), max(u, v)): float(d["ricciCurvature"]) for u, v, d in out.edges(data=True)}
    lengths = {(min(u, v), max(u, v)): float(d["weight"]) for u, v, d in out.edges(data=True)}
    return curv, lengths


def ricci_graph_reference(query: np.ndarray, docs: np.ndarray, *, percentile: float = 50.0) -> list[tuple[int, int]]:
    """The Ricci-Filtration query graph of one query, built in numpy (independent of ``query_graph``).

    Node 0 = query, nodes 1..N = candidates; ``r_ij = 1 - cos``; ``tau = numpy.percentile`` of
    ``r_ij`` over the pairs ``i < j``; an edge iff ``r_ij >= tau``, plus every query edge.

    Args:
        query: ``(D,)``; docs: ``(N, D)``; percentile: in ``[0, 100]``.

    Returns:
        the undirected edges ``(u, v)``, ``u < v``.
    """
    z = np.concatenate([np.asarray(query, np.float64)[None], np.asarray(docs, np.float64)])
    z = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), np.finfo(np.float64).tiny)
    r = 1.0 - z @ z.T
    iu, ju = np.triu_indices(len(z), 1)
    tau = np.percentile(r[iu, ju], percentile)
    return [(int(i), int(j)) for i, j in zip(iu, ju) if i == 0 or r[i, j] >= tau]


def g3_dense_reference(x: np.ndarray, band=(0.1, 0.7), beta: float = 0.4, max_degree=None):
    """G3RAG's transition matrix as the authors' code builds it: dense ``N x N`` numpy.

    ``S`` = cosine with diagonal 0, ``rho`` = mean clipped similarity min-max normalised,
    ``W = x sqrt(1 - x^2) exp(-beta rho_j)`` inside ``band`` (``None``: every positive weight),
    optional per-row top-``max_degree`` (stable order on ties), ``T`` row-normalised.

    Returns:
        ``(T, rho)`` float64 arrays.
    """
    x = np.asarray(x, dtype=np.float64)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    s = x @ x.T
    np.fill_diagonal(s, 0.0)
    n = len(s)
    rho = np.maximum(s, 0).sum(1) / n
    rho = (rho - rho.min()) / (rho.max() - rho.min()) if rho.max() > rho.min() else np.zeros(n)
    w = s * np.sqrt(np.clip(1 - s**2, 0, None)) * np.exp(-beta * rho)[None, :]
    ok = (s > 0) & (s < 1) if band is None else (s >= band[0]) & (s <= band[1])
    np.fill_diagonal(ok, False)
    w = np.where(ok & (w > 0), w, 0.0)
    if max_degree is not None:
        cut = np.argsort(-w, axis=1, kind="stable")[:, max_degree:]
        np.put_along_axis(w, cut, 0.0, axis=1)
    rs = w.sum(1, keepdims=True)
    return np.divide(w, rs, out=np.zeros_like(w), where=rs > 0), rho


def g3_retrieve_reference(x: np.ndarray, t: np.ndarray, q: np.ndarray, *, candidates: int, seeds: int, k: int):
    """G3RAG retrieval for one query with a dense ``T`` (:func:`g3_dense_reference`), in numpy.

    Seeds = the first ``seeds`` of the cosine top-``candidates`` (ties: lowest index first);
    ``y = p T`` with ``p`` uniform on the seeds; then the passages of largest positive ``y``;
    then a cosine top-up (the remaining candidates first, then the rest of the corpus). Each
    returned passage's score is the value of the stage that picked it: cosine for seeds and
    top-ups, ``y`` for diffused passages.

    Returns:
        ``(chosen ids (list of k), scores (k,), y (N,), cos (N,))``.
    """
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    cos = xn @ (q / np.linalg.norm(q))
    by_cos = np.argsort(-cos, kind="stable")
    cand = by_cos[:candidates]
    seed = cand[:seeds]
    p = np.zeros(len(x))
    p[seed] = 1.0 / seeds
    y = p @ t
    y[seed] = -np.inf
    order = np.argsort(-y, kind="stable")
    diffused = [i for i in order[: k - seeds] if y[i] > 0]
    chosen = list(seed) + diffused
    rest = [i for i in cand if i not in chosen] + [i for i in by_cos if i not in cand]
    top_up = [i for i in rest if i not in chosen][: k - len(chosen)]
    scores = np.concatenate(
        [cos[seed], y[np.asarray(diffused, dtype=np.int64)], cos[np.asarray(top_up, dtype=np.int64)]]
    )
    return chosen + top_up, scores, y, cos


def expmap0_reference(u: np.ndarray, c: float = 1.0) -> np.ndarray:
    """The Poincare ball's exponential map at the origin, in numpy: ``tanh(sqrt(c)|u|) u / (sqrt(c)|u|)``."""
    u = np.asarray(u, dtype=np.float64)
    sc = np.sqrt(c)
    norm = np.maximum(np.linalg.norm(u, axis=-1, keepdims=True), 1e-300)
    return np.tanh(sc * norm) * u / (sc * norm)


def iso_reference_phi(
    num_nodes: int,
    edges,
    z: np.ndarray,
    *,
    p: float = 2.0,
    c: float = 1.0,
    eps: float = float(np.finfo(np.float64).eps),
):
    """ISO-RAG's isoperimetric ratio per node from the points in the ball and the edge list (networkx BFS).

    ``v(u) = (2 / (1 - c |z_u|^2)) ** p``; ``S_u = {u} + N(u)``; ``dS_u`` = the nodes at exactly
    2 hops; ``phi_u = V(dS_u) / (V(S_u) + eps)`` (eps: float64's machine epsilon, the default of
    :func:`geograph.functional.isoperimetric_ratio` in float64). Self loops and duplicate edges are ignored.

    Args:
        num_nodes: ``V``.
        edges: ``(2, E)`` array-like of node ids (either or both directions).
        z: ``(V, d)`` points strictly inside the ball.

    Returns:
        ``(phi (V,), graph)``: float64 ratios and the undirected ``networkx.Graph``.
    """
    import networkx as nx

    z = np.asarray(z, dtype=np.float64)
    vol = (2.0 / (1.0 - c * (z**2).sum(1))) ** p
    g = nx.Graph()
    g.add_nodes_from(range(num_nodes))
    g.add_edges_from((int(a), int(b)) for a, b in np.asarray(edges).T if a != b)
    phi = np.zeros(num_nodes)
    for u in range(num_nodes):
        dist = nx.single_source_shortest_path_length(g, u, cutoff=2)
        ball = sum(vol[w] for w, d in dist.items() if d <= 1)
        shell = sum(vol[w] for w, d in dist.items() if d == 2)
        phi[u] = shell / (ball + eps)
    return phi, g


def iso_reference_kept(graph, phi: np.ndarray, beta: float) -> set[tuple[int, int]]:
    """The edges ``(u, v)`` (both directions) with ``min(phi) / max(phi) >= beta`` (0 / 0 counts as 1)."""
    kept = set()
    for a, b in graph.edges:
        lo, hi = min(phi[a], phi[b]), max(phi[a], phi[b])
        if (lo / hi if hi > 0 else 1.0) >= beta:
            kept |= {(a, b), (b, a)}
    return kept


def iso_reference(
    embeddings: np.ndarray,
    edges,
    query: np.ndarray,
    k: int,
    *,
    z: np.ndarray | None = None,
    p: float = 2.0,
    c: float = 1.0,
    m: int = 5,
    L: int = 50,
    hops: int = 1,
    max_nodes: int = 100,
    beta: float = 0.4,
    tau: float = 10.0,
    alpha: float = 0.85,
    lambda_g: float = 0.5,
    lambda_d: float = 0.5,
    prepared=None,
):
    """ISO-RAG for one query in plain numpy + networkx, from the raw inputs only.

    ``z`` = the points in the Poincare ball (default: :func:`expmap0_reference` of the raw
    embeddings, ISO-RAG's untrained signal; a trained f_theta's points otherwise);
    ``phi`` and the kept edges by :func:`iso_reference_phi` and :func:`iso_reference_kept`;
    dense cosine scores, seeds = top-``m``, the local set = dense top-``max(L, m)`` plus the
    ``hops``-hop neighbourhood of the seeds in the full graph, capped at ``max_nodes`` by dense
    score; a networkx subgraph of the kept edges; ``softmax(tau * s)`` on the seeds;
    ``networkx.pagerank`` (personalization = dangling = r) converged to 1e-12; min-max fusion.
    The defaults are :class:`~geograph.ISORetriever`'s (m 5, L 50, hops 1, max_nodes 100, beta 0.4,
    p 2, tau 10, alpha 0.85, lambda_g = lambda_d = 0.5).

    Args:
        embeddings: ``(V, D)`` passage embeddings.
        edges: ``(2, E)`` corpus graph edges.
        query: ``(D,)``.
        k: passages returned.
        prepared: ``(graph, kept)`` from :func:`iso_reference_prepare` (benchmarks build it once,
            outside the timed loop); computed here when not given.

    Returns:
        ``(ids (k,), scores (k,))`` numpy arrays.
    """
    import networkx as nx

    emb = np.asarray(embeddings, dtype=np.float64)
    if prepared is None:
        prepared = iso_reference_prepare(emb, edges, z=z, p=p, c=c, beta=beta)
    nxg, kept = prepared
    emb = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    q = np.asarray(query, dtype=np.float64)
    s = emb @ (q / np.linalg.norm(q))
    v = len(s)
    order = np.argsort(-s, kind="stable")
    seeds = order[: min(m, v)]
    local = set(order[: min(max(L, m), v)].tolist())
    frontier = set(seeds.tolist())
    for _ in range(hops):
        frontier = {w for u in frontier for w in nxg.neighbors(u)}
        local |= frontier
    local = sorted(local, key=lambda u: -s[u])[:max_nodes]
    sub = nx.DiGraph()
    sub.add_nodes_from(local)
    sub.add_edges_from(e for e in nxg.subgraph(local).to_directed().edges if e in kept)
    seed_set = set(seeds.tolist())
    logits = {u: tau * s[u] for u in local if u in seed_set}
    mx = max(logits.values())
    z_sum = sum(np.exp(x - mx) for x in logits.values())
    r = {u: (np.exp(logits[u] - mx) / z_sum if u in logits else 0.0) for u in local}
    pi = nx.pagerank(sub, alpha=alpha, personalization=r, dangling=r, tol=1e-12, max_iter=10000)

    def mm(x):
        arr = np.array([x[u] for u in local])
        span = arr.max() - arr.min()
        return (arr - arr.min()) / span if span > 0 else np.zeros_like(arr)

    score = lambda_g * mm(pi) + lambda_d * mm({u: s[u] for u in local})
    top = np.argsort(-score, kind="stable")[:k]
    return np.array(local)[top], score[top]


def iso_reference_prepare(
    embeddings: np.ndarray, edges, *, z: np.ndarray | None = None, p: float = 2.0, c: float = 1.0, beta: float = 0.4
):
    """The per-corpus part of :func:`iso_reference`: ``(networkx graph, kept directed edges)``."""
    emb = np.asarray(embeddings, dtype=np.float64)
    z = expmap0_reference(emb, c) if z is None else z
    phi, nxg = iso_reference_phi(len(emb), edges, z, p=p, c=c)
    return nxg, iso_reference_kept(nxg, phi, beta)


# --- per-query reference rankers of the benchmark table ---------------------------------------
# One signature for every method the registry names (MethodSpec.reference):
#   factory(corpus (V, D) tensor, params, cfg, cache, **artefacts) -> ref(query (D,), candidates (M,))
# where ``ref`` returns the corpus indices the method returns for that query, best first (int64);
# ``params`` are the grid point's method parameters, ``cfg`` the method's bench section (``k``, ...),
# ``cache`` a dict kept per data set for per-corpus work done once (outside the timed loop).


def maniscope_ranker_reference(corpus, params: dict, cfg: dict, cache: dict):
    """Maniscope with scikit-learn's k-NN graph and scipy's Dijkstra, one query at a time."""
    x = corpus.double().cpu().numpy()
    opts = {name: params[name] for name in ("k", "alpha") if name in params}

    def ref(q, c):
        c = np.asarray(c)
        return c[maniscope_reference(q.double().cpu().numpy(), x[c], **opts)[2]]

    return ref


def ricci_ranker_reference(corpus, params: dict, cfg: dict, cache: dict):
    """Ricci-Filtration with the query graph built in numpy (:func:`ricci_graph_reference`) and
    GraphRicciCurvature's 20-step flow; the kept candidates ordered by cosine."""
    x = corpus.double().cpu().numpy()
    percentile, eta = params.get("percentile", 50.0), params.get("eta", 1.0)

    def ref(q, c):
        c = np.asarray(c)
        qv, d = q.double().cpu().numpy(), x[c]
        edges = ricci_graph_reference(qv, d, percentile=percentile)
        n = len(c) + 1
        _, lengths = ricci_reference(edges, n, iterations=params.get("iterations", 20))
        kept = np.flatnonzero([lengths[(0, j)] <= eta for j in range(1, n)])
        cos = d @ qv / (np.linalg.norm(d, axis=1) * np.linalg.norm(qv))
        return c[kept[np.argsort(-cos[kept], kind="stable")]]

    return ref


def iso_ranker_reference(corpus, params: dict, cfg: dict, cache: dict, *, projection=None):
    """ISO-RAG in numpy + networkx from the raw inputs: the corpus, the k-NN edge list (``cfg["knn"]``,
    default 10) and, with a trained ``projection``, the projected points (never the module's phi)."""
    import torch

    from geograph.graphs.corpus_graph import CorpusGraph

    knn = cfg.get("knn", 10)
    if ("knn", knn) not in cache:
        cache[("knn", knn)] = CorpusGraph.from_knn(corpus, min(knn, corpus.shape[0] - 1))
    edges = cache[("knn", knn)].edge_index.cpu().numpy()
    emb = corpus.double().cpu().numpy()
    z, c = None, 1.0
    if projection is not None:
        with torch.no_grad():
            mlp = projection.eval().mlp(corpus.to(next(projection.parameters()).dtype))
        z, c = expmap0_reference(mlp.double().cpu().numpy(), projection.c), projection.c
    beta = params.get("beta", 0.4)
    key = ("iso-reference", projection is not None, knn, beta)
    if key not in cache:  # the per-corpus part, once per beta
        cache[key] = iso_reference_prepare(emb, edges, z=z, c=c, beta=beta)
    kwargs = {name: value for name, value in params.items() if name != "beta"}

    def ref(q, cands):
        out = iso_reference(
            emb, edges, q.double().cpu().numpy(), cfg["k"], beta=beta, c=c, prepared=cache[key], **kwargs
        )
        return np.asarray(out[0], dtype=np.int64)

    return ref


def g3_ranker_reference(corpus, params: dict, cfg: dict, cache: dict):
    """G3RAG with the dense numpy transition matrix (:func:`g3_dense_reference`); ``band``, ``beta``
    from ``params``, ``max_degree`` from ``cfg`` (default: all edges up to 2000 passages, else 128)."""
    band = params.get("band", (0.1, 0.7))
    band = tuple(band) if band is not None else None
    beta = params.get("beta", 0.4)
    max_degree = cfg.get("max_degree", None if corpus.shape[0] <= 2000 else 128)
    x = corpus.double().cpu().numpy()
    key = ("g3-reference", band, beta, max_degree)
    if key not in cache:
        cache[key] = g3_dense_reference(x, band, beta, max_degree)[0]
    seeds = params.get("seeds", cfg.get("seeds", 2))

    def ref(q, c):
        out = g3_retrieve_reference(
            x, cache[key], q.double().cpu().numpy(), candidates=cfg.get("candidates", 10), seeds=seeds, k=cfg["k"]
        )
        return np.asarray(out[0], dtype=np.int64)

    return ref


def resolve(path: str):
    """The object named by ``"module:attribute"`` (a registry entry's ``reference``)."""
    import importlib

    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)
