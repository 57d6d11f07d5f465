"""Corpus graphs on Ray: the single-process builders, with their tiles run as Ray tasks.

:func:`knn_graph` and :func:`g3_graph` call :meth:`~geograph.CorpusGraph.from_knn` and
:meth:`~geograph.G3Graph.build` themselves inside :func:`on_ray`, which hands the independent
tiles of the tiled all-pairs routine (query-row tiles) and of the IVF join (groups of cells) to
Ray tasks (:class:`~geograph.distributed.cluster.RayExecutor`). Every tile is the same function on
the same inputs as in the single-process build and the partial top-k lists are merged by the
same code, so a Ray build equals the single-process one: same ``edge_index``, same ``T``, same
``rho``. What stays in the driver: the k-means of the IVF cells (on a sample), the merges, the
candidate-list work that is ``O(N K')``, the sampled density and the few border rows of the IVF
join.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from torch import Tensor

from geograph.distributed.cluster import RayExecutor, ray_session
from geograph.graphs.corpus_graph import CorpusGraph
from geograph.graphs.g3_graph import G3Graph
from geograph.knn.allpairs import tile_executor

__all__ = ["on_ray", "knn_graph", "g3_graph"]


@contextlib.contextmanager
def on_ray(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    max_retries: int = 3,
    runtime_env: dict[str, Any] | None = None,
) -> Iterator[RayExecutor]:
    """Inside the block, every corpus-graph build runs its tiles as Ray tasks.

    ``address``: ``None`` / ``"local"`` starts a local Ray (``num_cpus`` CPUs), ``"auto"`` or
    ``"ray://HOST:PORT"`` joins a cluster (:func:`~geograph.distributed.ray_session`); Ray
    already initialised in this process is reused. ``max_retries``: Ray's retries of a tile
    whose worker died; past them the build raises and nothing is returned.

    Example (not run here: it starts Ray)::

        with on_ray("auto"):
            graph = G3Graph.build(embeddings, index="ivf")
    """
    with ray_session(address, num_cpus=num_cpus, runtime_env=runtime_env) as session:
        executor = RayExecutor(max_retries=max_retries)
        executor.session = session
        with tile_executor(executor):
            yield executor


def _record(graph: CorpusGraph | G3Graph, executor: RayExecutor, seconds: float) -> None:
    graph.build_info = dict(
        graph.build_info,
        ray={
            "address": executor.session["address"],
            "cpus": executor.session["cpus"],
            "tasks": executor.tasks,
            "connect_seconds": executor.session["seconds"],
            "build_seconds": seconds,
        },
    )


def knn_graph(
    embeddings: Tensor,
    k: int,
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    max_retries: int = 3,
    **options: Any,
) -> CorpusGraph:
    """:meth:`CorpusGraph.from_knn(embeddings, k, **options) <geograph.CorpusGraph.from_knn>` with its tiles on Ray
    (:func:`on_ray`); ``build_info["ray"]`` records the address, CPUs, tasks and seconds."""
    with on_ray(address, num_cpus=num_cpus, max_retries=max_retries) as executor:
        t0 = time.perf_counter()
        graph = CorpusGraph.from_knn(embeddings, k, **options)
        _record(graph, executor, time.perf_counter() - t0)
    return graph


def g3_graph(
    embeddings: Tensor,
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    max_retries: int = 3,
    **options: Any,
) -> G3Graph:
    """:meth:`G3Graph.build(embeddings, **options) <geograph.G3Graph.build>` with its tiles on Ray (:func:`on_ray`)."""
    with on_ray(address, num_cpus=num_cpus, max_retries=max_retries) as executor:
        t0 = time.perf_counter()
        graph = G3Graph.build(embeddings, **options)
        _record(graph, executor, time.perf_counter() - t0)
    return graph
