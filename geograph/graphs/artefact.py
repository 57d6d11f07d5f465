"""Save and load :class:`CorpusGraph` and :class:`G3Graph` as artefact directories (:mod:`geograph.artefact`).

The tensors are memory-mapped on load and held as the graph's buffers without a copy, so
processes loading one graph share its pages. A directory in the former format (``graph.json``
/ ``g3graph.json`` beside ``torch.save`` files) still loads, with a one-line
``DeprecationWarning`` saying how to convert it.

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
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from geograph._io import check_file_size, read_json
from geograph.artefact import (
    MANIFEST,
    CorpusFingerprint,
    EncoderIdentity,
    as_identity,
    corpus_fingerprint,
    is_artefact,
    read_artefact,
    resolve_source,
    write_artefact,
)
from geograph.geometry.gain import check_band
from geograph.graphs._legacy import CORPUS_META, G3_META, load_corpus_graph_v1, load_g3_graph_v1

__all__ = [
    "PASSAGES",
    "save_graph",
    "load_corpus_graph",
    "load_g3_graph",
    "read_passages",
    "saved_ids",
    "saved_kind",
]

#: the side file of a graph saved with its passages' ids and text keys
PASSAGES = "passages.jsonl"


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


def _lineage(graph: nn.Module) -> dict:
    """The manifest's ``corpus.version`` and ``corpus.parent`` of ``graph``."""
    version = int(getattr(graph, "corpus_version", 0))
    saved = (getattr(graph, "manifest", None) or {}).get("corpus") or {}
    out: dict = {"version": version}
    if saved and version != int(saved.get("version", 0)):  # updated since it was loaded
        out["parent"] = {k: saved.get(k) for k in ("version", "embeddings_sha256", "ids_sha256")}
        out["parent"]["version"] = int(saved.get("version", 0))
    elif saved.get("parent"):
        out["parent"] = saved["parent"]
    return out


def _passages_file(ids, text_keys) -> bytes:
    if text_keys is None:
        text_keys = [None] * len(ids)
    if len(text_keys) != len(ids):
        raise ValueError(f"text_keys: {len(text_keys)} keys for {len(ids)} passage ids")
    return "".join(json.dumps([str(i), None if k is None else str(k)]) + "\n" for i, k in zip(ids, text_keys)).encode()


def save_graph(
    graph: nn.Module, directory: str | Path, *, encoder: Any = None, ids=None, text_keys: Sequence[str] | None = None
) -> Path:
    """Write a :class:`CorpusGraph` or :class:`G3Graph` as an artefact directory."""
    kind = type(graph).__name__
    known = getattr(graph, "passage_ids", None)
    if ids is None and known is not None and all(isinstance(i, str) for i in known.ids):
        ids = known.ids  # an updated graph's own ids (a graph never named has integer ids: not recorded)
    elif ids is None and known is None and _unchanged_since_load(graph):
        ids, keys = _saved_passages(graph)  # saved again as loaded: its passages too
        text_keys = keys if text_keys is None and all(k is not None for k in keys) else text_keys
    if ids is not None and len(ids) != graph.num_nodes:
        raise ValueError(f"ids: {len(ids)} passage ids for {graph.num_nodes} passages")
    if text_keys is not None and ids is None:
        raise ValueError("text_keys need the passage ids (ids=...)")
    side = {} if ids is None else {PASSAGES: _passages_file(ids, text_keys)}
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
        side_files=side,
        lineage=_lineage(graph),
    )


def _unchanged_since_load(graph: nn.Module) -> bool:
    """Whether ``graph`` was loaded with a passages file and not updated since."""
    manifest = getattr(graph, "manifest", None) or {}
    return (
        manifest.get("source") is not None
        and PASSAGES in (manifest.get("files") or {})
        and int(getattr(graph, "corpus_version", 0)) == _version(manifest)
    )


def _version(manifest: dict) -> int:
    try:
        return int((manifest.get("corpus") or {}).get("version", 0))
    except (TypeError, ValueError):
        return 0


def saved_kind(source: str | Path) -> str | None:
    """The ``kind`` a saved artefact's manifest names (``CorpusGraph``, ``G3Graph``, ...), or ``None``
    when ``source`` is not a directory holding a readable manifest of this format."""
    path = Path(source)
    if not is_artefact(path):
        return None
    try:
        kind = read_json(path / MANIFEST).get("kind")
    except ValueError:
        return None
    return kind if isinstance(kind, str) else None


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
    ids, keys = [], []
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


def saved_ids(graph: nn.Module) -> list[str] | None:
    """The passage ids saved with a graph loaded by ``from_pretrained`` (``None``: none saved).

    Raises:
        ValueError: the directory's ids are not those the loaded graph was saved with (it was
            replaced since the graph was loaded).
    """
    manifest = getattr(graph, "manifest", None) or {}
    if manifest.get("source") is None or PASSAGES not in (manifest.get("files") or {}):
        return None
    return _saved_passages(graph)[0]


def _saved_passages(graph: nn.Module) -> tuple[list[str], list[str | None]]:
    source = graph.manifest["source"]
    ids, keys = read_passages(source)
    saved = (graph.manifest.get("corpus") or {}).get("ids_sha256")
    if corpus_fingerprint(torch.empty(len(ids), 0), ids).ids_sha256 != saved:
        raise ValueError(f"ids: {source}/{PASSAGES} was replaced since the graph was loaded; call set_ids(ids)")
    return ids, keys


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
    graph.passage_ids = None
    graph.knn_state = None
    graph.corpus_version = _version(art.manifest)
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
    graph.corpus_version = _version(art.manifest)
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
