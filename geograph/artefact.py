"""Saved artefacts as directories: safetensors tensors, memory-mapped on load, and a JSON manifest.

A saved graph, projection or index is a directory::

    manifest.json           what it is and what made it (written last)
    tensors.safetensors     its tensors (the safetensors format, read by any safetensors library)
    <side files>            listed in the manifest (e.g. a faiss index)

The manifest records ``format`` (:data:`FORMAT_VERSION`), ``kind`` (the class), the geograph
version that wrote it, the encoder's identity (:class:`EncoderIdentity`), the corpus fingerprint
(:class:`CorpusFingerprint`: its passage ids and a checksum of its embeddings), the build
parameters and ``build_info``, and every file's size. Loading checks them against the encoder
and corpus in use and refuses a mismatch with one line naming both sides.

The tensors are memory-mapped copy-on-write (``torch.from_file(..., shared=False)``): their pages
are read from the operating system's page cache on first touch, so several processes loading the
same artefact (a server's workers) share one copy in memory; a write to a loaded tensor copies
only the pages it touches, never the file. No pickle is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from geograph._io import atomic_write, atomic_write_json, check_file_size, one_line, read_json

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "TENSORS",
    "Artefact",
    "ArtefactMismatch",
    "CorpusFingerprint",
    "EncoderIdentity",
    "as_identity",
    "corpus_fingerprint",
    "read_artefact",
    "resolve_source",
    "write_artefact",
    "read_safetensors",
    "write_safetensors",
]

#: the artefact format this geograph writes and reads (format 1: the former ``torch.save`` files)
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
TENSORS = "tensors.safetensors"

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_CODES = {v: k for k, v in _DTYPES.items()}


class ArtefactMismatch(ValueError):
    """A saved artefact made with another encoder, over another corpus, or in another format."""


@dataclass(frozen=True)
class EncoderIdentity:
    """What turns texts into the vectors an artefact was built over.

    Attributes:
        name: the model's name or path.
        revision: the model's revision (a hub commit), when known.
        sha256: a checksum of the model's configuration and weights files, when they are local.
        dim: the embedding dimension, when known.
        query_prefix, passage_prefix: prepended to query and passage texts before encoding.
        normalize: whether the vectors are L2-normalised.
    """

    name: str
    revision: str | None = None
    sha256: str | None = None
    dim: int | None = None
    query_prefix: str = ""
    passage_prefix: str = ""
    normalize: bool = True

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> EncoderIdentity:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        if not isinstance(known.get("name"), str):
            raise ValueError(f"an encoder identity needs a name, got {d!r}")
        return cls(**known)

    @property
    def weights(self) -> str:
        """What identifies the weights: the files' checksum, else the revision, else the name."""
        if self.sha256:
            return f"sha256:{self.sha256}"
        if self.revision:
            return f"revision:{self.revision}"
        return f"name:{self.name}"

    def describe(self) -> str:
        """One line: name, weights, dimension, prefixes, normalisation."""
        w = self.weights if self.weights.startswith("name:") else self.weights[:19]
        parts = [self.name if w.startswith("name:") else f"{self.name} ({w})"]
        if self.dim is not None:
            parts.append(f"dim {self.dim}")
        if self.query_prefix or self.passage_prefix:
            parts.append(f"prefixes {self.query_prefix!r}/{self.passage_prefix!r}")
        if not self.normalize:
            parts.append("not normalised")
        return ", ".join(parts)

    def differs(self, other: EncoderIdentity) -> bool:
        """Whether vectors of ``other`` are not those of this encoder (an unknown dimension matches any)."""
        if self.sha256 and other.sha256:
            same_weights = self.sha256 == other.sha256
        elif self.revision and other.revision:
            same_weights = self.revision == other.revision and self.name == other.name
        else:
            same_weights = self.name == other.name
        return (
            not same_weights
            or (self.dim is not None and other.dim is not None and self.dim != other.dim)
            or (self.query_prefix, self.passage_prefix, self.normalize)
            != (other.query_prefix, other.passage_prefix, other.normalize)
        )


def as_identity(encoder: Any) -> EncoderIdentity | None:
    """``encoder`` as an :class:`EncoderIdentity`: one, its dict, an object with an ``identity``
    attribute (a :class:`geograph.data.Encoder`), or ``None``."""
    if encoder is None or isinstance(encoder, EncoderIdentity):
        return encoder
    if isinstance(encoder, dict):
        return EncoderIdentity.from_dict(encoder)
    identity = getattr(encoder, "identity", None)
    if isinstance(identity, EncoderIdentity):
        return identity
    raise ValueError(
        f"encoder must be an EncoderIdentity, its dict or a geograph Encoder, got {type(encoder).__name__}"
    )


