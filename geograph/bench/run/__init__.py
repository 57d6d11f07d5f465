"""``geograph bench run --config configs/bench/<name>.yaml``: every method, every data set, one table.

For each labelled BEIR-format data set of the config (and any ``--data DIR`` given):

1. the corpus and queries are embedded once (through the on-disk cache) and split honestly
   (:func:`geograph.bench.common.tuning_split`: SciFact tuned on train and reported on test;
   a set without a train split tuned on the first half of its queries, reported on the rest);
2. every method's grid is searched on the tuning split by the data set's primary metric (the
   other metrics break ties), and the chosen values are saved;
3. on the reported split every method runs on the same dense top-``candidates`` lists
   (rerankers reorder them; ISO-RAG and G3RAG retrieve from the corpus, G3RAG from its own
   dense top-``g3.candidates``), and each method's per-query metrics are compared with dense
   by a paired bootstrap (95% interval of the mean difference);
4. speed in the same run: ms/query at B = 1 and B = ``speed.batch`` of each method (rerankers:
   the reranking of precomputed candidates; retrievers: query embedding to top-k), and of the
   slow reference where one exists (scipy Dijkstra for Maniscope, GraphRicciCurvature for
   Ricci-Filtration, numpy + networkx PageRank for ISO-RAG, dense numpy for G3RAG), with the ratio;
   every timing warmed up and repeated (median and min-max); the thread count is recorded.

Rows: dense, the lexical baseline BM25 (``bm25s``, k1 and b tuned like every other method), each
configured method and chain. Metrics: Recall@k, nDCG@k, HitAll@k, and HitAns@k (an answer string
in the top k) on data sets whose queries carry answers (MuSiQue).

The package splits the jobs: :mod:`~geograph.bench.run.config` (the YAML),
:mod:`~geograph.bench.run.methods` (each row's ranker and reference),
:mod:`~geograph.bench.run.protocol` (tuning, reporting, timing), :mod:`~geograph.bench.run.tables`
(table, markdown, files), :mod:`~geograph.bench.run.plot` (figure), :mod:`~geograph.bench.run.cli`.

Writes ``results.json``, ``results.md`` and ``results.png`` (quality gain vs ms/query) under
``out`` and prints a table. Chains (e.g. ``[ricci, maniscope]``) run the stages in order with
each stage's tuned values: a stage's dropped candidates stay dropped.
"""

from __future__ import annotations

from geograph.bench.run.cli import main
from geograph.bench.run.config import DEFAULT_CONFIG, dataset_root, grid_points, load_config
from geograph.bench.run.methods import (
    LABELS,
    METHODS,
    Context,
    Method,
    Ranker,
    RegistryMethod,
    chain_ranker,
    chain_reference,
    reranker,
)
from geograph.bench.run.plot import figure
from geograph.bench.run.protocol import environment, evaluate_run, run, speed, tune
from geograph.bench.run.tables import markdown, print_table, table_rows, write

__all__ = [
    "main",
    "run",
    "write",
    "load_config",
    "dataset_root",
    "grid_points",
    "Context",
    "Method",
    "Ranker",
    "METHODS",
    "LABELS",
    "chain_ranker",
    "chain_reference",
    "reranker",
    "RegistryMethod",
    "speed",
    "tune",
    "evaluate_run",
    "environment",
    "table_rows",
    "markdown",
    "print_table",
    "figure",
    "DEFAULT_CONFIG",
]
