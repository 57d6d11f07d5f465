"""The served corpus and the text encoders of ``geograph serve``.

The corpus (a BEIR folder) is embedded once through the on-disk embedding cache
(``$GEOGRAPH_CACHE`` or ``cache:``). Query and candidate texts of requests are never written
there: :class:`TextEncoder` keeps them in a bounded in-memory LRU
(:class:`~geograph.data.cache.MemoryCache`) of the worker.

A request text's vector must not depend on which texts share its batch. Padding a transformer
batch changes the float rounding (~1e-7: the attention and pooling reductions run over the padded
length), and so does splitting one matrix product over several CPU threads in a way that depends
on the number of rows. On the CPU, request texts are therefore encoded with one intra-op thread and
always padded to a fixed length, their token count rounded up to a multiple of
:data:`BUCKET_TOKENS` (the *bucket*); texts of one bucket are encoded together. A text's vector is
then a function of the text alone: bit for bit what it gets in a batch of its own, whoever its
batch-mates are (checked for every grouped vector on all-MiniLM-L6-v2 by
``tests/test_serve_encoding.py``; with two threads, 212 of 1322 grouped vectors differed). It
differs from sentence-transformers' unpadded ``encode([text])`` by float32 rounding only (at most
1.8e-7 per coordinate measured on 256 queries; the test bounds it by 1e-6). Grouping by exact
token count without padding, the earlier scheme, formed groups of one or two texts on real query
traffic (70 texts/s on one thread, against 150-166 texts/s in buckets of 8-32 texts). Elsewhere
(CUDA, where kernels are chosen by shape) texts are encoded one at a time (``batch_size=1``).
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from geograph.artefacts import EncoderIdentity
    from geograph.data import Dataset, Encoder


def read_corpus(corpus_dir: str | Path) -> Dataset:
    """The passages of a BEIR folder (its ``corpus.jsonl``) as a :class:`~geograph.data.Dataset`.

    Queries and judgements are not read: serving does not use them, and a corpus changed by
    ``geograph update`` may have removed a passage that ``qrels/`` still judges.

    Raises:
        ValueError: ``corpus_dir`` has no ``corpus.jsonl``, or an id appears twice in it.
    """
    from geograph.data import load_corpus

    corpus_dir = Path(corpus_dir)
    if not (corpus_dir / "corpus.jsonl").is_file():
        raise ValueError(f"corpus: {corpus_dir} is not a BEIR-format folder (no corpus.jsonl)")
    data = load_corpus(corpus_dir)
    if len(set(data.doc_ids)) != len(data.doc_ids):
        seen: set[str] = set()
        twice = next(x for x in data.doc_ids if x in seen or seen.add(x))  # type: ignore[func-returns-value]
        raise ValueError(f"corpus: {corpus_dir}/corpus.jsonl holds the id {twice!r} twice")
    return data


#: request texts are padded to their token count (special tokens included) rounded up to a
#: multiple of this, capped at the model's ``max_seq_length``; one forward per bucket
BUCKET_TOKENS = 16
#: request texts whose tokens :class:`TextEncoder` keeps between the batch loop's count
#: (:meth:`TextEncoder.padded_tokens`) and the encoding (most recently used kept)
TOKEN_CACHE_SIZE = 4096
#: the largest token cut :meth:`TextEncoder.truncate` asks the tokenizer for (a 32-bit integer:
#: a request's texts are a few MB, so they never have that many tokens)
TOKENIZER_MAX_LENGTH = 2**31 - 2


def bucket_length(tokens: int, max_length: int) -> int:
    """The padded length of a text of ``tokens`` tokens: a multiple of :data:`BUCKET_TOKENS`, at most ``max_length``.

    Example:
        >>> bucket_length(3, 256), bucket_length(16, 256), bucket_length(17, 256), bucket_length(250, 256)
        (16, 16, 32, 256)
    """
    return min(max_length, -(-tokens // BUCKET_TOKENS) * BUCKET_TOKENS)


class TextEncoder:
    """Query and passage texts to unit vectors, with the e5/bge-style prefixes of the config.

    Args:
        model: a local sentence-transformers directory, or ``None`` for the default model.
        query_prefix: prepended to query texts (e.g. ``"query: "``).
        passage_prefix: prepended to corpus passages and candidate texts (e.g. ``"passage: "``).
        cache: the on-disk cache root for the corpus (``None`` = ``$GEOGRAPH_CACHE``).
        memory: size of the in-memory LRU for request texts (0 = none).
        device: where the encoder runs.
        group: pad request texts to their bucket and encode each bucket together (on the CPU,
            with one thread: a vector is bitwise the same whatever its batch-mates); ``False``:
            one at a time, unpadded.
        max_chars: request texts (queries and candidates, prefix excluded) are cut to this many
            characters before they are tokenized (then to the model's ``max_seq_length`` tokens), so
            a text of megabytes costs what one of ``max_chars`` does; ``None``: no cut.
        backend: the encoder's runtime (:mod:`geograph.data.backends`: ``torch``, ``onnx``, ``onnx-int8``).

    :attr:`timings` adds up the seconds spent tokenizing (``tokenise``) and in the model's forward
    (``encode``) since the caller last reset it (the server's per-request breakdown).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        query_prefix: str = "",
        passage_prefix: str = "",
        cache: str | None = None,
        memory: int = 4096,
        device: str | None = None,
        group: bool = True,
        max_chars: int | None = None,
        backend: str = "torch",
    ) -> None:
        from geograph.data.cache import Encoder, MemoryCache

        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        # the prefixes are recorded in the corpus encoder's identity
        self.corpus_encoder = Encoder(
            model,
            cache=cache,
            progress=False,
            device=device,
            backend=backend,
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
        )
        self.request_encoder = Encoder(
            model, cache=MemoryCache(memory), batch_size=1, progress=False, device=device, backend=backend
        )
        self.group = group
        self.max_chars = max_chars
        self.timings = {"tokenise": 0.0, "encode": 0.0}
        self._tokens: OrderedDict[str, dict[str, list[int]]] = OrderedDict()

    def agreement(self, backend: str) -> float:
        """:meth:`geograph.data.Encoder.agreement` of the corpus encoder (an artefact built with
        another backend is accepted when the two agree, :func:`geograph.artefacts.check_encoder`)."""
        return self.corpus_encoder.agreement(backend)

    def tokens(self, texts: Sequence[str]) -> dict[str, dict[str, list[int]]]:
        """The tokenizer's output (lists, cut to ``max_seq_length``) of each distinct text of
        ``texts``, kept for :data:`TOKEN_CACHE_SIZE` texts: a text counted by
        :meth:`padded_tokens` in the batch loop is not tokenized again to be encoded."""
        out: dict[str, dict[str, list[int]]] = {}
        todo: list[str] = []
        for t in dict.fromkeys(texts):
            row = self._tokens.get(t)
            if row is None:
                todo.append(t)
            else:
                self._tokens.move_to_end(t)
                out[t] = row
        if todo:
            start = time.perf_counter()
            model = self._shared().model
            enc = model.tokenizer(todo, truncation=True, max_length=model.max_seq_length)
            names = list(enc.keys())
            for j, t in enumerate(todo):
                out[t] = self._tokens[t] = {name: enc[name][j] for name in names}
            while len(self._tokens) > TOKEN_CACHE_SIZE:
                self._tokens.popitem(last=False)
            self.timings["tokenise"] += time.perf_counter() - start
        return out

    def padded_tokens(self, texts: Sequence[str]) -> int:
        """Tokens the encoding of ``texts`` runs over: each distinct text's token count rounded up to
        its bucket (:func:`bucket_length`), what ``max_batch_tokens`` bounds."""
        if not texts:
            return 0
        limit = self._shared().model.max_seq_length
        assert limit is not None  # a loaded model has its max_seq_length (typed as optional upstream)
        return sum(bucket_length(len(row["input_ids"]), limit) for row in self.tokens(texts).values())

    def request_texts(self, query: str | None, candidates: Sequence[str] | None, max_tokens: int | None) -> list[str]:
        """The texts a request has encoded, prefixes included, as :meth:`queries` and
        :meth:`passages` encode them (``candidates`` cut by :meth:`truncate` to ``max_tokens``)."""
        out = [] if query is None else [self.query_prefix + t for t in self.cap([query])]
        if candidates:
            out += [self.passage_prefix + t for t in self.cap(self.truncate(candidates, max_tokens))]
        return out

    @property
    def identity(self) -> EncoderIdentity:
        """The :class:`~geograph.artefacts.EncoderIdentity` (model files hashed, prefixes) that saved
        artefacts are checked against."""
        return self.corpus_encoder.identity

    def corpus(self, passages: Sequence[str]) -> torch.Tensor:
        """``(V, D)`` float32 unit rows of the corpus, through the on-disk cache (whose vectors are not
        kept in memory afterwards: the corpus is read once, and a worker holds only the result)."""
        out = self.corpus_encoder.encode([self.passage_prefix + p for p in passages])
        if hasattr(self.corpus_encoder.cache, "forget"):
            self.corpus_encoder.cache.forget()  # type: ignore[union-attr]  # it has one (hasattr)
        return out

    def warm(self) -> None:
        """Load the model and run one forward, so the first request does not pay for it."""
        model = self._shared().model
        if self.grouped():
            with one_thread():
                encode_padded(model, ["warm up"], BUCKET_TOKENS)
        else:
            model.encode(["warm up"], batch_size=1)

    def _shared(self) -> Encoder:
        if self.request_encoder._model is None:  # one model in memory for both
            self.request_encoder._model = self.corpus_encoder.model
        return self.request_encoder

    def truncate(self, texts: Sequence[str], max_tokens: int | None) -> list[str]:
        """``texts`` each cut after its first ``max_tokens`` tokens (``None``: only the character cap).

        The cut is made in the text, at the end of the last kept token (the tokenizer's
        character offsets, no special tokens, no prefix), so the truncated text is embedded
        and cached like any other. The encoder's own limit (``max_seq_length``) still applies.
        Texts are first cut to ``max_chars`` characters, and tokenized no further than
        ``max_tokens + 1`` tokens. Any positive ``max_tokens`` is taken: one beyond
        :data:`TOKENIZER_MAX_LENGTH` (more tokens than any accepted text has) cuts nothing.
        """
        texts = self.cap(texts)
        if max_tokens is None:
            return texts
        tok = self._shared().model.tokenizer
        # the tokenizer holds max_length in a machine integer (OverflowError above it)
        length = min(max_tokens, TOKENIZER_MAX_LENGTH) + 1
        enc = tok(texts, add_special_tokens=False, return_offsets_mapping=True, truncation=True, max_length=length)
        return [
            t if len(offsets) <= max_tokens else t[: offsets[max_tokens - 1][1]]
            for t, offsets in zip(texts, enc["offset_mapping"])
        ]

    def cap(self, texts: Sequence[str]) -> list[str]:
        """``texts`` each cut to its first ``max_chars`` characters (``None``: unchanged)."""
        n = self.max_chars
        return list(texts) if n is None else [t if len(t) <= n else t[:n] for t in texts]

    def queries(self, texts: Sequence[str]) -> torch.Tensor:
        """``(B, D)`` query vectors (texts cut to ``max_chars``); in memory only."""
        return self.encode_requests([self.query_prefix + t for t in self.cap(texts)])

    def passages(self, texts: Sequence[str]) -> torch.Tensor:
        """``(N, D)`` candidate-text vectors (texts cut to ``max_chars``); in memory only."""
        return self.encode_requests([self.passage_prefix + t for t in self.cap(texts)])

    def grouped(self) -> bool:
        """Whether request texts are encoded in padded buckets (``group`` and a CPU model)."""
        return self.group and self._shared().model.device.type == "cpu"

    def encode_requests(self, texts: Sequence[str]) -> torch.Tensor:
        """``(N, D)`` float32 unit vectors of ``texts`` (prefixes included), each a function of its
        text alone; through the in-memory LRU, never the disk.

        Missing texts are padded to their bucket (:func:`bucket_length`) and each bucket is one
        forward with one intra-op thread (:func:`one_thread`); without grouping (:meth:`grouped`
        is False) they are encoded one at a time, unpadded.
        """
        import numpy as np
        import torch

        texts = list(texts)
        if not texts:
            raise ValueError("texts is empty")
        enc = self._shared()
        if not self.grouped():
            start = time.perf_counter()
            out = enc.encode(texts)
            self.timings["encode"] += time.perf_counter() - start
            return out
        cache = enc.cache
        assert cache is not None  # the request encoder has its MemoryCache
        found, missing = cache.get(texts)
        todo = list(dict.fromkeys(texts[i] for i in missing))  # a text repeated in a batch is encoded once
        if todo:
            model = enc.model
            limit = model.max_seq_length
            assert limit is not None  # a loaded model has its max_seq_length
            # tokenized once (or already, by the batch loop's count): the lengths pick the buckets,
            # the same tokens are then padded
            tokens = self.tokens(todo)
            start = time.perf_counter()
            buckets: dict[int, list[str]] = {}
            for t in todo:
                buckets.setdefault(bucket_length(len(tokens[t]["input_ids"]), limit), []).append(t)
            vectors: dict[str, np.ndarray] = {}
            with one_thread():
                for length, group in buckets.items():
                    part = {name: [tokens[t][name] for t in group] for name in tokens[group[0]]}
                    vectors.update(zip(group, encode_padded(model, group, length, tokens=part)))
            self.timings["encode"] += time.perf_counter() - start
            cache.put(todo, np.stack([vectors[t] for t in todo]))
            for i in missing:
                found[i] = vectors[texts[i]]
        return torch.from_numpy(np.stack(cast("list[np.ndarray]", found)))  # every position is filled now


def encode_padded(
    model: SentenceTransformer, texts: Sequence[str], length: int, *, tokens: dict[str, list[list[int]]] | None = None
) -> np.ndarray:
    """``(len(texts), D)`` float32 unit vectors of a sentence-transformers ``model``, every text
    padded (or truncated) to ``length`` tokens: the model's own forward and pooling, then L2
    normalisation as ``encode(..., normalize_embeddings=True)`` does. ``tokens``: the texts
    already tokenized (the tokenizer's lists, at most ``length`` long), padded here instead
    of tokenizing the texts again."""
    import torch

    if tokens is None:
        features = model.tokenizer(
            list(texts), padding="max_length", truncation=True, max_length=length, return_tensors="pt"
        )
    else:
        features = model.tokenizer.pad(tokens, padding="max_length", max_length=length, return_tensors="pt")
    features = {name: x.to(model.device) for name, x in features.items()}
    with torch.inference_mode():
        out = model(features)["sentence_embedding"]
    return torch.nn.functional.normalize(out.float(), p=2, dim=1).cpu().numpy()


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run the body with one torch intra-op thread (restored after).

    With several threads a matrix product's split over the threads depends on its number of
    rows, so a text's vector would depend on the size of its group.
    """
    import torch

    before = torch.get_num_threads()
    if before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if before != 1:
            torch.set_num_threads(before)
