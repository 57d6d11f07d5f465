"""Graphs saved in the former format (format 1: ``torch.save`` files beside a small JSON).

Read with ``torch.load(weights_only=True)`` (tensors only, no code), checked as before, with a
one-line ``DeprecationWarning`` saying how to convert them. New saves write the artefact format
(:mod:`geograph.artefacts.saved_graphs`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from torch import Tensor

from geograph._io import check_file_size, one_line, read_json, read_torch
from geograph.artefacts.format import Device
from geograph.artefacts.identity import CorpusFingerprint
from geograph.artefacts.saved_graphs import Shape, valid_csr
from geograph.geometry.gain import csr

if TYPE_CHECKING:
    from geograph.graphs._base import PassageGraph
    from geograph.graphs.corpus_graph import CorpusGraph
    from geograph.graphs.g3_graph import G3Graph

__all__ = ["CORPUS_META", "G3_META", "load_former", "load_corpus_graph_v1", "load_g3_graph_v1"]

_FORMAT = 1
CORPUS_META = "graph.json"
G3_META, _DATA = "g3graph.json", "g3graph.pt"

G = TypeVar("G", bound="PassageGraph")


def load_former(cls: type[G], path: Path, *, corpus: Any, device: Device, shape: Shape) -> G | None:
    """A graph of class ``cls`` from ``path`` in the former format, with a ``DeprecationWarning``;
    ``None`` when ``path`` does not hold one."""
    meta, load = _FORMER[cls._artefact_layout]
    if not (path / meta).is_file():
        return None
    graph: G = load(cls, path, device, _shape(corpus, shape))
    warnings.warn(
        f"{path}: a {cls.__name__} saved in the former torch.save format; it loads, but re-save it with "
        f"{cls.__name__}.from_pretrained(path).save_pretrained(new_dir) (or rebuild it with geograph build-graph)",
        DeprecationWarning,
        stacklevel=4,
    )
    graph.manifest = {}
    return graph


def _shape(corpus: Any, corpus_shape: Shape) -> Shape:
    """The ``(V, D)`` the graph must have: ``corpus_shape``, else the corpus's (embeddings or fingerprint)."""
    if isinstance(corpus, tuple) and len(corpus) == 2:
        corpus = corpus[1]
    if corpus_shape is None and isinstance(corpus, Tensor):
        return tuple(corpus.shape)
    if corpus_shape is None and isinstance(corpus, CorpusFingerprint):
        return (corpus.num_passages, corpus.dim)
    return corpus_shape


