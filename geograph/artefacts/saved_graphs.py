"""Save and load :class:`~geograph.CorpusGraph` and :class:`~geograph.G3Graph` as artefact directories.

The tensors are memory-mapped on load (:mod:`geograph.artefacts.format`) and held as the graph's
buffers without a copy, so processes loading one graph share its pages. A directory in the former
format (``graph.json`` / ``g3graph.json`` beside ``torch.save`` files) still loads
(:mod:`geograph.artefacts.former_graphs`), with a one-line ``DeprecationWarning`` saying how to
convert it.

Corpus versions: the manifest's ``corpus`` records ``version``, 0 for a built graph and one more
for each ``add`` or ``remove`` applied since (``graph.corpus_version``, kept through a save and a
load), and, for a graph updated after it was loaded, ``parent``: the ``version``,
``embeddings_sha256`` and ``ids_sha256`` of the saved corpus it was updated from. A manifest
without ``version`` (written before it was recorded) loads as version 0.

Passages: saved with ``ids``, a graph also writes :data:`PASSAGES`, one JSON line ``[id, key]``
per row, ``key`` the embedding cache's key of the passage's embedded text
(:func:`geograph.data.cache.text_key`) when ``text_keys`` were given, else ``null``. A loaded
graph's first update reads its ids from it (:func:`saved_ids`); ``geograph update`` reads the
keys to tell the added, removed and edited passages of a changed corpus (:func:`read_passages`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch
from torch import Tensor

from geograph._io import check_file_size, read_json
from geograph.artefacts.format import (
    MANIFEST,
    Artefact,
    Device,
    is_artefact,
    read_artefact,
    resolve_source,
    write_artefact,
)
from geograph.artefacts.identity import CorpusFingerprint, EncoderIdentity, corpus_fingerprint, recorded_identity
from geograph.geometry.gain import check_band

if TYPE_CHECKING:
    from geograph.graphs._base import PassageGraph
    from geograph.graphs.corpus_graph import CorpusGraph
    from geograph.graphs.g3_graph import G3Graph

__all__ = ["PASSAGES", "load_graph", "read_passages", "save_graph", "saved_ids", "valid_csr"]

#: the side file of a graph saved with its passages' ids and text keys
PASSAGES = "passages.jsonl"

G = TypeVar("G", bound="PassageGraph")

#: the ``(V, D)`` a loaded graph must have, when known
Shape = tuple[int, ...] | None


def _corpus_graph_parts(graph: CorpusGraph) -> tuple[dict[str, Tensor], dict[str, Any]]:
    tensors = {"embeddings": graph.embeddings, "edge_index": graph.edge_index, "rowptr": graph.rowptr}
    return tensors, {"name": graph.name, "num_nodes": graph.num_nodes, "num_edges": graph.num_edges}


def _g3_graph_parts(graph: G3Graph) -> tuple[dict[str, Tensor], dict[str, Any]]:
    tensors = {k: getattr(graph, k) for k in ("embeddings", "density", "crow", "col", "val")}
    band = None if graph.band is None else list(graph.band)
    return tensors, {"band": band, "beta": graph.beta, "max_degree": graph.max_degree, "num_nodes": graph.num_nodes}


def _manifest(owner: object) -> dict[str, Any]:
    """The manifest a loaded graph (or retriever) was read with, with its ``source``; ``{}`` for a built one."""
    return getattr(owner, "manifest", None) or {}


def _provenance(
    graph: PassageGraph, encoder: Any, ids: Sequence[str] | None
) -> tuple[EncoderIdentity | None, CorpusFingerprint]:
    """The encoder identity and corpus fingerprint to record (a loaded graph keeps its own)."""
    saved = _manifest(graph)
    identity = recorded_identity(encoder, int(graph.embeddings.shape[1]), saved)
    corpus = corpus_fingerprint(graph.embeddings, ids)
    old = saved.get("corpus") or {}
    if ids is None and old.get("ids_sha256") and old.get("embeddings_sha256") == corpus.embeddings_sha256:
        corpus = CorpusFingerprint.from_dict({**corpus.as_dict(), "ids_sha256": old["ids_sha256"]})
    return identity, corpus


def _lineage(graph: PassageGraph) -> dict[str, Any]:
    """The manifest's ``corpus.version`` and ``corpus.parent`` of ``graph``."""
    version = int(graph.corpus_version)
    saved = _manifest(graph).get("corpus") or {}
    out: dict[str, Any] = {"version": version}
    if saved and version != int(saved.get("version", 0)):  # updated since it was loaded
        out["parent"] = {k: saved.get(k) for k in ("version", "embeddings_sha256", "ids_sha256")}
        out["parent"]["version"] = int(saved.get("version", 0))
    elif saved.get("parent"):
        out["parent"] = saved["parent"]
    return out


def _passages_file(ids: Sequence[str], text_keys: Sequence[str | None] | None) -> bytes:
    if text_keys is None:
        text_keys = [None] * len(ids)
    if len(text_keys) != len(ids):
        raise ValueError(f"text_keys: {len(text_keys)} keys for {len(ids)} passage ids")
    return "".join(json.dumps([str(i), None if k is None else str(k)]) + "\n" for i, k in zip(ids, text_keys)).encode()