@dataclass(frozen=True)
class CorpusFingerprint:
    """The corpus an artefact was built over: its size, passage ids and embeddings.

    Attributes:
        num_passages, dim: the embeddings' shape.
        embeddings_sha256: sha256 of the embeddings as C-contiguous little-endian float32.
        ids_sha256: sha256 of the passage ids (one per line), when known.
    """

    num_passages: int
    dim: int
    embeddings_sha256: str
    ids_sha256: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CorpusFingerprint:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def describe(self) -> str:
        ids = "" if self.ids_sha256 is None else f", ids {self.ids_sha256[:12]}"
        return f"{self.num_passages} x {self.dim}{ids}, embeddings {self.embeddings_sha256[:12]}"


def _sha_ids(ids: Sequence[str]) -> str:
    h = hashlib.sha256()
    for i in ids:
        h.update(str(i).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def _sha_tensor(x: Tensor, rows: int = 65536) -> str:
    h = hashlib.sha256()
    for start in range(0, max(x.shape[0], 1), rows):  # by blocks: no float32 copy of a whole corpus
        block = x[start : start + rows].detach().to("cpu", torch.float32).contiguous()
        h.update(block.numpy().tobytes() if sys.byteorder == "little" else block.numpy().byteswap().tobytes())
    return h.hexdigest()


def corpus_fingerprint(embeddings: Tensor, ids: Sequence[str] | None = None) -> CorpusFingerprint:
    """The :class:`CorpusFingerprint` of ``(V, D)`` embeddings and, optionally, their ``V`` passage ids."""
    if not isinstance(embeddings, Tensor) or embeddings.dim() != 2:
        raise ValueError(f"embeddings must be a (V, D) tensor, got {getattr(embeddings, 'shape', embeddings)!r}")
    v, d = embeddings.shape
    if ids is not None and len(ids) != v:
        raise ValueError(f"ids: {len(ids)} passage ids for {v} embeddings")
    return CorpusFingerprint(int(v), int(d), _sha_tensor(embeddings), None if ids is None else _sha_ids(ids))


def _corpus_parts(corpus: Any) -> tuple[CorpusFingerprint | None, Tensor | None]:
    """The fingerprint of the corpus in use, and its embeddings when given: ``corpus`` is ``(V, D)``
    embeddings, a ``(ids, embeddings)`` pair or a :class:`CorpusFingerprint`."""
    if corpus is None or isinstance(corpus, CorpusFingerprint):
        return corpus, None
    if isinstance(corpus, Tensor):
        return corpus_fingerprint(corpus), corpus
    if isinstance(corpus, tuple) and len(corpus) == 2 and isinstance(corpus[1], Tensor):
        return corpus_fingerprint(corpus[1], corpus[0]), corpus[1]
    raise ValueError(
        "corpus must be (V, D) embeddings, an (ids, embeddings) pair or a CorpusFingerprint, "
        f"got {type(corpus).__name__}"
    )


# -- safetensors, written here and mapped on read ----------------------------------------------
def write_safetensors(path: str | Path, tensors: dict[str, Tensor], metadata: dict[str, str] | None = None) -> int:
    """Write ``tensors`` in the safetensors format, atomically; returns the file's size.

    Tensors are laid out largest element first so that every one starts at a multiple of its
    element size (the header is padded to 8 bytes): a mapped file gives aligned views.
    """
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    parts, header, offset = [], {}, 0
    for name in order:
        t = tensors[name].detach().to("cpu").contiguous()
        if t.dtype not in _CODES:
            raise ValueError(f"{name}: dtype {t.dtype} cannot be saved")
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _CODES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        parts.append(t)
        offset += n
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-(len(head) + 8) % 8)

    def write(f) -> None:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for t in parts:
            if t.numel():
                f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))

    atomic_write(path, write)
    return os.path.getsize(path)


