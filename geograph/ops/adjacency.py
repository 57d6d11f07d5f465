"""Graph utilities: batched k-nearest-neighbour graphs, the Ricci-Filtration query graph, and
edge-list helpers (cleaning an ``edge_index``, CSR row pointers)."""

from __future__ import annotations

import torch
from torch import Tensor

from geograph._checks import check_candidates, check_mask, check_percentile, check_positive_int, check_tensor
from geograph.ops.similarity import cosine_similarity
from geograph.outputs import topk_stable


def knn_graph(x: Tensor, k: int, mask: Tensor | None = None) -> Tensor:
    r"""Symmetric k-nearest-neighbour adjacency by cosine similarity.

    Node ``i`` links to the ``k`` other real nodes of highest cosine similarity; the graph is
    the union of these directed links, ``A = K \lor K^T``, with no self loops.

    If a graph has fewer than ``k + 1`` real nodes, ``k`` clamps to the number of other real
    nodes (every real node links to every other one); a graph with a single real node has no
    edges; ``N = 0`` gives an empty ``(B, 0, 0)`` adjacency. Ties at the ``k``-th neighbour:
    the lowest index is linked (:func:`~geograph.outputs.topk_stable`).

    Args:
        x: node vectors ``(B, N, D)``.
        k: neighbours per node, ``k >= 1``.
        mask: ``(B, N)`` bool, True = real node; ``None`` = all real.

    Returns:
        ``(B, N, N)`` bool adjacency, symmetric, False on the diagonal and at padding.

    Example:
        >>> x = torch.tensor([[[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]]])
        >>> knn_graph(x, k=1).int()
        tensor([[[0, 1, 0],
                 [1, 0, 1],
                 [0, 1, 0]]], dtype=torch.int32)
    """
    check_positive_int(k, "k")
    check_tensor(x, "x", 3, finite=False)
    sim = cosine_similarity(x, mask=mask)
    return knn_from_similarity(sim, k, mask)


def knn_from_similarity(sim: Tensor, k: int, mask: Tensor | None = None) -> Tensor:
    """:func:`knn_graph` from a precomputed similarity matrix ``sim (B, N, N)`` (higher = nearer).

    Args:
        sim: ``(B, N, N)`` similarities; only the real block is read.
        k: neighbours per node, ``k >= 1``; clamps as in :func:`knn_graph`.
        mask: ``(B, N)`` bool, True = real node; ``None`` = all real.

    Returns:
        ``(B, N, N)`` bool symmetric adjacency.
    """
    check_positive_int(k, "k")
    check_tensor(sim, "sim", 3, finite=False)
    b, n, n2 = sim.shape
    if n != n2:
        raise ValueError(f"sim must be square (B, N, N), got {tuple(sim.shape)}")
    mask = check_mask(mask, (b, n), "mask")
    adj = torch.zeros(b, n, n, dtype=torch.bool, device=sim.device)
    if min(k, n - 1) <= 0:  # N <= 1: no pair of nodes
        return adj
    values, idx = knn_lists(sim, k, mask)
    # Rows with fewer than k real neighbours select -inf entries: drop them.
    adj.scatter_(-1, idx, values > float("-inf"))
    return adj | adj.transpose(1, 2)


