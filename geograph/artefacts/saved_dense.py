"""Save and load a :class:`~geograph.retrievers.DenseRetriever` (its IVF index included) as an artefact directory.

``tensors.safetensors`` holds the normalised corpus (memory-mapped on load), ``ivf.faiss`` the
trained faiss index (read with faiss's memory-mapped reader where it can), the manifest the
constructor's options and the ``nprobe`` that ``"auto"`` chose, so a loaded retriever answers
exactly as the saved one, with no training or calibration.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from geograph.artefacts.format import Device, read_artefact, resolve_source, write_artefact
from geograph.artefacts.identity import corpus_fingerprint, recorded_identity
from geograph.knn.faiss_ivf import build_ivf_index, import_faiss

if TYPE_CHECKING:
    from geograph.methods.dense.module import DenseRetriever

__all__ = ["save_dense", "load_dense"]

INDEX_FILE = "ivf.faiss"
#: the tensor of an updated IVF index's label-to-row table (``-1``: a removed passage's label)
IVF_ROWS = "ivf_rows"
_OPTIONS = ("chunk_size", "index", "nlist", "sample", "seed", "recall_target", "recall_k")

log = logging.getLogger("geograph.dense")


def save_dense(
    model: DenseRetriever,
    directory: str | Path,
    *,
    encoder: Any = None,
    ids: Sequence[str] | None = None,
    text_keys: Sequence[str | None] | None = None,
) -> Path:
    """Write ``model`` as an artefact directory; an IVF index is built (and ``nprobe="auto"``
    calibrated) first if the model has not been called yet. With ``ids`` (default: an updated
    model's own ids, when they are strings) the passages file lists them and ``text_keys``."""
    from geograph.artefacts.saved_graphs import PASSAGES, _passages_file

    known = model.passage_ids
    if ids is None and known is not None and all(isinstance(i, str) for i in known.ids):
        ids = [str(i) for i in known.ids]
    if ids is not None and len(ids) != model.num_passages:
        raise ValueError(f"ids: {len(ids)} passage ids for {model.num_passages} passages")
    if text_keys is not None and ids is None:
        raise ValueError("text_keys need the passage ids (ids=...)")
    side: dict[str, bytes] = {} if ids is None else {PASSAGES: _passages_file(ids, text_keys)}
    tensors = {"embeddings": model.embeddings}
    if model.index == "ivf":
        if model._ivf is None:
            model._ivf = build_ivf_index(model.embeddings, model.nlist, sample=model.sample, seed=model.seed)
        if model.nprobe is None:
            model.nprobe = model._calibrate()
        faiss = import_faiss()
        cpu = faiss.index_gpu_to_cpu(model._ivf) if hasattr(faiss, "index_gpu_to_cpu") else model._ivf
        side[INDEX_FILE] = bytes(faiss.serialize_index(cpu))
        if model._ivf_rows is not None:  # an updated index: its labels are not the rows
            tensors[IVF_ROWS] = model._ivf_rows
    identity = recorded_identity(encoder, int(model.embeddings.shape[1]))
    params = {name: getattr(model, name) for name in _OPTIONS}
    params.update(auto=bool(model._auto), nprobe=model.nprobe, calibration=model.calibration)
    return write_artefact(
        directory,
        "DenseRetriever",
        tensors,
        params=params,
        encoder=identity,
        corpus=corpus_fingerprint(model.embeddings, ids),
        side_files=side,
    )


def load_dense(
    cls: type[DenseRetriever], source: str | Path, *, corpus: Any, encoder: Any, device: Device
) -> DenseRetriever:
    """A retriever from an artefact directory or hub id, its corpus memory-mapped and held as saved."""
    path = resolve_source(source, cls.__name__)
    art = read_artefact(path, "DenseRetriever", encoder=encoder, corpus=_normalised(corpus))
    emb = art.tensors.get("embeddings")
    if emb is None or emb.dim() != 2 or not emb.is_floating_point():
        raise ValueError(f"{art.path}: no (V, D) floating embeddings in the tensors")
    p = art.params
    try:
        options = {name: p[name] for name in _OPTIONS}
        nprobe = "auto" if p["auto"] and p["nprobe"] is None else p["nprobe"]
    except KeyError as e:
        raise ValueError(f"{art.path}: the manifest's params lack {e}") from None
    # the training sample is checked against the corpus it trained on, not an updated one: the
    # saved index is read back, not trained again
    sample = options.pop("sample")
    model = cls(emb, nprobe=nprobe, **options)
    model.sample = sample
    # the buffer as saved (already unit rows) and mapped, instead of the constructor's normalised copy
    model.register_buffer("embeddings", emb, persistent=True)
    model._auto, model.calibration = bool(p["auto"]), p.get("calibration")
    if model.index == "ivf":
        if not (art.path / INDEX_FILE).is_file():
            raise ValueError(f"{art.path}: an IVF retriever saved without its {INDEX_FILE}")
        index = _read_index(art.path / INDEX_FILE)
        model._ivf = index
        if index.ntotal != emb.shape[0] or index.d != emb.shape[1]:
            raise ValueError(
                f"{art.path / INDEX_FILE}: an index of {index.ntotal} x {index.d}, "
                f"the embeddings are {emb.shape[0]} x {emb.shape[1]}"
            )
        rows = art.tensors.get(IVF_ROWS)
        if rows is not None:
            if rows.dim() != 1 or rows.is_floating_point() or int((rows >= 0).sum()) != emb.shape[0]:
                raise ValueError(f"{art.path}: {IVF_ROWS} is not a label-to-row table of {emb.shape[0]} rows")
            model._ivf_rows = rows.long().clone()
    if device is not None and torch.device(device).type != "cpu":
        model = model.to(device)  # (the index is rebuilt on the device on first use)
    model.manifest = {**art.manifest, "source": str(art.path)}  # type: ignore[assignment]  # nn.Module's setattr
    return model


def _normalised(corpus: Any) -> Any:
    """The corpus in use compared as the retriever stores it: unit rows."""
    from geograph.ops.similarity import normalize

    if isinstance(corpus, Tensor):
        return normalize(corpus)
    if isinstance(corpus, tuple) and len(corpus) == 2 and isinstance(corpus[1], Tensor):
        return corpus[0], normalize(corpus[1])
    return corpus


def _read_index(path: Path) -> Any:
    faiss = import_faiss()
    try:  # the inverted lists memory-mapped, shared between processes
        return faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    except RuntimeError as e:  # pragma: no cover - a faiss without the mapped reader
        log.info("faiss cannot map %s (%s): reading it into memory", path, str(e).splitlines()[0])
    return faiss.read_index(str(path))  # pragma: no cover
