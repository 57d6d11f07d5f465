"""Dense retrieval then reranking over a whole data set, batched, with a progress bar.

Shared by ``geograph demo`` and the benchmarks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

from geograph.data import Dataset, Encoder
from geograph.methods.dense.module import DenseRetriever
from geograph.outputs import RerankOutput


@dataclass(frozen=True)
class Candidates:
    """Dense top-M candidates for every query of a data set.

    Attributes:
        query: ``(Q, D)`` query embeddings.
        indices: ``(Q, M)`` corpus indices, best first.
        scores: ``(Q, M)`` cosine scores.
        corpus: ``(V, D)`` passage embeddings.
    """

    query: Tensor
    indices: Tensor
    scores: Tensor
    corpus: Tensor

    def docs(self, rows: slice) -> Tensor:
        """Candidate embeddings ``(b, M, D)`` for a slice of queries."""
        return self.corpus[self.indices[rows]]


def embed(dataset: Dataset, encoder: Encoder) -> tuple[Tensor, Tensor]:
    """Corpus ``(V, D)`` and query ``(Q, D)`` embeddings through the cache (the encoder's
    ``passage_prefix`` and ``query_prefix`` prepended)."""
    passages, queries = _texts(dataset, encoder)
    return encoder.encode(passages), encoder.encode(queries)


def _texts(dataset: Dataset, encoder: Encoder) -> tuple[list[str], list[str]]:
    passages = [getattr(encoder, "passage_prefix", "") + p for p in dataset.passages()]
    return passages, [getattr(encoder, "query_prefix", "") + q for q in dataset.queries]


def missing_embeddings(dataset: Dataset, encoder: Encoder) -> int:
    """How many of the passages and queries :func:`embed` would have to encode (not in the cache)."""
    passages, queries = _texts(dataset, encoder)
    texts = passages + queries
    if encoder.cache is None:
        return len(texts)
    return len(encoder.cache.get(texts)[1])


def dense_candidates(corpus: Tensor, query: Tensor, m: int) -> Candidates:
    """Exact dense top-``m`` (clamped to the corpus size) for every query."""
    out = DenseRetriever(corpus)(query, min(m, corpus.shape[0]))
    return Candidates(query=query, indices=out.indices, scores=out.scores, corpus=corpus)


def rerank_all(
    cands: Candidates,
    reranker: Callable[[Tensor, Tensor], RerankOutput],
    *,
    batch_size: int = 64,
    progress: bool = True,
    desc: str = "rerank",
) -> tuple[Tensor, Tensor]:
    """Run ``reranker(query, docs)`` over all queries in batches.

    Returns:
        ``(indices, scores)`` ``(Q, M)``: corpus indices in the reranker's order (dropped
        candidates last) and the matching scores (``-inf`` for dropped ones).
    """
    q = cands.query.shape[0]
    out_i, out_s = [], []
    starts = range(0, q, batch_size)
    for start in tqdm(starts, desc=desc, disable=not progress, unit="batch"):
        rows = slice(start, start + batch_size)
        res = reranker(cands.query[rows], cands.docs(rows))
        out_i.append(cands.indices[rows].gather(1, res.order))
        out_s.append(res.scores.gather(1, res.order))
    return torch.cat(out_i), torch.cat(out_s)


def run_ids(dataset: Dataset, indices: Tensor, scores: Tensor | None = None) -> list[list[str]]:
    """Corpus ids per query from ``indices (Q, K)``, dropping entries whose score is ``-inf``."""
    ids = dataset.doc_ids
    rows = indices.tolist()
    if scores is None:
        return [[ids[i] for i in r] for r in rows]
    keep = torch.isfinite(scores).tolist()
    return [[ids[i] for i, k in zip(r, kr) if k] for r, kr in zip(rows, keep)]
