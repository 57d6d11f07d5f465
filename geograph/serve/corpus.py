"""The served corpus and the text encoders of ``geograph serve``.

The corpus (a BEIR folder) is embedded once through the on-disk embedding cache
(``$GEOGRAPH_CACHE`` or ``cache:``). Query and candidate texts of requests are never written
there: :func:`request_encoder` keeps them in a bounded in-memory LRU
(:class:`~geograph.data.cache.MemoryCache`) of the worker, and encodes each text on its own
(``batch_size=1``) so that a text's vector does not depend on which texts share its batch
(padding a transformer batch changes the float rounding, ~1e-7).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence


def read_corpus(corpus_dir: str | Path):
    """The :class:`~geograph.data.Dataset` of a BEIR folder (passages only when it has no qrels).

    Raises:
        ValueError: ``corpus_dir`` has no ``corpus.jsonl``.
    """
    from geograph.data import load_beir, load_corpus

    corpus_dir = Path(corpus_dir)
    if not (corpus_dir / "corpus.jsonl").is_file():
        raise ValueError(f"corpus: {corpus_dir} is not a BEIR-format folder (no corpus.jsonl)")
    if (corpus_dir / "qrels" / "test.tsv").is_file():
        return load_beir(corpus_dir, "test")
    return load_corpus(corpus_dir)


class TextEncoder:
    """Query and passage texts to unit vectors, with the e5/bge-style prefixes of the config.

    Args:
        model: a local sentence-transformers directory, or ``None`` for the default model.
        query_prefix: prepended to query texts (e.g. ``"query: "``).
        passage_prefix: prepended to corpus passages and candidate texts (e.g. ``"passage: "``).
        cache: the on-disk cache root for the corpus (``None`` = ``$GEOGRAPH_CACHE``).
        memory: size of the in-memory LRU for request texts (0 = none).
        device: where the encoder runs.
    """

    def __init__(self, model: Optional[str] = None, *, query_prefix: str = "", passage_prefix: str = "",
                 cache: Optional[str] = None, memory: int = 4096, device: Optional[str] = None) -> None:
        from geograph.data.cache import Encoder, MemoryCache

        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.corpus_encoder = Encoder(model, cache=cache, progress=False, device=device)
        self.request_encoder = Encoder(model, cache=MemoryCache(memory), batch_size=1, progress=False,
                                       device=device)

    def corpus(self, passages: Sequence[str]):
        """``(V, D)`` float32 unit rows of the corpus, through the on-disk cache."""
        return self.corpus_encoder.encode([self.passage_prefix + p for p in passages])

    def warm(self) -> None:
        """Load the model and run one forward, so the first request does not pay for it."""
        self._shared().model.encode(["warm up"], batch_size=1)

    def _shared(self):
        if self.request_encoder._model is None:  # one model in memory for both
            self.request_encoder._model = self.corpus_encoder.model
        return self.request_encoder

    def truncate(self, texts: Sequence[str], max_tokens: Optional[int]) -> list[str]:
        """``texts`` each cut after its first ``max_tokens`` tokens (``None``: unchanged).

        The cut is made in the text, at the end of the last kept token (the tokenizer's
        character offsets, no special tokens, no prefix), so the truncated text is embedded
        and cached like any other. The encoder's own limit (``max_seq_length``) still applies.
        """
        if max_tokens is None:
            return list(texts)
        tok = self._shared().model.tokenizer
        enc = tok(list(texts), add_special_tokens=False, return_offsets_mapping=True, truncation=False)
        return [t if len(offsets) <= max_tokens else t[: offsets[max_tokens - 1][1]]
                for t, offsets in zip(texts, enc["offset_mapping"])]

    def queries(self, texts: Sequence[str]):
        """``(B, D)`` query vectors; in memory only."""
        self._shared()
        return self.request_encoder.encode([self.query_prefix + t for t in texts])

    def passages(self, texts: Sequence[str]):
        """``(N, D)`` candidate-text vectors; in memory only."""
        self._shared()
        return self.request_encoder.encode([self.passage_prefix + t for t in texts])
