"""Request schema of ``geograph serve``: every constraint a module enforces, checked before a worker.

Pydantic validates a request in the API server process; a request that fails gets a 422
naming the field and never joins a batch. The limits that depend on the loaded corpus and
method (embedding dimension, corpus ids and size, the method's bounds on ``k``) live in
:data:`LIMITS`, filled by :func:`set_limits` in the process that forks the API servers.

Checks, per field:

* ``query`` / ``query_embedding``: exactly one; text 1..10000 characters; an embedding has
  ``D`` finite values and is not the zero vector (it has no direction, so every cosine is 0).
* ``candidates`` / ``candidate_embeddings`` / ``candidate_ids`` (``/rerank``): exactly one,
  1..``max_candidates`` entries (and at most ``max_batch_candidates``), rows like
  ``query_embedding``, ids known to the corpus.
* ``candidates`` (``/retrieve``, rerankers): the request's own dense pool (default
  ``--candidates``), at most ``max_candidates``, ``max_batch_candidates`` and the corpus size.
* ``k`` (``/retrieve``): ``1 <= k``; rerankers: ``k <= candidates``; ISO: ``k <=`` the guaranteed
  local set size; G3: ``seeds <= k <=`` corpus size; every method: ``k <= max_k``.
* ``top_n`` (``/rerank``): ``1 <= top_n <=`` the number of candidates.
* ``max_tokens_per_doc`` (``/rerank``): ``>= 1``; only with ``candidates`` (texts), each cut to
  its first ``max_tokens_per_doc`` tokens of the encoder's tokenizer before it is embedded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from geograph import registry
from geograph.spec import listing

#: Limits set by :func:`set_limits` (``dim``, ``ids``, ``num_docs``, ``max_candidates``,
#: ``max_batch_candidates``, ``max_k``, ``method``, ``default_candidates``, ``k_min``, ``k_max``,
#: and the served graph's ``corpus_version``, shown by ``GET /info``).
LIMITS: dict[str, Any] = {}

RERANKERS = registry.RERANKERS


def set_limits(**limits: Any) -> None:
    """Replace :data:`LIMITS` (called once at start, before the API servers fork; a reload replaces
    the corpus's entries: :mod:`geograph.serve.reload`)."""
    LIMITS.clear()
    LIMITS.update(limits)


def count_limit(n: int) -> tuple[int, str] | None:
    """``(limit, flag)`` of the first of ``max_candidates`` and ``max_batch_candidates`` that ``n``
    candidates exceed (a request must fit in one batch), else ``None``.

    Example:
        >>> set_limits(max_candidates=50, max_batch_candidates=4096)
        >>> count_limit(50), count_limit(100)
        (None, (50, '--max-candidates'))
        >>> set_limits()
    """
    for key, flag in (("max_candidates", "--max-candidates"), ("max_batch_candidates", "--max-batch-candidates")):
        limit = LIMITS.get(key, 1000 if key == "max_candidates" else None)
        if limit is not None and n > limit:
            return limit, flag
    return None


def check_vector(v: list[float] | None, name: str) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``v`` is ``None`` or ``D`` finite values, not all 0.

    Example:
        >>> set_limits(dim=2)
        >>> check_vector([0.0, 1.0], "query_embedding") is None
        True
        >>> set_limits()
    """
    if v is None:
        return
    dim = LIMITS.get("dim")
    if dim is not None and len(v) != dim:
        raise ValueError(f"{name} must have {dim} values (the corpus embedding dimension), got {len(v)}")
    if not all(math.isfinite(x) for x in v):
        raise ValueError(f"{name} contains NaN or infinite values")
    if not any(x != 0.0 for x in v):
        raise ValueError(f"{name} is the zero vector (no direction: every cosine would be 0)")


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str | None = Field(None, min_length=1, max_length=10000, description="query text")
    query_embedding: list[float] | None = Field(None, description="query embedding (D floats)")

    def _check_query(self) -> None:
        if (self.query is None) == (self.query_embedding is None):
            raise ValueError("give exactly one of query (text) and query_embedding")
        check_vector(self.query_embedding, "query_embedding")


class RetrieveRequest(_Request):
    """``POST /retrieve``: ``{"query": str} | {"query_embedding": [D floats]}``, ``"k"``, and for the
    rerankers ``"candidates"`` (the size of the request's dense pool)."""

    k: int = Field(10, ge=1, description="number of passages returned (Ricci-Filtration: at most k)")
    candidates: int | None = Field(None, ge=1, description=f"dense pool reranked ({', '.join(RERANKERS)})")

    @model_validator(mode="after")
    def _validate(self) -> Self:
        self._check_query()
        method = LIMITS.get("method")
        max_k = LIMITS.get("max_k", 1000)
        if self.k > max_k:
            raise ValueError(f"k must be <= {max_k} (--max-k), got {self.k}")
        if method in RERANKERS:
            pool = self.candidates if self.candidates is not None else LIMITS.get("default_candidates", 20)
            self.candidates = pool  # resolved here: the worker (another process) has no LIMITS
            over = count_limit(pool)
            if over is not None:
                raise ValueError(f"candidates must be <= {over[0]} ({over[1]}), got {pool}")
            n = LIMITS.get("num_docs")
            if n is not None and pool > n:
                raise ValueError(f"candidates must be <= {n} (the corpus size), got {pool}")
            if self.k > pool:
                raise ValueError(f"k ({self.k}) must be <= candidates ({pool}), the request's pool")
        else:
            if self.candidates is not None:
                raise ValueError(f"candidates applies to {listing(RERANKERS)}, not {method}")
            lo, hi = LIMITS.get("k_min", 1), LIMITS.get("k_max")
            if self.k < lo:
                raise ValueError(f"k ({self.k}) must be >= {lo} ({method}: the seeds come first)")
            if hi is not None and self.k > hi:
                raise ValueError(f"k ({self.k}) must be <= {hi} ({LIMITS.get('k_max_reason', method)})")
        return self

    def pool(self) -> int:
        """The dense pool this request reranks (rerankers)."""
        return self.candidates if self.candidates is not None else LIMITS.get("default_candidates", 20)


class RerankRequest(_Request):
    """``POST /rerank``: a query, exactly one of ``candidates`` (texts), ``candidate_embeddings``
    (``N x D``) or ``candidate_ids`` (corpus ids), and optionally ``top_n``."""

    candidates: list[str] | None = Field(None, min_length=1)
    candidate_embeddings: list[list[float]] | None = Field(None, min_length=1)
    candidate_ids: list[str] | None = Field(None, min_length=1)
    top_n: int | None = Field(None, ge=1, description="return at most this many (best first)")
    max_tokens_per_doc: int | None = Field(None, ge=1, description="cut candidate texts to this many tokens")

    @model_validator(mode="after")
    def _validate(self) -> Self:
        self._check_query()
        given = [n for n in ("candidates", "candidate_embeddings", "candidate_ids") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of candidates, candidate_embeddings and candidate_ids")
        items = getattr(self, given[0])
        over = count_limit(len(items))
        if over is not None:
            raise ValueError(f"{given[0]} has {len(items)} entries; at most {over[0]} per request ({over[1]})")
        for i, t in enumerate(self.candidates or []):
            if len(t) == 0:
                raise ValueError(f"candidates[{i}] is empty")
        for i, row in enumerate(self.candidate_embeddings or []):
            check_vector(row, f"candidate_embeddings[{i}]")
        if self.candidate_ids is not None and "ids" in LIMITS:
            unknown = [x for x in self.candidate_ids if x not in LIMITS["ids"]]
            if unknown:
                raise ValueError(f"unknown candidate_ids {unknown[:5]} (not in the corpus)")
        if self.max_tokens_per_doc is not None and self.candidates is None:
            raise ValueError("max_tokens_per_doc applies to candidates (texts) only")
        if self.top_n is not None and self.top_n > len(items):
            raise ValueError(f"top_n ({self.top_n}) must be <= the number of candidates ({len(items)})")
        return self

    def size(self) -> int:
        """Number of candidates in the request."""
        for name in ("candidates", "candidate_embeddings", "candidate_ids"):
            items = getattr(self, name)
            if items is not None:
                return len(items)
        return 0


class RetrieveResponse(BaseModel):
    """``POST /retrieve``'s answer: passages best first, and Ricci-Filtration's dropped ones."""

    ids: list[str] = Field(description="corpus ids, best first (at most k)")
    scores: list[float] = Field(description="the method's score of each id")
    dropped: list[str] = Field(description="Ricci-Filtration: pool ids it dropped, in corpus order")
    batch_size: int = Field(description="requests of this endpoint in the module call that answered")
    version: int = Field(description="the served corpus version that computed it: 0 at start, one more each reload")


class RerankResponse(BaseModel):
    """``POST /rerank``'s answer (this server's dialect): candidate positions best first."""

    order: list[int] = Field(description="positions in the request's candidates, best first (at most top_n)")
    scores: list[float] = Field(description="the method's score of each position in order")
    dropped: list[int] = Field(description="Ricci-Filtration: positions it dropped")
    batch_size: int = Field(description="requests of this endpoint in the module call that answered")
    version: int = Field(description="the served corpus version that computed it: 0 at start, one more each reload")


def request_candidates(body: Any) -> int:
    """Candidates a queued request brings to a batch: its ``/rerank`` list (texts, embeddings or
    ids), its ``/retrieve`` dense pool (rerankers), or its ``k`` (ISO, G3). Never raises (it runs
    in the worker's batch loop); anything it cannot read counts as one.

    Example:
        >>> request_candidates({"query": "q", "candidates": ["a", "b"]}), request_candidates({"query": "q", "k": 5})
        (2, 5)
        >>> request_candidates({"query": "q", "k": 5, "candidates": 20}), request_candidates(b"raw")
        (20, 1)
    """
    get: Callable[[str], Any] = body.get if isinstance(body, dict) else (lambda name: getattr(body, name, None))
    for name in ("candidates", "candidate_embeddings", "candidate_ids"):
        items = get(name)
        if isinstance(items, (list, tuple)):
            return len(items)
        if isinstance(items, int) and not isinstance(items, bool):
            return max(1, items)
    k = get("k")
    return k if isinstance(k, int) and not isinstance(k, bool) and k >= 1 else 1


def request_texts(body: Any) -> int:
    """Texts a queued request brings to encode: its query text (if any) and its candidate texts
    (a ``/rerank`` list; ``/retrieve``'s ``candidates`` is a pool size, not texts).

    ``body`` is the validated request (or its JSON dict); anything else counts as one text. It
    never raises: it runs in the worker's batch loop, where an exception would stop the worker.

    Example:
        >>> request_texts({"query": "q", "candidates": ["a", "b"]}), request_texts({"query": "q", "candidates": 20})
        (3, 1)
        >>> request_texts({"query_embedding": [0.0]}), request_texts(b"raw")
        (0, 1)
    """
    get: Callable[[str], Any] = body.get if isinstance(body, dict) else (lambda name: getattr(body, name, None))
    if not isinstance(body, dict) and not hasattr(body, "query"):
        return 1
    texts = get("candidates")
    return (get("query") is not None) + (len(texts) if isinstance(texts, (list, tuple)) else 0)