def read_safetensors(path: str | Path) -> dict[str, Tensor]:
    """The tensors of a safetensors file, as views of one copy-on-write mapping of the file.

    Raises:
        ValueError: one line naming the file: truncated, a bad header, or an unknown dtype.
    """
    path = Path(path)
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise ValueError(f"header of {n} bytes in a file of {size}")
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a safetensors file (truncated?): {one_line(e)}") from None
    header.pop("__metadata__", None)
    base = 8 + n
    mapped = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8) if size else torch.empty(0)
    out = {}
    for name, info in header.items():
        try:
            dtype = _DTYPES[info["dtype"]]
            shape = [int(s) for s in info["shape"]]
            begin, end = (base + int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: bad header entry for {name!r}: {info!r}") from None
        itemsize = torch.empty(0, dtype=dtype).element_size()
        count = 1
        for s in shape:
            count *= s
        if end > size or begin > end or end - begin != count * itemsize:
            raise ValueError(f"{path}: {name} needs bytes [{begin}, {end}) of {size} (truncated?)")
        raw = mapped[begin:end]
        if begin % itemsize:  # a file laid out by another writer: this tensor is copied
            raw = raw.clone()
        out[name] = raw.view(dtype).reshape(shape)
    return out


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
    manifest: dict
    tensors: dict[str, Tensor]

    @property
    def params(self) -> dict:
        return self.manifest.get("params") or {}


def _geograph_version() -> str:
    return str(getattr(sys.modules.get("geograph"), "__version__", "unknown"))


def write_artefact(
    directory: str | Path,
    kind: str,
    tensors: dict[str, Tensor],
    *,
    params: dict,
    encoder: Any = None,
    corpus: CorpusFingerprint | None = None,
    build_info: dict | None = None,
    side_files: dict[str, bytes] | None = None,
    lineage: dict | None = None,
) -> Path:
    """Write an artefact directory: the tensors and side files first, the manifest last.

    ``lineage`` (``version``, ``parent``: see :mod:`geograph.graphs.artefact`) is recorded in the
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
        atomic_write(path / name, lambda f, data=data: f.write(data))
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


def is_artefact(path: Path) -> bool:
    """Whether ``path`` is a directory holding a manifest (this format or another)."""
    return (path / MANIFEST).is_file()


def read_artefact(path: Path, kind: str, *, encoder: Any = None, corpus: Any = None, what: str = "") -> Artefact:
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


def check_encoder(manifest: dict, encoder: Any, where: Path | str) -> None:
    """Refuse an encoder other than the manifest's (one line naming both); nothing known: no check."""
    used = as_identity(encoder)
    saved = manifest.get("encoder")
    if used is None or not saved:
        return
    saved = EncoderIdentity.from_dict(saved)
    if saved.differs(used):
        raise ArtefactMismatch(
            f"{where}: built with encoder {saved.describe()}; the encoder in use is {used.describe()}"
        )


#: largest coordinate difference between the corpus in use and the saved embeddings that still
#: counts as the same corpus (the same texts re-encoded on other hardware differ by ~1e-7)
EMBEDDING_ATOL = 1e-4


def check_corpus(manifest: dict, corpus: Any, where: Path | str, stored: Tensor | None = None) -> None:
    """Refuse a corpus other than the manifest's (one line naming both); nothing known: no check.

    Passage ids are compared when both sides have them; embeddings by checksum, or, where the
    artefact holds its embeddings (``stored``), coordinate by coordinate within
    :data:`EMBEDDING_ATOL` (the same texts re-encoded elsewhere round differently).
    """
    saved = manifest.get("corpus")
    if corpus is None or not saved:
        return
    saved = CorpusFingerprint.from_dict(saved)
    used, embeddings = _corpus_parts(corpus)
    assert used is not None
    same = (saved.num_passages, saved.dim) == (used.num_passages, used.dim)
    if same and saved.ids_sha256 and used.ids_sha256:
        same = saved.ids_sha256 == used.ids_sha256
    if same and saved.embeddings_sha256 != used.embeddings_sha256:
        same = embeddings is not None and stored is not None and _close(stored, embeddings)
    if not same:
        raise ArtefactMismatch(f"{where}: built over corpus {saved.describe()}; the corpus in use is {used.describe()}")


def _close(a: Tensor, b: Tensor, rows: int = 65536) -> bool:
    if a.shape != b.shape:
        return False
    for start in range(0, a.shape[0], rows):
        x = a[start : start + rows].to("cpu", torch.float32)
        y = b[start : start + rows].to("cpu", torch.float32)
        if not bool(((x - y).abs() <= EMBEDDING_ATOL).all()):
            return False
    return True