def save_graph(
    graph: PassageGraph,
    directory: str | Path,
    *,
    encoder: Any = None,
    ids: Sequence[str] | None = None,
    text_keys: Sequence[str | None] | None = None,
) -> Path:
    """Write a :class:`~geograph.CorpusGraph` or :class:`~geograph.G3Graph` as an artefact directory."""
    known = graph.passage_ids
    if ids is None and known is not None and all(isinstance(i, str) for i in known.ids):
        # an updated graph's own ids (a graph never named has integer ids: not recorded)
        ids = cast(list[str], known.ids)
    elif ids is None and known is None and _unchanged_since_load(graph):
        ids, keys = _saved_passages(graph)  # saved again as loaded: its passages too
        text_keys = keys if text_keys is None and all(k is not None for k in keys) else text_keys
    if ids is not None and len(ids) != graph.num_nodes:
        raise ValueError(f"ids: {len(ids)} passage ids for {graph.num_nodes} passages")
    if text_keys is not None and ids is None:
        raise ValueError("text_keys need the passage ids (ids=...)")
    side = {} if ids is None else {PASSAGES: _passages_file(ids, text_keys)}
    identity, corpus = _provenance(graph, encoder, ids)
    tensors, params = _LAYOUTS[graph._artefact_layout].parts(graph)
    params["dim"] = int(graph.embeddings.shape[1])
    return write_artefact(
        directory,
        type(graph).__name__,
        tensors,
        params=params,
        encoder=identity,
        corpus=corpus,
        build_info=graph.build_info,
        side_files=side,
        lineage=_lineage(graph),
    )


def _unchanged_since_load(graph: PassageGraph) -> bool:
    """Whether ``graph`` was loaded with a passages file and not updated since."""
    manifest = _manifest(graph)
    return (
        manifest.get("source") is not None
        and PASSAGES in (manifest.get("files") or {})
        and int(graph.corpus_version) == _version(manifest)
    )


def _version(manifest: dict[str, Any]) -> int:
    try:
        return int((manifest.get("corpus") or {}).get("version", 0))
    except (TypeError, ValueError):
        return 0


def read_passages(source: str | Path) -> tuple[list[str], list[str | None]]:
    """The passage ids and text keys (``None`` where not saved) of a graph saved with its ids
    (:data:`PASSAGES`), in row order.

    Raises:
        ValueError: one line naming the directory: no such file (a graph saved without ``ids``),
            a malformed line, or another number of rows than the manifest's.
    """
    path = Path(source)
    file = path / PASSAGES
    manifest = read_json(path / MANIFEST)
    if not file.is_file() or PASSAGES not in (manifest.get("files") or {}):  # (a file left by an older save)
        raise ValueError(
            f"{path} holds no {PASSAGES} (the passages' ids and text keys): it was saved without them; "
            "save it with ids=..., or build it again with geograph build-graph"
        )
    check_file_size(file, manifest["files"][PASSAGES], path / MANIFEST)
    ids: list[str] = []
    keys: list[str | None] = []
    with file.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            try:
                i, k = json.loads(line)
            except (ValueError, TypeError):
                raise ValueError(f"{file}:{lineno}: not an [id, key] JSON line") from None
            ids.append(str(i))
            keys.append(None if k is None else str(k))
    n = (manifest.get("params") or {}).get("num_nodes")
    if n is not None and int(n) != len(ids):
        raise ValueError(f"{file}: {len(ids)} passages, the manifest says {n}")
    return ids, keys


def saved_ids(graph: object) -> list[str] | None:
    """The passage ids saved with a graph loaded by ``from_pretrained`` (``None``: none saved).

    Raises:
        ValueError: the directory's ids are not those the loaded graph was saved with (it was
            replaced since the graph was loaded).
    """
    manifest = _manifest(graph)
    if manifest.get("source") is None or PASSAGES not in (manifest.get("files") or {}):
        return None
    return _saved_passages(graph)[0]


def _saved_passages(graph: object) -> tuple[list[str], list[str | None]]:
    manifest = _manifest(graph)
    source = manifest["source"]
    ids, keys = read_passages(source)
    saved = (manifest.get("corpus") or {}).get("ids_sha256")
    if corpus_fingerprint(torch.empty(len(ids), 0), ids).ids_sha256 != saved:
        raise ValueError(f"ids: {source}/{PASSAGES} was replaced since the graph was loaded; call set_ids(ids)")
    return ids, keys


def _check_shape(where: Path, v: int, d: int, corpus_shape: tuple[int, ...] | None) -> None:
    if corpus_shape is not None and (v, d) != tuple(corpus_shape):
        raise ValueError(
            f"{where}: a graph of {v} passages x {d} dimensions, the corpus is {corpus_shape[0]} x {corpus_shape[1]}"
        )


