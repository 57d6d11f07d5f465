"""Save and load :class:`CorpusGraph` and :class:`G3Graph` as artefact directories (:mod:`geograph.artefact`).

The tensors are memory-mapped on load and held as the graph's buffers without a copy, so
processes loading one graph share its pages. A directory in the former format (``graph.json``
/ ``g3graph.json`` beside ``torch.save`` files) still loads, with a one-line
``DeprecationWarning`` saying how to convert it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from geograph.artefact import (
    CorpusFingerprint,
    EncoderIdentity,
    as_identity,
    corpus_fingerprint,
    is_artefact,
    read_artefact,
    resolve_source,
    write_artefact,
)
from geograph.functional.gain import check_band
from geograph.graphs._legacy import CORPUS_META, G3_META, load_corpus_graph_v1, load_g3_graph_v1

__all__ = ["save_graph", "load_corpus_graph", "load_g3_graph"]


def _provenance(graph: nn.Module, embeddings: Tensor, encoder: Any, ids: Sequence[str] | None):
    """The encoder identity and corpus fingerprint to record (a loaded graph keeps its own)."""
    saved = getattr(graph, "manifest", None) or {}
    identity = as_identity(encoder)
    if identity is None and saved.get("encoder"):
        identity = EncoderIdentity.from_dict(saved["encoder"])
    if identity is not None and identity.dim is None:
        identity = EncoderIdentity.from_dict({**identity.as_dict(), "dim": int(embeddings.shape[1])})
    corpus = corpus_fingerprint(embeddings, ids)
    old = saved.get("corpus") or {}
    if ids is None and old.get("ids_sha256") and old.get("embeddings_sha256") == corpus.embeddings_sha256:
        corpus = CorpusFingerprint.from_dict({**corpus.as_dict(), "ids_sha256": old["ids_sha256"]})
    return identity, corpus


def save_graph(graph: nn.Module, directory: str | Path, *, encoder: Any = None, ids=None) -> Path:
    """Write a :class:`CorpusGraph` or :class:`G3Graph` as an artefact directory."""
    kind = type(graph).__name__
    identity, corpus = _provenance(graph, graph.embeddings, encoder, ids)
    if kind == "CorpusGraph":
        tensors = {"embeddings": graph.embeddings, "edge_index": graph.edge_index, "rowptr": graph.rowptr}
        params = {"name": graph.name, "num_nodes": graph.num_nodes, "num_edges": graph.num_edges}
    else:
        tensors = {k: getattr(graph, k) for k in ("embeddings", "density", "crow", "col", "val")}
        band = None if graph.band is None else list(graph.band)
        params = {"band": band, "beta": graph.beta, "max_degree": graph.max_degree, "num_nodes": graph.num_nodes}
    params["dim"] = int(graph.embeddings.shape[1])
    return write_artefact(
        directory,
        kind,
        tensors,
        params=params,
        encoder=identity,
        corpus=corpus,
        build_info=graph.build_info,
    )


def _legacy(path: Path, meta: str) -> bool:
    return not is_artefact(path) and (path / meta).is_file()


def _deprecated(path: Path, kind: str) -> None:
    warnings.warn(
        f"{path}: a {kind} saved in the former torch.save format; it loads, but re-save it with "
        f"{kind}.from_pretrained(path).save_pretrained(new_dir) (or rebuild it with geograph build-graph)",
        DeprecationWarning,
        stacklevel=4,
    )


def _check_shape(where: Path, v: int, d: int, corpus_shape) -> None:
    if corpus_shape is not None and (v, d) != tuple(corpus_shape):
        raise ValueError(
            f"{where}: a graph of {v} passages x {d} dimensions, the corpus is {corpus_shape[0]} x {corpus_shape[1]}"
        )


def _tensor(art, name: str, shape: tuple, *, floating: bool) -> Tensor:
    t = art.tensors.get(name)
    if t is None or tuple(t.shape) != shape or t.is_floating_point() != floating:
        got = "none" if t is None else f"a {tuple(t.shape)} {str(t.dtype).replace('torch.', '')} tensor"
        kind = "floating" if floating else "integer"
        raise ValueError(f"{art.path}: {name} must be a {shape} {kind} tensor as the manifest says, got {got}")
    return t if floating else t.long()


def _ints(art, *names: str) -> list[int]:
    try:
        return [int(art.params[n]) for n in names]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{art.path}: the manifest's params lack {', '.join(names)}") from None


def load_corpus_graph(cls, source, *, corpus=None, encoder=None, device=None, corpus_shape=None):
    """A :class:`CorpusGraph` from an artefact directory or hub id (the former format: deprecated)."""
    path = resolve_source(source, cls.__name__)
    if _legacy(path, CORPUS_META):
        graph = load_corpus_graph_v1(cls, path, device, _shape(corpus, corpus_shape))
        _deprecated(path, cls.__name__)
        graph.manifest = {}
        return graph
    art = read_artefact(path, cls.__name__, encoder=encoder, corpus=corpus)
    v, e, d = _ints(art, "num_nodes", "num_edges", "dim")
    _check_shape(art.path / "manifest.json", v, d, corpus_shape)
    emb = _tensor(art, "embeddings", (v, d), floating=True)
    ei = _tensor(art, "edge_index", (2, 2 * e), floating=False)
    rowptr = _tensor(art, "rowptr", (v + 1,), floating=False)
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= v):
        raise ValueError(f"{art.path}: edge_index holds node ids outside [0, {v})")
    if int(rowptr[0]) != 0 or int(rowptr[-1]) != 2 * e or bool((rowptr[1:] < rowptr[:-1]).any()):
        raise ValueError(f"{art.path}: rowptr is not the CSR row pointer of {2 * e} edges over {v} nodes")
    src = torch.repeat_interleave(torch.arange(v), rowptr[1:] - rowptr[:-1])
    if not torch.equal(src, ei[0]):
        raise ValueError(f"{art.path}: edge_index is not sorted by source as rowptr says")
    del src
    graph = cls.__new__(cls)  # the mapped tensors as they are: the constructor would clean (copy) them
    nn.Module.__init__(graph)
    graph.name = str(art.params.get("name", "edge_index"))
    graph.build_info = art.manifest.get("build_info") or {}
    for name, t in (("embeddings", emb), ("edge_index", ei), ("rowptr", rowptr)):
        graph.register_buffer(name, t if device is None else t.to(device))
    graph.manifest = {**art.manifest, "source": str(art.path)}
    return graph


def load_g3_graph(cls, source, *, corpus=None, encoder=None, device=None, corpus_shape=None):
    """A :class:`G3Graph` from an artefact directory or hub id (the former format: deprecated)."""
    path = resolve_source(source, cls.__name__)
    if _legacy(path, G3_META):
        graph = load_g3_graph_v1(cls, path, device, _shape(corpus, corpus_shape))
        _deprecated(path, cls.__name__)
        graph.manifest = {}
        return graph
    art = read_artefact(path, cls.__name__, encoder=encoder, corpus=corpus)
    n, d = _ints(art, "num_nodes", "dim")
    _check_shape(art.path / "manifest.json", n, d, corpus_shape)
    col = art.tensors.get("col")
    nnz = -1 if col is None else int(col.shape[0])
    emb = _tensor(art, "embeddings", (n, d), floating=True)
    density = _tensor(art, "density", (n,), floating=True)
    crow = _tensor(art, "crow", (n + 1,), floating=False)
    col = _tensor(art, "col", (nnz,), floating=False)
    val = _tensor(art, "val", (nnz,), floating=True)
    if (
        int(crow[0]) != 0
        or int(crow[-1]) != nnz
        or bool((crow[1:] < crow[:-1]).any())
        or (nnz and (int(col.min()) < 0 or int(col.max()) >= n))
    ):
        raise ValueError(f"{art.path}: the CSR arrays (crow, col) are not a valid {n} x {n} matrix with {nnz} entries")
    p = art.params
    try:
        band = check_band(None if p.get("band") is None else tuple(p["band"]))
        beta, max_degree = float(p["beta"]), p.get("max_degree")
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{art.path}: bad band / beta in the manifest ({exc})") from None
    parts = [t if device is None else t.to(device) for t in (emb, density, crow, col, val)]
    graph = cls._from_parts(*parts, band=band, beta=beta, max_degree=max_degree)  # no copy of the mapped tensors
    graph.build_info = art.manifest.get("build_info") or {}
    graph.manifest = {**art.manifest, "source": str(art.path)}
    return graph


def _shape(corpus, corpus_shape):
    if isinstance(corpus, tuple) and len(corpus) == 2:
        corpus = corpus[1]
    if corpus_shape is None and isinstance(corpus, Tensor):
        return tuple(corpus.shape)
    if corpus_shape is None and isinstance(corpus, CorpusFingerprint):
        return (corpus.num_passages, corpus.dim)
    return corpus_shape
