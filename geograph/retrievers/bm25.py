"""BM25: the lexical baseline next to dense retrieval (the ``bm25s`` package, ``bench`` extra)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from geograph._checks import check_positive_int
from geograph.outputs import RetrievalOutput, topk_stable

__all__ = ["BM25Retriever"]


class BM25Retriever:
    r"""Okapi BM25 over passage texts: fit once on the corpus, then top-k indices and scores per query.

    Scores (``bm25s``' default ``method="lucene"``, as Lucene/Elasticsearch, which drop the
    classic ``(k1 + 1)`` factor of the numerator: the same ranking):

    .. math:: \mathrm{score}(q, d) = \sum_{t \in q} \mathrm{idf}(t)\,
              \frac{f_{t,d}}{f_{t,d} + k_1 (1 - b + b\,|d| / \mathrm{avgdl})},
              \qquad \mathrm{idf}(t) = \ln\!\Big(1 + \frac{N - n_t + 0.5}{n_t + 0.5}\Big)

    (a query token counted once per occurrence). Tokens: lower-cased words of two or more
    word characters, English stop words removed, no stemming unless ``stemmer`` is given (e.g.
    ``Stemmer.Stemmer("english").stemWords`` from PyStemmer). Query tokens missing from the
    corpus vocabulary are ignored; a query with none scores 0 everywhere. All queries of a call
    are scored by one sparse product ``(B, vocab) x (vocab, N)``; equal scores rank the lower
    passage index first (geograph's tie rule). Index ``i`` of the output is ``passages[i]``.

    Not an ``nn.Module``: it holds no tensors a device move would need; the scores come back
    as float32 CPU tensors.

    Args:
        passages: the corpus texts (e.g. ``Dataset.passages()``: title and text).
        k1: term-frequency saturation.
        b: length normalisation in ``[0, 1]``.
        stopwords: ``"en"`` (bm25s' English list), a list of words, or ``None``.
        stemmer: a callable from a list of words to their stems, or ``None``.

    References:
        Robertson and Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond" (2009);
        Lu, "BM25S: Orders of magnitude faster lexical search via eager sparse scoring" (2024).

    Example:
        >>> bm25 = BM25Retriever(["the cat sat on the mat", "dogs bark loudly", "a cat and a dog"])
        >>> out = bm25.retrieve(["cat", "loud dogs bark"], k=2)
        >>> out.indices.tolist()
        [[2, 0], [1, 0]]
    """

    def __init__(
        self,
        passages: Sequence[str],
        *,
        k1: float = 1.5,
        b: float = 0.75,
        stopwords: str | Sequence[str] | None = "en",
        stemmer: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        try:
            import bm25s
            from bm25s.tokenization import Tokenizer
        except ImportError as exc:  # pragma: no cover - exercised without the extra
            raise ImportError("BM25Retriever needs bm25s: pip install 'geograph-rag[bench]'") from exc
        from scipy.sparse import csc_matrix

        if isinstance(passages, str) or len(passages) == 0:
            raise ValueError("passages must be a non-empty sequence of strings")
        if not all(isinstance(p, str) for p in passages):
            raise ValueError("passages must all be strings")
        if not (np.isfinite(k1) and k1 >= 0):
            raise ValueError(f"k1 must be finite and >= 0, got {k1!r}")
        if not (np.isfinite(b) and 0.0 <= b <= 1.0):
            raise ValueError(f"b must lie in [0, 1], got {b!r}")
        self.k1, self.b = float(k1), float(b)
        self.num_passages = len(passages)
        self._tokenizer = Tokenizer(stopwords=stopwords if stopwords is not None else [], stemmer=stemmer)
        ids = self._tokenizer.tokenize(list(passages), show_progress=False, return_as="ids")
        self._bm25 = bm25s.BM25(k1=self.k1, b=self.b)
        self._bm25.index(ids, show_progress=False)
        sc = self._bm25.scores
        # (vocab, N): row t holds every passage's BM25 weight of token t
        self._weights = csc_matrix(
            (sc["data"], sc["indices"], sc["indptr"]), shape=(self.num_passages, len(sc["indptr"]) - 1)
        ).T.tocsr()

    @property
    def vocab_size(self) -> int:
        return int(self._weights.shape[0])

    def scores(self, queries: Sequence[str]) -> torch.Tensor:
        """BM25 score of every passage for every query: ``(B, N)`` float32."""
        from scipy.sparse import csr_matrix

        if isinstance(queries, str) or not all(isinstance(q, str) for q in queries):
            raise ValueError("queries must be a sequence of strings")
        toks = self._tokenizer.tokenize(
            list(queries), show_progress=False, update_vocab=False, allow_empty=False, return_as="ids"
        )
        rows = np.repeat(np.arange(len(toks)), [len(t) for t in toks])
        cols = np.fromiter((t for ts in toks for t in ts), dtype=np.int64, count=len(rows))
        counts = csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=(len(toks), self.vocab_size))
        return torch.from_numpy(np.asarray((counts @ self._weights).todense(), dtype=np.float32))

    def retrieve(self, queries: Sequence[str], k: int) -> RetrievalOutput:
        """Top-``k`` passages of each query: ``indices (B, k)`` long and ``scores (B, k)`` float32."""
        k = check_positive_int(k, "k")
        if k > self.num_passages:
            raise ValueError(f"k ({k}) exceeds the corpus size {self.num_passages}")
        values, indices = topk_stable(self.scores(queries), k)
        return RetrievalOutput(indices=indices, scores=values)

    __call__ = retrieve

    def __repr__(self) -> str:
        return f"BM25Retriever(passages={self.num_passages}, vocab={self.vocab_size}, k1={self.k1}, b={self.b})"