def valid_csr(crow: Tensor, col: Tensor, n: int, nnz: int) -> bool:
    """Whether ``(crow, col)`` are the CSR row pointer and columns of an ``n x n`` matrix of ``nnz`` entries."""
    return not (
        int(crow[0]) != 0
        or int(crow[-1]) != nnz
        or bool((crow[1:] < crow[:-1]).any())
        or (nnz and (int(col.min()) < 0 or int(col.max()) >= n))
    )


def _tensor(art: Artefact, name: str, shape: tuple[int, ...], *, floating: bool) -> Tensor:
    t = art.tensors.get(name)
    if t is None or tuple(t.shape) != shape or t.is_floating_point() != floating:
        got = "none" if t is None else f"a {tuple(t.shape)} {str(t.dtype).replace('torch.', '')} tensor"
        kind = "floating" if floating else "integer"
        raise ValueError(f"{art.path}: {name} must be a {shape} {kind} tensor as the manifest says, got {got}")
    return t if floating else t.long()


def _ints(art: Artefact, *names: str) -> list[int]:
    try:
        return [int(art.params[n]) for n in names]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{art.path}: the manifest's params lack {', '.join(names)}") from None


def _read_corpus_graph(cls: type[CorpusGraph], art: Artefact, corpus_shape: tuple[int, ...] | None) -> CorpusGraph:
    v, e, d = _ints(art, "num_nodes", "num_edges", "dim")
    _check_shape(art.path / MANIFEST, v, d, corpus_shape)
    emb = _tensor(art, "embeddings", (v, d), floating=True)
    ei = _tensor(art, "edge_index", (2, 2 * e), floating=False)
    rowptr = _tensor(art, "rowptr", (v + 1,), floating=False)
    if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= v):
        raise ValueError(f"{art.path}: edge_index holds node ids outside [0, {v})")
    if not valid_csr(rowptr, ei[1], v, 2 * e):
        raise ValueError(f"{art.path}: rowptr is not the CSR row pointer of {2 * e} edges over {v} nodes")
    src = torch.repeat_interleave(torch.arange(v), rowptr[1:] - rowptr[:-1])
    if not torch.equal(src, ei[0]):
        raise ValueError(f"{art.path}: edge_index is not sorted by source as rowptr says")
    del src
    graph = cls._bare()  # the mapped tensors as they are: the constructor would clean (copy) them
    graph._hold(emb, ei, rowptr, name=str(art.params.get("name", "edge_index")))
    return graph


def _read_g3_graph(cls: type[G3Graph], art: Artefact, corpus_shape: tuple[int, ...] | None) -> G3Graph:
    n, d = _ints(art, "num_nodes", "dim")
    _check_shape(art.path / MANIFEST, n, d, corpus_shape)
    col = art.tensors.get("col")
    nnz = -1 if col is None else int(col.shape[0])
    emb = _tensor(art, "embeddings", (n, d), floating=True)
    density = _tensor(art, "density", (n,), floating=True)
    crow = _tensor(art, "crow", (n + 1,), floating=False)
    col = _tensor(art, "col", (nnz,), floating=False)
    val = _tensor(art, "val", (nnz,), floating=True)
    if not valid_csr(crow, col, n, nnz):
        raise ValueError(f"{art.path}: the CSR arrays (crow, col) are not a valid {n} x {n} matrix with {nnz} entries")
    p = art.params
    try:
        band = check_band(None if p.get("band") is None else tuple(p["band"]))
        beta, max_degree = float(p["beta"]), p.get("max_degree")
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{art.path}: bad band / beta in the manifest ({exc})") from None
    graph = cls._bare()  # no copy of the mapped tensors
    graph._hold(emb, density, crow, col, val, band=band, beta=beta, max_degree=max_degree)
    return graph


@dataclass(frozen=True)
class _Layout:
    """What one kind of graph saves (``parts``) and how its artefact is read (``read``)."""

    parts: Callable[[Any], tuple[dict[str, Tensor], dict[str, Any]]]
    read: Callable[[Any, Artefact, tuple[int, ...] | None], Any]


_LAYOUTS = {
    "CorpusGraph": _Layout(_corpus_graph_parts, _read_corpus_graph),
    "G3Graph": _Layout(_g3_graph_parts, _read_g3_graph),
}


def load_graph(cls: type[G], source: str | Path, *, corpus: Any, encoder: Any, device: Device, shape: Shape) -> G:
    """A graph of class ``cls`` from an artefact directory or hub id (the former format: deprecated), of
    ``(V, D)`` ``shape`` when given."""
    layout = _LAYOUTS[cls._artefact_layout]
    path = resolve_source(source, cls.__name__)
    if not is_artefact(path):
        from geograph.artefacts import former_graphs

        former: G | None = former_graphs.load_former(cls, path, corpus=corpus, device=device, shape=shape)
        if former is not None:
            return former
    art = read_artefact(path, cls.__name__, encoder=encoder, corpus=corpus)
    graph: G = layout.read(cls, art, shape)
    if device is not None:
        graph = graph.to(device)
    graph.build_info = art.manifest.get("build_info") or {}
    graph.corpus_version = _version(art.manifest)
    graph.manifest = {**art.manifest, "source": str(art.path)}
    return graph
