"""Triplets (anchor, graph neighbour, non-neighbour) from a CorpusGraph, re-drawn every epoch.

The graph comes from a BEIR-format folder and a recipe (k-NN ``k`` or title mentions), built
once and cached on disk, or from a directory saved with ``CorpusGraph.save``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from geograph.graphs.corpus_graph import CorpusGraph
from geograph.knn.allpairs import tiled_topk
from geograph.ops.similarity import normalize
from geograph.outputs import true_first

if TYPE_CHECKING:
    from lightning.fabric.utilities.data import AttributeDict


def hard_negatives(graph: CorpusGraph, count: int, *, chunk_size: int = 4096) -> Tensor:
    """``(V, count)`` per node: the most cosine-similar nodes that are neither it nor adjacent.

    ``-1`` where a node has fewer than ``count`` such nodes among its ``count + max_degree``
    nearest. Chunked over rows: memory ``O(chunk_size x V)``.
    """
    v = graph.num_nodes
    z = normalize(graph.embeddings.float())
    width = min(v, count + int(graph.degree().max()) + 1)
    keys = graph.edge_index[0] * v + graph.edge_index[1]
    out = []
    for start in range(0, v, chunk_size):
        rows = torch.arange(start, min(start + chunk_size, v))
        idx = tiled_topk(z[rows], z, width, block=chunk_size)[1]
        bad = (idx == rows.unsqueeze(1)) | torch.isin(rows.unsqueeze(1) * v + idx, keys)
        order = true_first(~bad, count)
        pick = idx.gather(1, order)
        out.append(torch.where(bad.gather(1, order), torch.full_like(pick, -1), pick))
    return torch.cat(out) if out else torch.zeros(0, count, dtype=torch.long)


_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wraps mod 2^64): a counter-based random stream."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        out: np.ndarray = x ^ (x >> np.uint64(31))
        return out


class TripletDataset(Dataset[Tensor]):
    """One item per directed edge ``(u, v)``: ``(u, v, w)`` with ``w`` a non-neighbour of ``u``.

    ``w`` is a hard negative (:func:`hard_negatives`) with probability ``hard_ratio`` when ``u``
    has one, else a uniformly random node; a random ``w`` that happens to be ``u`` or adjacent
    is redrawn up to 8 times (then kept: on a dense graph a few easy triplets remain).

    The draws of item ``i`` are a counter-based random stream (splitmix64) of
    ``(seed, epoch, i)`` only, so any worker or process layout gives the same triplets. An item
    is addressed as ``i`` (at :attr:`epoch`, set with :meth:`set_epoch`) or as ``(epoch, i)``,
    which is what :class:`TripletSampler` yields: the epoch travels with the index into worker
    processes, so every epoch draws new negatives. A batch is drawn at once, vectorised
    (``__getitems__``, used by ``DataLoader``).
    """

    _TRIES = 8

    def __init__(
        self, graph: CorpusGraph, *, hard: Tensor | None = None, hard_ratio: float = 0.5, seed: int = 0
    ) -> None:
        if graph.num_edges == 0:
            raise ValueError("the graph has no edges: no positive pairs to train on")
        self.num_nodes = graph.num_nodes
        self.edges = graph.edge_index.T.contiguous().cpu().numpy()
        self.keys = np.sort(self.edges[:, 0] * self.num_nodes + self.edges[:, 1])
        self.hard: np.ndarray | None
        self.n_hard: np.ndarray | None
        if hard is not None:
            hard = hard.cpu()
            valid = hard >= 0
            # valid hard negatives first in each row, then their count
            self.hard = hard.gather(1, true_first(valid, hard.shape[1])).numpy()
            self.n_hard = valid.sum(1).numpy()
        else:
            self.hard, self.n_hard = None, None
        self.hard_ratio = float(hard_ratio)
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Draw the negatives of epoch ``epoch`` for items addressed by a plain index."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        n: int = self.edges.shape[0]
        return n

    def _uniform(self, epoch: np.ndarray, i: np.ndarray, stream: int) -> np.ndarray:
        base = _mix(
            _mix(_mix(np.full_like(i, self.seed, dtype=np.uint64)) ^ epoch.astype(np.uint64)) ^ i.astype(np.uint64)
        )
        with np.errstate(over="ignore"):
            r = _mix(base + np.uint64(stream))
        return (r >> np.uint64(11)).astype(np.float64) * 2.0**-53  # [0, 1)

    def __getitems__(self, items: Sequence[int | tuple[int, int]]) -> list[Tensor]:
        """The triplets of ``items``, drawn together: a list of ``(3,)`` rows (views of one array)."""
        pairs = [(int(x[0]), int(x[1])) if isinstance(x, (tuple, list)) else (self.epoch, int(x)) for x in items]
        epoch = np.array([e for e, _ in pairs], dtype=np.int64)
        i = np.array([x for _, x in pairs], dtype=np.int64)
        if i.size and (i.min() < 0 or i.max() >= len(self)):
            raise IndexError(f"item index out of range [0, {len(self)})")
        u, v = self.edges[i, 0], self.edges[i, 1]
        n = self.num_nodes
        # random negatives: the first of TRIES draws that is neither u nor adjacent, else the last
        w = np.empty_like(u)
        done = np.zeros(u.shape, dtype=bool)
        for t in range(self._TRIES):
            cand = np.minimum((self._uniform(epoch, i, 2 + t) * n).astype(np.int64), n - 1)
            key = u * n + cand
            at = np.minimum(np.searchsorted(self.keys, key), self.keys.size - 1)
            ok = (cand != u) & (self.keys[at] != key)
            take = ~done & (ok | (t == self._TRIES - 1))
            w[take] = cand[take]
            done |= take
        if self.hard is not None:
            n_hard = self.n_hard[u]  # type: ignore[index]  # set together with self.hard
            use = (self._uniform(epoch, i, 0) < self.hard_ratio) & (n_hard > 0)
            slot = np.minimum((self._uniform(epoch, i, 1) * n_hard).astype(np.int64), np.maximum(n_hard - 1, 0))
            w = np.where(use, self.hard[u, slot], w)
        return list(torch.from_numpy(np.stack([u, v, w], axis=1)).unbind(0))

    def __getitem__(self, item: int | tuple[int, int]) -> Tensor:
        return self.__getitems__([item])[0]


class TripletSampler(DistributedSampler[int]):
    """Yields ``(epoch, i)`` for the items ``indices`` of a :class:`TripletDataset`.

    A :class:`~torch.utils.data.DistributedSampler` (so Lightning keeps it under DDP and calls
    :meth:`set_epoch` every epoch): shuffled by ``seed + epoch``, split over the processes of
    the default process group (one process when there is none). With ``fixed_epoch`` the items
    are always drawn at that epoch (a validation set that does not change).
    """

    def __init__(
        self,
        indices: Sequence[int],
        *,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        fixed_epoch: int | None = None,
    ) -> None:
        distributed = dist.is_available() and dist.is_initialized()
        if num_replicas is None:
            num_replicas = dist.get_world_size() if distributed else 1
        if rank is None:
            rank = dist.get_rank() if distributed else 0
        self.items = [int(i) for i in indices]
        # DistributedSampler reads only the length of what torch annotates as a Dataset
        super().__init__(self.items, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)  # type: ignore[arg-type]
        self.fixed_epoch = fixed_epoch

    def __iter__(self) -> Iterator[tuple[int, int]]:  # type: ignore[override]  # (epoch, i), not a bare index
        epoch = self.epoch if self.fixed_epoch is None else self.fixed_epoch
        for pos in super().__iter__():
            yield epoch, self.items[pos]


def triplet_loader(
    dataset: TripletDataset,
    indices: Sequence[int] | None = None,
    *,
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    num_workers: int = 0,
    fixed_epoch: int | None = None,
) -> DataLoader[Tensor]:
    """A DataLoader over ``dataset`` (all items, or ``indices``) that re-draws negatives every epoch."""
    items = range(len(dataset)) if indices is None else indices
    sampler = TripletSampler(items, shuffle=shuffle, seed=seed, fixed_epoch=fixed_epoch)
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers, persistent_workers=num_workers > 0
    )


def _resolve_corpus(corpus: str) -> Path:
    from geograph.data import corpus_path

    return corpus_path(corpus)


def build_graph(
    corpus: str,
    *,
    knn: int | None = None,
    mentions: bool = False,
    split: str = "test",
    cache: str | None = None,
    verbose: bool = True,
) -> CorpusGraph:
    """The :class:`CorpusGraph` of a BEIR folder by a recipe, cached on disk.

    Embeds the passages with the default encoder (through the embedding cache) and builds a
    k-NN graph (``knn``) or a title-mention graph (``mentions``). The graph is saved under
    ``<cache>/graphs/<folder>-<recipe>-<hash of model, passages and recipe>`` and loaded from
    there next time (written to a temporary name and renamed, so concurrent processes of a
    DDP run never see a torn graph).

    Args:
        corpus: a BEIR-format folder, or ``"demo"`` for the shipped demo corpus.
        knn: k of the k-NN graph (``1 <= knn < passages``).
        mentions: build the title-mention graph instead.
        split: qrels split read by the loader.
        cache: cache root (default ``$GEOGRAPH_CACHE`` or ``~/.cache/geograph``).
        verbose: print where the graph came from.
    """
    from geograph.data import Encoder, cache_dir, load_beir

    if (knn is None) == (not mentions):
        raise ValueError("give exactly one graph recipe: knn=K or mentions=true")
    dataset = load_beir(_resolve_corpus(corpus), split)
    n = len(dataset.doc_ids)
    if knn is not None and not (isinstance(knn, int) and 1 <= knn < n):
        err = ValueError(f"knn must be an integer in [1, {n}) for {n} passages, got {knn!r}")
        err.argument = "knn"  # type: ignore[attr-defined]  # read back as getattr(e, "argument")
        raise err
    encoder = Encoder(cache=cache)
    recipe = f"knn{knn}" if knn is not None else "mentions"
    key = [encoder.model_name, encoder.identity.weights, recipe, *dataset.passages()]  # a changed model: another graph
    digest = hashlib.sha256("\0".join(key).encode()).hexdigest()[:16]
    path = cache_dir(cache) / "graphs" / f"{dataset.name}-{recipe}-{digest}"
    if (path / "manifest.json").is_file():
        graph = CorpusGraph.from_pretrained(path, encoder=encoder)
        if verbose:
            print(f"{graph} from the cache {path}", flush=True)
        return graph
    emb = encoder.encode(dataset.passages())
    if knn is not None:
        graph = CorpusGraph.from_knn(emb, knn)
    else:
        graph = CorpusGraph.from_mentions(emb, dataset.titles, dataset.texts)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}"
    graph.save_pretrained(tmp, encoder=encoder, ids=dataset.doc_ids)
    try:
        os.replace(tmp, path)
    except OSError:  # another process stored the same graph first
        shutil.rmtree(tmp, ignore_errors=True)
    if verbose:
        print(f"{graph} built from {dataset.name} and cached in {path}", flush=True)
    return graph


class DataConfigError(ValueError):
    """A data module setting that cannot work (missing folder, wrong recipe): one line for the CLI."""


class GraphDataModule(L.LightningDataModule):
    """Serves triplets of a passage graph: built from a BEIR folder by a recipe, or a saved one.

    Give either ``corpus`` (a BEIR-format folder, or ``"demo"``) with ``knn`` or ``mentions``
    (see :func:`build_graph`: built once, then loaded from the cache), or ``graph_dir`` (a
    directory written by ``CorpusGraph.save`` / ``geograph build-graph``).

    Every epoch draws new negatives (:class:`TripletSampler` passes the epoch with each index);
    validation triplets are fixed (epoch 0). Under DDP each process reads its share of the
    triplets; the node embeddings stay with the data module and the model (never a buffer).

    Args:
        graph_dir: directory of a saved graph.
        corpus: BEIR-format folder or ``"demo"``.
        knn: k of a k-NN graph over ``corpus``.
        mentions: a title-mention graph over ``corpus`` instead.
        split: qrels split read from ``corpus``.
        cache: embedding and graph cache root.
        batch_size: triplets per step.
        hard_negatives: hard negatives kept per node (0 = random negatives only).
        hard_ratio: share of hard negatives in the triplets.
        val_fraction: share of the edges held out for validation triplet accuracy.
        num_workers: DataLoader workers.
        seed: triplet sampling and split seed.
    """

    def __init__(
        self,
        graph_dir: str | None = None,
        *,
        corpus: str | None = None,
        knn: int | None = None,
        mentions: bool = False,
        split: str = "test",
        cache: str | None = None,
        batch_size: int = 512,
        hard_negatives: int = 8,
        hard_ratio: float = 0.5,
        val_fraction: float = 0.1,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if (graph_dir is None) == (corpus is None):
            raise DataConfigError(
                "give either data.graph_dir (a saved CorpusGraph) or data.corpus (a BEIR folder) "
                "with data.knn or data.mentions"
            )
        if graph_dir is not None:
            if knn is not None or mentions:
                raise DataConfigError(
                    "data.knn and data.mentions are recipes for data.corpus; data.graph_dir is "
                    "already built (set them to null)"
                )
            try:
                self.graph = CorpusGraph.load(graph_dir)
            except (ValueError, OSError) as e:
                raise DataConfigError(f"data.graph_dir: {e}") from None
        else:
            try:
                # corpus is set: the check above allows no other case
                self.graph = build_graph(cast(str, corpus), knn=knn, mentions=mentions, split=split, cache=cache)
            except (ValueError, OSError) as e:
                arg: str | None = getattr(e, "argument", None)
                names: dict[str | None, str] = {"split": "data.split", "path": "data.corpus", "knn": "data.knn"}
                name = names.get(arg, "data")
                raise DataConfigError(f"{name}: {e}") from None
        self.dim = int(self.graph.embeddings.shape[1])

    def setup(self, stage: str | None = None) -> None:
        hp = cast("AttributeDict", self.hparams)  # what save_hyperparameters() stores
        hard = hard_negatives(self.graph, hp.hard_negatives) if hp.hard_negatives > 0 else None
        self.full = TripletDataset(self.graph, hard=hard, hard_ratio=hp.hard_ratio, seed=hp.seed)
        n_val = int(round(len(self.full) * hp.val_fraction)) if len(self.full) > 1 else 0
        perm = torch.randperm(len(self.full), generator=torch.Generator().manual_seed(hp.seed)).tolist()
        self.train_idx, self.val_idx = perm[n_val:], perm[:n_val]

    def train_dataloader(self) -> DataLoader[Tensor]:
        hp = cast("AttributeDict", self.hparams)  # what save_hyperparameters() stores
        return triplet_loader(
            self.full, self.train_idx, batch_size=hp.batch_size, shuffle=True, seed=hp.seed, num_workers=hp.num_workers
        )

    def val_dataloader(self) -> DataLoader[Tensor] | list[DataLoader[Tensor]]:
        if not self.val_idx:
            return []
        hp = cast("AttributeDict", self.hparams)  # what save_hyperparameters() stores
        return triplet_loader(
            self.full,
            self.val_idx,
            batch_size=hp.batch_size,
            shuffle=False,
            seed=hp.seed,
            num_workers=hp.num_workers,
            fixed_epoch=0,
        )
