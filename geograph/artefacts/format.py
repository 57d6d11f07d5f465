"""Saved artefacts as directories: safetensors tensors, memory-mapped on load, and a JSON manifest.

A saved graph, projection or index is a directory::

    manifest.json           what it is and what made it (written last)
    tensors.safetensors     its tensors (the safetensors format, read by any safetensors library)
    <side files>            listed in the manifest (e.g. a faiss index)

The manifest records ``format`` (:data:`FORMAT_VERSION`), ``kind`` (the class), the geograph
version that wrote it, the encoder's identity (:class:`~geograph.artefacts.EncoderIdentity`), the
corpus fingerprint (:class:`~geograph.artefacts.CorpusFingerprint`: its passage ids and a checksum
of its embeddings), the build parameters and ``build_info``, and every file's size. Loading checks
them against the encoder and corpus in use and refuses a mismatch with one line naming both sides
(:mod:`geograph.artefacts.identity`).

The tensors are written and read by the ``safetensors`` library. On load they are views of one
private, copy-on-write memory mapping of the file (``safetensors.torch.load_file``): their pages
are read from the operating system's page cache on first touch, so several processes loading the
same artefact (a server's workers) share one copy in memory; a write to a loaded tensor copies
only the pages it touches, never the file. No pickle is read.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from geograph._io import atomic_save, atomic_write, atomic_write_json, check_file_size, one_line, read_json
from geograph.artefacts.identity import ArtefactMismatch, CorpusFingerprint, as_identity, check_corpus, check_encoder

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "TENSORS",
    "Artefact",
    "Device",
    "is_artefact",
    "read_artefact",
    "read_safetensors",
    "resolve_source",
    "saved_kind",
    "write_artefact",
    "write_safetensors",
]

#: the artefact format this geograph writes and reads (format 1: the former ``torch.save`` files)
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
TENSORS = "tensors.safetensors"

#: where a loader puts the tensors (``None``: where they are read, the CPU, memory-mapped)
Device = str | torch.device | None


# -- the tensors file ------------------------------------------------------------------------
def write_safetensors(path: str | Path, tensors: Mapping[str, Tensor], metadata: dict[str, str] | None = None) -> int:
    """Write ``tensors`` as a safetensors file, atomically; returns the file's size.

    The library lays the tensors out by alignment, largest first, after a header padded to 8
    bytes, so a mapped file gives aligned views. Tensors are written from their own memory (no
    copy of the file is made first), moved to the CPU and made contiguous where they are not;
    tensors that share memory with another one are written as copies (the library refuses them).

    Raises:
        ValueError: one line naming the file: a tensor the format cannot hold (a sparse tensor,
            an unknown dtype).
    """
    cpu = {str(name): t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    shared = Counter(_memory(t) for t in cpu.values())
    cpu = {name: t.clone() if shared[_memory(t)] > 1 else t for name, t in cpu.items()}

    def save(tmp: Path) -> None:
        try:
            save_file(cpu, tmp, metadata)
        except (SafetensorError, KeyError, ValueError, RuntimeError, TypeError) as e:
            raise ValueError(f"{path}: cannot write these tensors as safetensors: {one_line(e)}") from None

    atomic_save(path, save)
    return os.path.getsize(path)


def _memory(t: Tensor) -> int | None:
    """Where ``t``'s memory starts (``None`` for an empty tensor, which holds none)."""
    return t.untyped_storage().data_ptr() if t.numel() else None


def read_safetensors(path: str | Path) -> dict[str, Tensor]:
    """The tensors of a safetensors file, read by the safetensors library as views of one private
    (copy-on-write) memory mapping of the file.

    Raises:
        ValueError: one line naming the file: truncated, a bad header, or an unknown dtype.
    """
    try:
        return load_file(path)
    except (SafetensorError, OSError, KeyError, ValueError, RuntimeError, TypeError) as e:
        raise ValueError(f"{path}: not a safetensors file (truncated?): {one_line(e)}") from None


