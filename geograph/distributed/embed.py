"""Corpus embedding on Ray Data: an actor pool of encoder replicas writing the embedding cache.

:func:`embed_corpus` reads the passages of a BEIR folder (or a JSONL file of passages) exactly
as the single-process commands do (``title + " " + text``), looks them up in the embedding
cache, and sends the missing ones through ``Dataset.map_batches`` to ``concurrency`` actors,
each holding one :class:`~geograph.data.Encoder` (on a GPU with ``num_gpus``). Each actor
writes its vectors with the cache's own writer (:meth:`~geograph.data.EmbeddingCache.put`:
one ``.npz`` shard per batch of ``rows_per_shard`` passages, written under a temporary name and
renamed), so every command that reads the cache (``geograph demo --data``, ``build-graph``,
``bench``) finds them unchanged. A batch retried by Ray after a lost actor writes its shard again:
the cache keeps one vector per text, so a repeat is harmless.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np

from geograph._checks import check_positive_int
from geograph.data.beir import load_corpus
from geograph.data.cache import EmbeddingCache, Encoder, cache_dir
from geograph.distributed.cluster import ray_session

__all__ = ["embed_corpus", "EmbedReport"]


@dataclass(frozen=True)
class EmbedReport:
    """What :func:`embed_corpus` did.

    Attributes:
        passages: passages in the corpus.
        cached: those already in the cache before the run (not sent to Ray).
        encoded: distinct texts encoded by the actors.
        shards: cache shards the actors wrote.
        cache: the model's cache folder.
        seconds: wall time of the Ray part (connect, actors, encoding, writing).
    """

    passages: int
    cached: int
    encoded: int
    shards: int
    cache: str
    seconds: float


class _EncoderActor:
    """One replica: an :class:`Encoder` (no cache of its own) and the cache's writer."""

    def __init__(
        self,
        model: str | None,
        model_name: str | None,
        cache: str | None,
        batch_size: int,
        device: str | None,
    ) -> None:
        self.encoder = Encoder(model, model_name=model_name, cache=False, batch_size=batch_size, device=device)
        self.cache = EmbeddingCache(self.encoder.model_name, cache, weights=self.encoder.identity.weights)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts = [str(t) for t in batch["text"]]
        self.cache.put(texts, self.encoder.encode(texts).numpy())
        return {"encoded": np.array([len(texts)])}


def embed_corpus(
    source: str | Path,
    *,
    cache: str | Path | None = None,
    model: str | None = None,
    model_name: str | None = None,
    address: str | None = None,
    concurrency: int = 2,
    num_cpus: float = 1,
    num_gpus: float = 0,
    batch_size: int = 64,
    rows_per_shard: int = 1024,
) -> EmbedReport:
    """Embed the passages of ``source`` that the cache lacks, on an actor pool of Ray Data.

    Args:
        source: a BEIR folder (``corpus.jsonl``) or a JSONL file of passages.
        cache: the embedding cache root (see :func:`~geograph.data.cache_dir`); on a cluster a
            folder every node can write (shared storage).
        model, model_name: as :class:`~geograph.data.Encoder` (default: the offline MiniLM).
        address: ``None`` / ``"local"``: a local Ray; ``"auto"`` / ``"ray://..."``: a cluster
            (:func:`~geograph.distributed.ray_session`).
        concurrency: encoder replicas (actors).
        num_cpus, num_gpus: resources each actor reserves (``num_gpus > 0``: the model on CUDA).
        batch_size: texts per forward pass.
        rows_per_shard: most texts per Ray Data batch, i.e. per cache shard (fewer when the
            texts to encode would not give every actor one).

    Returns:
        an :class:`EmbedReport`; read the vectors back with ``Encoder(cache=cache).encode(passages)``.
    """
    concurrency = check_positive_int(concurrency, "concurrency")
    batch_size = check_positive_int(batch_size, "batch_size")
    rows_per_shard = check_positive_int(rows_per_shard, "rows_per_shard")
    if not num_cpus > 0:
        raise ValueError(f"num_cpus must be positive, got {num_cpus!r}")
    if not num_gpus >= 0:
        raise ValueError(f"num_gpus must be at least 0, got {num_gpus!r}")
    passages = load_corpus(source).passages()
    # the cache key as Encoder makes it (no model is loaded on the driver)
    root = cache_dir(cache)  # resolved here, so local actors write where this process reads
    store = cast(EmbeddingCache, Encoder(model, model_name=model_name, cache=root).cache)  # a root: an EmbeddingCache
    _, missing = store.get(passages)
    todo = list(dict.fromkeys(passages[i] for i in missing))  # distinct texts, first-seen order
    t0 = time.perf_counter()
    before = set(store.path.glob("*.npz")) if store.path.is_dir() else set()
    encoded = 0
    if todo:
        import pyarrow as pa

        with ray_session(address):
            import ray.data

            # one block per shard, made here (no upstream task competes with the actors for CPUs),
            # small enough that every actor gets one
            rows = min(rows_per_shard, -(-len(todo) // concurrency))
            ds = ray.data.from_arrow([pa.table({"text": todo[i : i + rows]}) for i in range(0, len(todo), rows)])
            out = ds.map_batches(
                _EncoderActor,
                batch_size=rows,
                concurrency=concurrency,
                fn_constructor_kwargs=dict(
                    model=model,
                    model_name=model_name,
                    cache=str(root),
                    batch_size=batch_size,
                    device="cuda" if num_gpus > 0 else None,
                ),
                num_cpus=num_cpus,
                num_gpus=num_gpus or None,
                batch_format="numpy",
            )
            encoded = int(sum(int(b["encoded"].sum()) for b in out.iter_batches(batch_size=None, batch_format="numpy")))
        if encoded != len(todo):
            raise RuntimeError(
                f"Ray Data encoded {encoded} of {len(todo)} texts; the cache at {store.path} is incomplete"
            )
    shards = len(set(store.path.glob("*.npz")) - before) if store.path.is_dir() else 0
    return EmbedReport(
        passages=len(passages),
        cached=len(passages) - len(missing),
        encoded=encoded,
        shards=shards,
        cache=str(store.path),
        seconds=time.perf_counter() - t0,
    )
