"""Downstream scorers: order the candidates a geometric method keeps (or seeds it picks).

A scorer is any callable ``scorer(queries, passages, mask=None) -> (B, N)`` tensor, with
``queries`` a list of ``B`` query texts, ``passages`` a list of ``B`` lists of ``N`` passage
texts, and ``mask`` an optional ``(B, N)`` bool of the pairs to score (the others get
``-inf`` and are never sent to the model). :class:`CrossEncoderScorer` is one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["CrossEncoderScorer"]


class CrossEncoderScorer:
    """Score (query, passage) pairs with a sentence-transformers ``CrossEncoder``.

    Loads any local ``CrossEncoder`` directory (or accepts a loaded model), scores only the
    pairs that ``mask`` selects, in one ``predict`` call per batch of queries, and returns
    ``(B, N)`` float32 scores with ``-inf`` elsewhere. Nothing is downloaded: pass a path
    that exists (the machine this library was built on has no model hub access).

    Args:
        model: a directory saved by ``CrossEncoder.save`` / ``save_pretrained``, or a
            ``CrossEncoder`` instance.
        batch_size: pairs per forward pass of the model.
        device: device for the model (default: the sentence-transformers choice).
        max_length: truncation length in tokens (default: the model's).

    Example:
        >>> scorer = CrossEncoderScorer("path/to/cross-encoder")  # doctest: +SKIP
        >>> scorer(["what is x?"], [["x is y.", "z."]]).shape  # doctest: +SKIP
        torch.Size([1, 2])
    """

    def __init__(
        self,
        model: str | Path | object,
        *,
        batch_size: int = 32,
        device: str | None = None,
        max_length: int | None = None,
    ) -> None:
        if isinstance(model, (str, Path)):
            path = Path(model)
            if not path.is_dir():
                raise ValueError(f"cross-encoder path {str(path)!r} is not a directory (no model is downloaded)")
            from sentence_transformers import CrossEncoder

            kwargs: dict[str, str | bool | int | None] = {"device": device, "local_files_only": True}
            if max_length is not None:
                kwargs["max_length"] = max_length
            model = CrossEncoder(str(path), **kwargs)
        if not hasattr(model, "predict"):
            raise ValueError(f"model must be a CrossEncoder or a directory, got {type(model).__name__}")
        self.model = model
        self.batch_size = int(batch_size)

    def __call__(self, queries: Sequence[str], passages: Sequence[Sequence[str]], mask: Tensor | None = None) -> Tensor:
        b = len(queries)
        if len(passages) != b:
            raise ValueError(f"got {b} queries but {len(passages)} passage lists")
        n = max((len(p) for p in passages), default=0)
        if mask is None:
            mask = torch.zeros(b, n, dtype=torch.bool)
            for i, p in enumerate(passages):
                mask[i, : len(p)] = True
        elif tuple(mask.shape) != (b, n):
            raise ValueError(f"mask must have shape {(b, n)}, got {tuple(mask.shape)}")
        mask = mask.detach().to("cpu", torch.bool)
        if any(bool(mask[i, len(p) :].any()) for i, p in enumerate(passages)):
            raise ValueError("mask selects a passage position beyond the end of its passage list")
        pairs_idx = mask.nonzero().tolist()
        scores = torch.full((b, n), float("-inf"))
        if pairs_idx:
            pairs = [(str(queries[i]), str(passages[i][j])) for i, j in pairs_idx]
            pred = self.model.predict(pairs, batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False)
            pred = torch.as_tensor(pred, dtype=torch.float32).reshape(len(pairs), -1)[:, -1]
            scores[mask] = pred
        return scores

    def for_corpus(self, passages: Sequence[str]) -> Callable[[Tensor, Tensor, Sequence[str] | None], Tensor]:
        """A G3RAG seed scorer over a corpus: ``scorer(query, candidate_ids, query_texts) -> (B, C)``.

        ``candidate_ids`` index ``passages``; ``query_texts`` are required (the model reads text).
        """
        passages = list(passages)

        def score(query: Tensor, candidate_ids: Tensor, query_texts: Sequence[str] | None = None) -> Tensor:
            if query_texts is None:
                raise ValueError("the cross-encoder seed scorer needs query_texts")
            rows = candidate_ids.tolist()
            return self(list(query_texts), [[passages[i] for i in row] for row in rows]).to(candidate_ids.device)

        return score

    def __repr__(self) -> str:
        return f"CrossEncoderScorer({type(self.model).__name__}, batch_size={self.batch_size})"