def load_corpus_graph_v1(cls: type[CorpusGraph], directory: Path, device: Device, corpus_shape: Shape) -> CorpusGraph:
    """A ``CorpusGraph`` from ``embeddings.pt``, ``edge_index.pt`` and ``graph.json``.

    Raises:
        ValueError: one line naming the file: another format version, a truncated or unreadable
            file, tensors whose sizes do not match ``graph.json``, or a graph whose size does not
            match ``corpus_shape``.
    """
    _META = CORPUS_META
    path = Path(directory)
    meta_file = path / _META
    if not meta_file.is_file():
        raise ValueError(f"{path} is not a saved CorpusGraph (no {_META})")
    meta = read_json(meta_file)
    if meta.get("format") != _FORMAT:
        raise ValueError(
            f"{meta_file}: CorpusGraph format {meta.get('format')!r}, this geograph reads format {_FORMAT}"
        )
    try:
        v, e, d = int(meta["num_nodes"]), int(meta["num_edges"]), int(meta["dim"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{meta_file}: missing or bad num_nodes / num_edges / dim ({one_line(exc)})") from None
    if corpus_shape is not None and (v, d) != tuple(corpus_shape):
        raise ValueError(
            f"{meta_file}: a graph of {v} passages x {d} dimensions, the corpus is "
            f"{corpus_shape[0]} x {corpus_shape[1]}"
        )
    files = meta.get("files") or {}  # (sizes are recorded since the atomic save)
    for name in ("embeddings.pt", "edge_index.pt"):
        check_file_size(path / name, files.get(name), meta_file)
    emb = read_torch(path / "embeddings.pt", device)
    ei = read_torch(path / "edge_index.pt", device)
    if not isinstance(emb, Tensor) or tuple(emb.shape) != (v, d) or not emb.is_floating_point():
        raise ValueError(
            f"{path / 'embeddings.pt'}: expected ({v}, {d}) floating embeddings as {_META} says, got {_describe(emb)}"
        )
    if (
        not isinstance(ei, Tensor)
        or tuple(ei.shape) != (2, 2 * e)
        or ei.is_floating_point()
        or (ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= v))
    ):
        raise ValueError(
            f"{path / 'edge_index.pt'}: expected (2, {2 * e}) node ids in [0, {v}) as {_META} says, got {_describe(ei)}"
        )
    try:
        graph = cls(emb, ei, name=meta.get("name", "edge_index"))
    except ValueError as exc:
        raise ValueError(f"{path}: {one_line(exc)}") from None
    if graph.num_edges != e:
        raise ValueError(f"{path / 'edge_index.pt'}: {graph.num_edges} edges after cleaning, {_META} says {e}")
    graph.build_info = meta.get("build", {})
    return graph


def load_g3_graph_v1(cls: type[G3Graph], directory: Path, device: Device, corpus_shape: Shape) -> G3Graph:
    """A ``G3Graph`` from ``g3graph.pt`` and ``g3graph.json``.

    Raises:
        ValueError: one line naming the file: another format version, a truncated or unreadable
            file, tensors whose sizes do not match ``g3graph.json`` or each other, or a graph
            whose ``(N, D)`` is not ``corpus_shape`` (when given).
    """
    _META = G3_META
    path = Path(directory)
    meta_file, data = path / _META, path / _DATA
    if not meta_file.is_file():
        raise ValueError(f"{path} is not a saved G3Graph (no {_META})")
    meta = read_json(meta_file)
    if meta.get("format") != _FORMAT:
        raise ValueError(f"{meta_file}: G3Graph format {meta.get('format')!r}, this geograph reads format {_FORMAT}")
    try:
        n, nnz = int(meta["num_nodes"]), int(meta["nnz"])
        band = tuple(meta["band"]) if meta["band"] is not None else None
        beta, max_degree = meta["beta"], meta["max_degree"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{meta_file}: missing or bad fields ({one_line(exc)})") from None
    check_file_size(data, (meta.get("files") or {}).get(_DATA), meta_file)
    blob = read_torch(data, device)
    want: dict[str, tuple[int, ...] | None] = {
        "embeddings": None,
        "density": (n,),
        "crow": (n + 1,),
        "col": (nnz,),
        "val": (nnz,),
    }
    if not isinstance(blob, dict) or set(blob) != set(want) or not all(isinstance(t, Tensor) for t in blob.values()):
        raise ValueError(f"{data}: expected the tensors {sorted(want)}, got {_keys(blob)}")
    emb = blob["embeddings"]
    d = meta.get("dim")  # (recorded since the atomic save)
    if d is None:
        d = emb.shape[1] if emb.dim() == 2 else -1
    want["embeddings"] = (n, d)
    for key, shape in want.items():
        if tuple(blob[key].shape) != shape:
            raise ValueError(f"{data}: {key} has shape {tuple(blob[key].shape)}, {_META} says {shape}")
    crow, col = blob["crow"], blob["col"]
    if not valid_csr(crow, col, n, nnz):
        raise ValueError(f"{data}: the CSR arrays (crow, col) are not a valid {n} x {n} matrix with {nnz} entries")
    if corpus_shape is not None and tuple(emb.shape) != tuple(corpus_shape):
        raise ValueError(
            f"{data}: a graph of {n} passages x {emb.shape[1]} dimensions, the corpus is "
            f"{corpus_shape[0]} x {corpus_shape[1]}"
        )
    t = csr(crow, col, blob["val"], n)
    try:
        graph = cls(emb, t, blob["density"], band=band, beta=beta, max_degree=max_degree)
    except ValueError as exc:
        raise ValueError(f"{path}: {one_line(exc)}") from None
    graph.build_info = meta.get("build", {})
    return graph


def _describe(x: object) -> str:
    if isinstance(x, Tensor):
        return f"a {tuple(x.shape)} {str(x.dtype).replace('torch.', '')} tensor"
    return f"a {type(x).__name__}"


def _keys(blob: object) -> str:
    return f"keys {sorted(map(str, blob))}" if isinstance(blob, dict) else f"a {type(blob).__name__}"


#: each graph layout's former metadata file and loader
_FORMER: dict[str, tuple[str, Callable[..., Any]]] = {
    "CorpusGraph": (CORPUS_META, load_corpus_graph_v1),
    "G3Graph": (G3_META, load_g3_graph_v1),
}