def knn_lists(sim: Tensor, k: int, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Each node's directed k-NN links: ``(values, idx)``, both ``(B, N, min(k, N - 1))``.

    ``values`` are the similarities of the selected neighbours, ``-inf`` where a node has
    fewer real neighbours than ``k`` (those ``idx`` entries point nowhere meaningful). No
    validation: callers (:func:`knn_from_similarity`, Maniscope) have checked the inputs.
    """
    b, n, _ = sim.shape
    invalid = torch.eye(n, dtype=torch.bool, device=sim.device).expand(b, n, n)
    if mask is not None:
        invalid = invalid | ~(mask.unsqueeze(2) & mask.unsqueeze(1))
    return topk_stable(sim.masked_fill(invalid, float("-inf")), min(k, n - 1))


def query_graph(
    query: Tensor, docs: Tensor, mask: Tensor | None = None, *, percentile: float = 50.0
) -> tuple[Tensor, Tensor, Tensor]:
    r"""The Ricci-Filtration graph of each query: node 0 = query, nodes 1..N = candidates.

    ``r_ij = 1 - cos(z_i, z_j)``; ``tau`` is the ``percentile``-th percentile of ``r_ij`` over
    the valid pairs ``i < j`` (query included; linear interpolation as ``numpy.percentile``);
    an edge joins ``i`` and ``j`` iff ``r_ij >= tau``, and every query edge ``(0, j)`` is
    forced. Computed in float64 so that ties at ``tau`` fall as they do in numpy.

    Args:
        query: ``(B, D)``.
        docs: ``(B, N, D)``.
        mask: ``(B, N)`` bool, True = real candidate; ``None`` = all real.
        percentile: in ``[0, 100]``.

    Returns:
        ``(adj, node_mask, tau)``: ``(B, N+1, N+1)`` bool, ``(B, N+1)`` bool, ``(B,)`` float64.

    Example:
        >>> q = torch.tensor([[1.0, 0.0]])
        >>> docs = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
        >>> adj, _, tau = query_graph(q, docs)
        >>> adj[0].int(), float(tau[0])
        (tensor([[0, 1, 1],
                [1, 0, 1],
                [1, 1, 0]], dtype=torch.int32), 1.0)
    """
    cand_mask = check_candidates(query, docs, mask)
    b, n, _ = docs.shape
    if n < 1:
        raise ValueError(f"docs must hold at least one candidate, got shape {tuple(docs.shape)}")
    percentile = check_percentile(percentile)
    if cand_mask is None:
        cand_mask = torch.ones(b, n, dtype=torch.bool, device=docs.device)
    node_mask = torch.cat([torch.ones(b, 1, dtype=torch.bool, device=docs.device), cand_mask], 1)
    z = torch.cat([query.unsqueeze(1), docs], 1).double()
    r = 1.0 - cosine_similarity(z, mask=node_mask)
    pair = torch.triu(node_mask.unsqueeze(2) & node_mask.unsqueeze(1), diagonal=1)
    tau = masked_percentile(r, pair, percentile)
    adj = pair & (r >= tau.view(-1, 1, 1))
    adj[:, 0, 1:] |= cand_mask
    adj = adj | adj.transpose(1, 2)
    return adj, node_mask, tau


def masked_percentile(values: Tensor, valid: Tensor, q: float) -> Tensor:
    """numpy's linear-interpolation percentile of ``values[b][valid[b]]`` for every ``b``.

    ``numpy.percentile(v, q)`` with ``v`` sorted and ``pos = (count - 1) * q / 100``:
    ``v[floor(pos)] + (v[floor(pos) + 1] - v[floor(pos)]) * frac(pos)`` (numpy's lerp).

    Args:
        values: ``(B, ...)`` floating.
        valid: bool of ``values``' shape; True = counted.
        q: percentile in ``[0, 100]``.

    Returns:
        ``(B,)`` in ``values``' dtype.

    Example:
        >>> v = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
        >>> float(masked_percentile(v, torch.tensor([[True, True, True, False]]), 50.0))
        2.0
    """
    flat = torch.where(valid, values, torch.full_like(values, float("inf"))).flatten(1)
    ranked = flat.sort(1).values
    count = valid.flatten(1).sum(1)
    pos = (count - 1).clamp_min(0).to(values.dtype) * (q / 100.0)
    lo = pos.floor().long()
    hi = torch.minimum(lo + 1, (count - 1).clamp_min(0))
    v_lo = ranked.gather(1, lo.unsqueeze(1)).squeeze(1)
    v_hi = ranked.gather(1, hi.unsqueeze(1)).squeeze(1)
    frac = pos - lo.to(values.dtype)
    # numpy's lerp: a + (b - a) * t, switching to b - (b - a) * (1 - t) for t >= 0.5
    diff = v_hi - v_lo
    return torch.where(frac >= 0.5, v_hi - diff * (1 - frac), v_lo + diff * frac)


def clean_edge_index(edge_index: Tensor, num_nodes: int) -> Tensor:
    """``edge_index`` as an undirected graph: both directions, sorted, no duplicates, no self loops.

    Example:
        >>> clean_edge_index(torch.tensor([[0, 1, 1, 2], [1, 0, 1, 0]]), 3)
        tensor([[0, 0, 1, 2],
                [1, 2, 0, 0]])
    """
    num_nodes = check_positive_int(num_nodes, "num_nodes")
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must be a (2, E) tensor, got {getattr(edge_index, 'shape', type(edge_index))}")
    if edge_index.is_floating_point() or edge_index.dtype == torch.bool:
        raise ValueError(f"edge_index must hold integer node ids, got dtype {edge_index.dtype}")
    edge_index = edge_index.long()
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise ValueError(f"edge_index holds node ids outside [0, {num_nodes})")
    # imported here: torch_geometric's import (seconds: it loads torch._dynamo and transformers)
    # would otherwise be paid by every process that imports geograph
    from torch_geometric.utils import coalesce, remove_self_loops, to_undirected

    edge_index, _ = remove_self_loops(edge_index)
    out: Tensor = coalesce(to_undirected(edge_index, num_nodes=num_nodes), num_nodes=num_nodes)
    return out


def csr_rowptr(rows: Tensor, num_nodes: int) -> Tensor:
    """CSR row pointers of an edge list sorted by source: ``rowptr[u] = #{e : rows[e] < u}``.

    Args:
        rows: ``(E,)`` long source node of each edge, sorted.
        num_nodes: ``V``.

    Returns:
        ``(V + 1,)`` long on ``rows``' device; row ``u``'s edges are ``rowptr[u]:rowptr[u + 1]``.

    Example:
        >>> csr_rowptr(torch.tensor([0, 0, 2]), 4)
        tensor([0, 2, 2, 3, 3])
    """
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.long, device=rows.device)
    rowptr[1:] = torch.bincount(rows, minlength=num_nodes).cumsum(0)
    return rowptr


def csr_row_slots(rowptr: Tensor, rows: Tensor, width: int, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Padded positions of CSR rows: the entries of ``rows (...)`` as a ``(..., width)`` block.

    ``at[..., j]`` is the position (into the CSR ``col`` / ``val`` arrays) of the ``j``-th
    entry of the row, ``ok[..., j]`` whether that entry exists; missing slots point at
    position 0 (read ``col[at]`` / ``val[at]`` and mask with ``ok``). ``width`` must be at
    least the largest degree among ``rows`` (known a priori: no host read). Rows marked False
    in ``valid`` are empty (a negative id, e.g. padding, reads row 0: mark it invalid). The
    one padded CSR-row gather of the package (ISO-RAG's hops, G3RAG's diffusion).

    Example:
        >>> rowptr = torch.tensor([0, 2, 2, 3])
        >>> at, ok = csr_row_slots(rowptr, torch.tensor([[0, 2, 1]]), 2)
        >>> at, ok
        (tensor([[[0, 1],
                 [2, 0],
                 [0, 0]]]), tensor([[[ True,  True],
                 [ True, False],
                 [False, False]]]))
    """
    safe = rows.clamp_min(0)
    start, deg = rowptr[safe], rowptr[safe + 1] - rowptr[safe]
    if valid is not None:
        deg = torch.where(valid, deg, torch.zeros_like(deg))
    offs = torch.arange(width, device=rows.device)
    ok = offs < deg.unsqueeze(-1)
    at = torch.where(ok, start.unsqueeze(-1) + offs, torch.zeros_like(start).unsqueeze(-1))
    return at, ok
