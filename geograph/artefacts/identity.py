"""What an artefact was made from: the encoder's identity and the corpus fingerprint, and their checks.

A manifest records the :class:`EncoderIdentity` of the model that made the vectors and the
:class:`CorpusFingerprint` of the passages (their ids and a checksum of their embeddings);
:func:`check_encoder` and :func:`check_corpus` compare them with the encoder and corpus in use
and refuse a mismatch (:class:`ArtefactMismatch`) with one line naming both sides.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "EMBEDDING_ATOL",
    "ArtefactMismatch",
    "CorpusFingerprint",
    "EncoderIdentity",
    "as_identity",
    "check_corpus",
    "check_encoder",
    "corpus_fingerprint",
    "recorded_identity",
]


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
        backend: the runtime that ran the model (``torch``, ``onnx``, ``onnx-int8``:
            :mod:`geograph.data.backends`); an identity saved before backends were recorded reads
            as ``torch``.
        quantization: how the weights were quantised for that runtime (``None``: not at all).
    """

    name: str
    revision: str | None = None
    sha256: str | None = None
    dim: int | None = None
    query_prefix: str = ""
    passage_prefix: str = ""
    normalize: bool = True
    backend: str = "torch"
    quantization: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EncoderIdentity:
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
        if self.backend != "torch":
            parts.append(f"backend {self.backend}" + (f" ({self.quantization})" if self.quantization else ""))
        return ", ".join(parts)

    def differs(self, other: EncoderIdentity) -> bool:
        """Whether vectors of ``other`` are not those of this encoder (an unknown dimension matches any).

        The runtime (:attr:`backend`) is not compared here: the same model run by another backend
        is the same encoder when their vectors agree (:func:`check_encoder`)."""
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


def recorded_identity(encoder: Any, dim: int, saved: Mapping[str, Any] | None = None) -> EncoderIdentity | None:
    """The encoder identity a save records: ``encoder``'s (see :func:`as_identity`), else the one in
    ``saved`` (the manifest of a loaded artefact), with ``dim`` filled in when it is not known."""
    identity = as_identity(encoder)
    if identity is None and saved and saved.get("encoder"):
        identity = EncoderIdentity.from_dict(saved["encoder"])
    if identity is not None and identity.dim is None:
        identity = EncoderIdentity.from_dict({**identity.as_dict(), "dim": int(dim)})
    return identity


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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CorpusFingerprint:
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


def check_encoder(manifest: Mapping[str, Any], encoder: Any, where: Path | str) -> None:
    """Refuse an encoder other than the manifest's (one line naming both); nothing known: no check."""
    used = as_identity(encoder)
    recorded = manifest.get("encoder")
    if used is None or not recorded:
        return
    saved = EncoderIdentity.from_dict(recorded)
    if saved.differs(used):
        raise ArtefactMismatch(
            f"{where}: built with encoder {saved.describe()}; the encoder in use is {used.describe()}"
        )
    if (saved.backend, saved.quantization) != (used.backend, used.quantization):
        _check_backends(saved, used, encoder, where)


#: the least cosine, on every probe text, between the vectors of the backend an artefact was built
#: with and those of the backend in use for the artefact to be accepted (as in geograph.data.backends)
BACKEND_AGREEMENT = 0.999


def _check_backends(saved: EncoderIdentity, used: EncoderIdentity, encoder: Any, where: Path | str) -> None:
    """Accept the same model run by another backend only when the two backends' vectors agree
    (cosine >= :data:`BACKEND_AGREEMENT` on every probe text), measured by the encoder in use
    (its ``agreement(backend)`` method, :meth:`geograph.data.Encoder.agreement`); else one line."""
    both = f"built with encoder {saved.describe()}; the encoder in use is {used.describe()}"
    agreement = getattr(encoder, "agreement", None)
    if not callable(agreement):
        raise ArtefactMismatch(f"{where}: {both}, and only an encoder can compare their vectors")
    try:
        cosine = float(agreement(saved.backend))
    except ImportError as e:  # the backend the artefact was built with is not installed here
        raise ArtefactMismatch(f"{where}: {both}; cannot compare their vectors: {e}") from None
    if cosine < BACKEND_AGREEMENT:
        raise ArtefactMismatch(
            f"{where}: {both}; their vectors agree to cosine {cosine:.6f} on the probe texts, below {BACKEND_AGREEMENT}"
        )


#: largest coordinate difference between the corpus in use and the saved embeddings that still
#: counts as the same corpus (the same texts re-encoded on other hardware differ by ~1e-7)
EMBEDDING_ATOL = 1e-4


def check_corpus(manifest: Mapping[str, Any], corpus: Any, where: Path | str, stored: Tensor | None = None) -> None:
    """Refuse a corpus other than the manifest's (one line naming both); nothing known: no check.

    Passage ids are compared when both sides have them; embeddings by checksum, or, where the
    artefact holds its embeddings (``stored``), coordinate by coordinate within
    :data:`EMBEDDING_ATOL` (the same texts re-encoded elsewhere round differently).
    """
    recorded = manifest.get("corpus")
    if corpus is None or not recorded:
        return
    saved = CorpusFingerprint.from_dict(recorded)
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
