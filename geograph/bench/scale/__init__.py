"""``geograph bench scale``: corpus graphs and dense retrieval at corpus scale, ANN vs exact.

For each size N (positional arguments) and each ``--generators`` synthetic corpus (384-d unit vectors that
reproduce all-MiniLM-L6-v2's geometry, fitted to the cached SciFact passage embeddings;
see :func:`fit_generators`), in a fresh process per build (peak resident memory
of that process): the k-NN graph (k = 10) and the G3 graph (``max_degree`` 128) built with
``--index`` (default ``ivf``), the time of every stage, and against exact references in the
same run:

- k-NN edge recall@10 on ``--check-rows`` uniformly sampled rows (each row's exact top-10 by
  the tiled scan against the whole corpus);
- G3: the certified and re-done rows; on the sampled rows, edge recall and the L1 error of the
  row-normalised weights against the exact rows. Up to ``--exact-limit`` passages the exact
  rows use the exact density of every passage (one tiled pass over all pairs) and the
  density's largest error is reported over all rows; above it the exact rows use the build's
  own density (isolating the candidate error) and the density error is measured on the
  sampled rows (exact raw density, normalised by the build's exact extremes);
- ``DenseRetriever`` IVF recall@20 and ms/query at B=64 next to the exact scan (same
  queries, warmed, repeated: median and spread), on held-out draws of the generator;
- the ``nprobe`` each IVF build and the dense index chose for its recall target (``exact``
  where a build fell back to the exact scan; JSON: ``build_info`` / ``calibration`` with the
  recall each measured on its own sampled rows).

With ``--ray [ADDRESS]`` both builds are made again with their tiles on Ray
(:mod:`geograph.distributed`; alone: a local Ray on this machine), each in a fresh process that
connects and warms the workers before its clock starts (both timed and reported apart): the
wall time against the single-process build, the overhead, the tasks, and whether the two graphs
are equal (the same edges and density; weights within 1e-6). The peak RSS of a Ray build is the
driver's only (the workers are Ray's processes).

With ``--peers`` each size runs the k-NN peers comparison instead
(:mod:`geograph.bench.scale.peers_compare`): geograph's k-NN build next to faiss HNSW, faiss
IVF-Flat, pynndescent and usearch on the same vectors, each builder in a fresh process (seconds of
build + all-vs-all search, peak RSS, recall@10 by numpy on the sampled rows, each builder's
recall-time frontier, the matmul rate and the join's), written to ``scale-peers.json`` / ``.md``.

Then the real sets at their own size (SciFact, MuSiQue by default): the same recalls, and
whether ISO-RAG and G3RAG return the same top-k with IVF-built graphs as with exact ones on
every query (an IVF forced at small N: ``nlist`` from :func:`~geograph.knn.policy.default_nlist`).

The generators are checked by printing, next to real SciFact, the pairwise-cosine histogram
and the 1st / 10th-neighbour cosine quantiles of a synthetic sample of the same size (and of
2Wiki's first 5,183 passages, a second real corpus). Measured: both generators match SciFact's
pairwise histogram and mean cosine (0.131); the mixture's 1st / 10th-neighbour medians are
0.61 / 0.50 (SciFact 0.68 / 0.53, 2Wiki 0.55 / 0.40), the Gaussian's 0.46 / 0.40: the mixture
is the realistic case and the Gaussian the hard one for an IVF index (no topics to cut along).
"""

# One job per module: generators (the synthetic corpora and their geometry), harness (one build in a
# fresh process: peak RSS, stage times), references (exact rows and the errors against them), dense
# (DenseRetriever IVF vs exact), ray_compare (the builds on Ray), synthetic (one synthetic size),
# real_sets (the real sets at their own size), peers (the k-NN peers' builds, in the fresh process),
# peers_compare (--peers: their recall, frontier and table), cli (the command, tables and files).

from __future__ import annotations

from geograph.bench.scale.cli import BUILDS, main
from geograph.bench.scale.dense import dense_compare
from geograph.bench.scale.generators import GENERATORS, fit_generators, generate, geometry
from geograph.bench.scale.harness import KNN_K, MAX_DEGREE, build_in_child
from geograph.bench.scale.ray_compare import ray_compare
from geograph.bench.scale.real_sets import real_set
from geograph.bench.scale.references import (
    csr_edge_recall,
    exact_g3_rows,
    exact_knn_rows,
    g3_check,
    g3_row_errors,
    knn_recall,
    raw_density,
)
from geograph.bench.scale.synthetic import run_size

__all__ = [
    "main",
    "BUILDS",
    "GENERATORS",
    "KNN_K",
    "MAX_DEGREE",
    "fit_generators",
    "generate",
    "geometry",
    "build_in_child",
    "exact_knn_rows",
    "knn_recall",
    "exact_g3_rows",
    "g3_row_errors",
    "raw_density",
    "g3_check",
    "csr_edge_recall",
    "dense_compare",
    "ray_compare",
    "run_size",
    "real_set",
]
