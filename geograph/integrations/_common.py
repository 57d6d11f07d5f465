"""What the framework components share: embedding texts, one padded module call per query list."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn


def default_encoder():
    """The offline all-MiniLM-L6-v2 (``text`` extra), without an on-disk cache."""
    from geograph.data import Encoder

    return Encoder(cache=False)


def resolve_encoder(owner: Any, num_passages: int | None = None) -> Any:
    """``owner.encoder`` when given, else the default encoder, made once and kept in ``owner._encoder``;
    checked against the artefacts ``owner.module`` was loaded from (:func:`check_artefacts`)."""
    if owner.encoder is None and owner._encoder is None:
        owner._encoder = default_encoder()
    encoder = owner.encoder if owner.encoder is not None else owner._encoder
    check_artefacts(owner.module, encoder, num_passages)
    return encoder


def check_artefacts(module: Any, encoder: Any, num_passages: int | None = None) -> None:
    """Refuse a module holding a loaded artefact (``from_pretrained``) whose manifest records another
    encoder than ``encoder`` (when it is a :class:`geograph.data.Encoder`) or another number of
    passages than the component's corpus; one line naming both sides."""
    from geograph.artefact import ArtefactMismatch, EncoderIdentity, check_encoder

    if not isinstance(module, nn.Module):
        return
    for sub in module.modules():
        manifest = getattr(sub, "manifest", None)
        if not manifest:
            continue
        where = manifest.get("source", type(sub).__name__)
        if isinstance(getattr(encoder, "identity", None), EncoderIdentity):
            check_encoder(manifest, encoder, where)
        saved = (manifest.get("corpus") or {}).get("num_passages")
        if num_passages is not None and saved is not None and saved != num_passages:
            raise ArtefactMismatch(f"{where}: built over {saved} passages; the corpus given has {num_passages}")


def embed(encoder: Any, texts: Sequence[str], *, query: bool = False) -> Tensor:
    """``(len(texts), D)`` float embeddings of ``texts``.

    ``encoder``: a :class:`geograph.data.Encoder` (or anything with ``encode(texts)``), a
    LangChain ``Embeddings`` (``embed_query`` / ``embed_documents``), or a callable
    ``texts -> (N, D)``.
    """
    texts = list(texts)
    if hasattr(encoder, "embed_documents"):
        rows = [encoder.embed_query(t) for t in texts] if query else encoder.embed_documents(texts)
        return torch.as_tensor(rows, dtype=torch.float32)
    out = encoder.encode(texts) if hasattr(encoder, "encode") else encoder(texts)
    return torch.as_tensor(out)


def module_device(module: nn.Module) -> torch.device | None:
    """The device of a module's registered state (``None``: it holds none, inputs decide)."""
    for t in module.state_dict().values():
        return t.device
    return None


def rerank(module: nn.Module, queries: Tensor, docs: Sequence[Tensor]) -> list[list[tuple[int, float]]]:
    """One padded, masked call of a reranker for ``B`` queries and their candidate lists.

    Args:
        module: a reranker (:class:`~geograph.Maniscope`, :class:`~geograph.RicciFiltration`).
        queries: ``(B, D)``.
        docs: ``B`` tensors ``(n_i, D)``, ``n_i >= 1``.

    Returns:
        Per query, ``(position, score)`` of the candidates the method keeps, best first.
    """
    sizes = [int(d.shape[0]) for d in docs]
    if len(sizes) != queries.shape[0]:
        raise ValueError(f"docs has {len(sizes)} candidate lists for {queries.shape[0]} queries")
    if min(sizes, default=1) < 1:
        raise ValueError("docs: every query needs at least one candidate")
    b, n, d = len(sizes), max(sizes), queries.shape[1]
    padded = queries.new_zeros(b, n, d)
    mask = torch.zeros(b, n, dtype=torch.bool, device=queries.device)
    for i, x in enumerate(docs):
        padded[i, : sizes[i]] = x.to(queries)
        mask[i, : sizes[i]] = True
    with torch.inference_mode():
        res = module(queries, padded, mask)
    order, scores, keep = res.order.cpu(), res.scores.cpu(), res.keep.cpu()
    return [[(j, float(scores[i, j])) for j in order[i, : sizes[i]].tolist() if keep[i, j]] for i in range(b)]


def retrieve(module: nn.Module, queries: Tensor, k: int) -> list[list[tuple[int, float]]]:
    """One call of a corpus retriever (ISO, G3, dense): per query, ``(corpus row, score)`` best first."""
    device = module_device(module)
    with torch.inference_mode():
        res = module(queries if device is None else queries.to(device), k)
    idx, scores = res.indices.cpu(), res.scores.cpu()
    return [list(zip(idx[i].tolist(), (float(s) for s in scores[i]))) for i in range(idx.shape[0])]


def cut(ranked: list, top_n: int | None) -> list:
    """The first ``top_n`` entries (``None``: all)."""
    return ranked if top_n is None else ranked[:top_n]


def check_top(value: int | None, name: str) -> int | None:
    """``value`` if ``None`` or a positive integer, else a ``ValueError`` naming ``name``."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    return value
