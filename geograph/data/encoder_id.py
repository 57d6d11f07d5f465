"""The identity of a text encoder: its name, revision, a checksum of its files, its prefixes.

It keys the embedding cache (a model changed in place never reads the old model's vectors) and
is recorded in saved artefacts (:mod:`geograph.artefacts`), which refuse to load under another.
"""

from __future__ import annotations

import hashlib
import re
import threading
from pathlib import Path

from geograph.artefacts import EncoderIdentity
from geograph.data.backends import quantization

__all__ = ["EncoderIdentity", "encoder_identity", "model_files_sha256", "hub_snapshot"]

#: files that decide a model's vectors: configuration, tokenizer, weights
_MODEL_SUFFIXES = (".json", ".safetensors", ".bin", ".pt", ".pth", ".txt", ".model", ".msgpack", ".h5")
#: folders of other runtimes' copies of the weights, not read by sentence-transformers' torch path
_SKIP_DIRS = {".git", ".cache", "onnx", "openvino", "coreml"}
_SNAPSHOT = re.compile(r"/snapshots/([0-9a-f]{40})(/|$)")

# (directory, files' sizes and mtimes) -> checksum, for this process
_memo: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}
_lock = threading.Lock()


def _model_files(directory: Path) -> list[Path]:
    out = []
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory)
        if any(part in _SKIP_DIRS or part.startswith(".") for part in rel.parts):
            continue
        if p.is_file() and p.suffix in _MODEL_SUFFIXES and p.name != "README.md":
            out.append(p)
    return out


def model_files_sha256(directory: str | Path) -> str:
    """sha256 over a model directory's configuration, tokenizer and weights files (names and bytes).

    Computed once per process for a directory whose files keep their sizes and modification
    times (a file changed in place changes its mtime, which reads it again).

    Raises:
        ValueError: ``directory`` holds no model file.
    """
    directory = Path(directory)
    files = _model_files(directory)
    if not files:
        raise ValueError(f"encoder: {directory} holds no model file ({', '.join(_MODEL_SUFFIXES)})")
    stamp = (str(directory.resolve()), tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files))
    with _lock:
        if stamp in _memo:
            return _memo[stamp]
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(directory).as_posix().encode())
        h.update(b"\0")
        with p.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        h.update(b"\0")
    digest = h.hexdigest()
    with _lock:
        _memo[stamp] = digest
    return digest


def hub_snapshot(name: str) -> Path | None:
    """The local snapshot directory of a hub model ``name``, if the Hugging Face cache holds one."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(name, "config.json")
    except Exception:  # noqa: BLE001 - a name that is not a repository id
        return None
    return Path(found).parent if isinstance(found, str) else None


def encoder_identity(
    model: str | Path,
    *,
    name: str | None = None,
    revision: str | None = None,
    dim: int | None = None,
    query_prefix: str = "",
    passage_prefix: str = "",
    normalize: bool = True,
    backend: str = "torch",
) -> EncoderIdentity:
    """The :class:`EncoderIdentity` of a sentence-transformers model, without loading it.

    Args:
        model: a local model directory or a hub name (its snapshot in the Hugging Face cache is
            read when present).
        name: the name recorded (default: ``model``).
        revision: the model's revision; default: the hub commit of a snapshot directory.
        dim: the embedding dimension, when known.
        query_prefix, passage_prefix: prepended to query and passage texts.
        normalize: whether the vectors are L2-normalised.
        backend: the runtime that runs the model (:data:`geograph.data.backends.BACKENDS`), recorded
            with its quantisation.

    A local directory's files are hashed (:func:`model_files_sha256`), so a model changed in
    place gets another identity; a name found nowhere is identified by its name alone.
    """
    text = str(model)
    directory = Path(text) if Path(text).is_dir() else hub_snapshot(text)
    sha = None
    if directory is not None:
        sha = model_files_sha256(directory)
        if revision is None:
            m = _SNAPSHOT.search(directory.resolve().as_posix())
            revision = m.group(1) if m else None
    return EncoderIdentity(
        name=name or text,
        revision=revision,
        sha256=sha,
        dim=dim,
        query_prefix=query_prefix,
        passage_prefix=passage_prefix,
        normalize=normalize,
        backend=backend,
        quantization=quantization(backend),
    )