# -- sources: local directories, Hugging Face Hub ids -------------------------------------------
def resolve_source(source: str | Path, kind: str) -> Path:
    """A local path, or the snapshot of a Hugging Face Hub repository ``owner/name`` when no such path exists.

    Raises:
        ValueError: one line: ``source`` is not a saved ``kind``: no such directory, or a hub id
            that cannot be fetched (no network, no ``huggingface_hub``, no such repository).
    """
    path = Path(source)
    if path.exists():
        return path
    text = str(source)
    missing = f"{text} is not a saved {kind}: no such directory"
    if text.count("/") == 1 and not text.startswith((".", "/", "~")) and all(text.split("/")):
        try:
            from huggingface_hub import snapshot_download
        except ImportError:
            raise ValueError(
                f"{missing}, and fetching it from the Hugging Face Hub needs huggingface_hub "
                "(pip install 'geograph-rag[text]', which brings it)"
            ) from None
        try:
            return Path(snapshot_download(text))
        except Exception as e:  # noqa: BLE001 - offline, unknown repository, gated: all one line
            raise ValueError(
                f"{missing}, nor one fetched from the Hugging Face Hub ({type(e).__name__}: {one_line(e, 160)})"
            ) from None
    raise ValueError(missing)


# -- write and read --------------------------------------------------------------------------
@dataclass(frozen=True)
class Artefact:
    """A loaded artefact: its directory, manifest and (memory-mapped) tensors."""

    path: Path
    manifest: dict[str, Any]
    tensors: dict[str, Tensor]

    @property
    def params(self) -> dict[str, Any]:
        return self.manifest.get("params") or {}


def _geograph_version() -> str:
    return str(getattr(sys.modules.get("geograph"), "__version__", "unknown"))


def write_artefact(
    directory: str | Path,
    kind: str,
    tensors: Mapping[str, Tensor],
    *,
    params: dict[str, Any],
    encoder: Any = None,
    corpus: CorpusFingerprint | None = None,
    build_info: dict[str, Any] | None = None,
    side_files: Mapping[str, bytes] | None = None,
    lineage: dict[str, Any] | None = None,
) -> Path:
    """Write an artefact directory: the tensors and side files first, the manifest last.

    ``lineage`` (``version``, ``parent``: see :mod:`geograph.artefacts.saved_graphs`) is recorded in the
    manifest's ``corpus`` beside the fingerprint.

    The manifest is removed before anything else is written, so a save killed at any point
    leaves the previous artefact or a directory that does not load, never a mix of two.
    """
    path = Path(directory)
    if path.is_file():
        raise ValueError(f"{path} is a file; an artefact is saved as a directory")
    path.mkdir(parents=True, exist_ok=True)
    (path / MANIFEST).unlink(missing_ok=True)
    identity = as_identity(encoder)
    files = {TENSORS: write_safetensors(path / TENSORS, tensors, {"format": "pt", "kind": kind})}
    for name, data in (side_files or {}).items():
        _write_bytes(path / name, data)
        files[name] = len(data)
    manifest = {
        "format": FORMAT_VERSION,
        "kind": kind,
        "geograph_version": _geograph_version(),
        "encoder": None if identity is None else identity.as_dict(),
        "corpus": None if corpus is None else {**corpus.as_dict(), **(lineage or {})},
        "params": params,
        "build_info": build_info or {},
        "files": files,
    }
    atomic_write_json(manifest, path / MANIFEST)
    return path


def _write_bytes(path: Path, data: bytes) -> None:
    def write(f: BinaryIO) -> None:
        f.write(data)

    atomic_write(path, write)


def is_artefact(path: Path) -> bool:
    """Whether ``path`` is a directory holding a manifest (this format or another)."""
    return (path / MANIFEST).is_file()


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


def read_artefact(path: Path, kind: str, *, encoder: Any = None, corpus: Any = None) -> Artefact:
    """Read the artefact at ``path`` (a resolved directory) and check it against ``encoder`` and ``corpus``.

    Raises:
        ValueError: one line naming the file: unreadable, another kind, a file of another size.
        ArtefactMismatch: another format version, encoder or corpus (naming both sides).
    """
    meta_file = path / MANIFEST
    if not meta_file.is_file():
        raise ValueError(f"{path} is not a saved {kind} (no {MANIFEST})")
    manifest = read_json(meta_file)
    found = manifest.get("format")
    if found != FORMAT_VERSION:
        raise ArtefactMismatch(f"{meta_file}: artefact format {found!r}, this geograph reads format {FORMAT_VERSION}")
    if manifest.get("kind") != kind:
        raise ValueError(f"{meta_file}: a saved {manifest.get('kind')!r}, not a {kind}")
    files = manifest.get("files") or {}
    if TENSORS not in files:
        raise ValueError(f"{meta_file}: lists no {TENSORS}")
    for name, size in files.items():
        check_file_size(path / name, size, meta_file)
    check_encoder(manifest, encoder, meta_file)
    tensors = read_safetensors(path / TENSORS)
    check_corpus(manifest, corpus, meta_file, tensors.get("embeddings"))
    return Artefact(path, manifest, tensors)
