import contextlib
import io
import re

import numpy as np
import pytest

from geograph.cli import main
from geograph.commands.demo import pick_queries
from geograph.data import load_demo

pytest.importorskip("sentence_transformers")
pytest.importorskip("bm25s")

METHOD_ROWS = ("dense", "BM25", "Maniscope", "Ricci-Filtration", "Ricci -> Maniscope", "ISO-RAG", "G3RAG")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The demo twice on one empty cache: the first run embeds, the second reads the cache."""
    cache = tmp_path_factory.mktemp("cache")
    out = []
    for show in ("4", "2"):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(["demo", "--cache", str(cache), "--show", show]) == 0
        out.append(buf.getvalue())
    return cache, out


def table(text: str, label: str) -> dict[str, list[float]]:
    """Rows of the quality table titled ``label`` in the demo output."""
    block = text.split(f"{label}:")[1].split("\n\n")[0]
    rows = {}
    for line in block.splitlines()[3:]:
        name = next((m for m in sorted(METHOD_ROWS, key=len, reverse=True) if line.startswith(m + " ")), None)
        if name:
            rows[name] = [float(x) for x in line[len(name) :].split()]
    return rows


def test_cached_is_printed_only_when_nothing_is_embedded(runs):
    _, (first, second) = runs
    assert "embedding 153 of 153 texts" in first.splitlines()[0] and "(cached)" not in first
    assert "(cached)" in second.splitlines()[0] and "embedding 153" not in second


def test_every_method_is_shown_side_by_side(runs):
    _, (first, second) = runs
    blocks = re.findall(r"^Query (\S+) \(([\w-]+)\)", first, re.M)
    assert [part for _, part in blocks] == ["single-topic", "single-topic", "multi-hop", "multi-hop"]
    assert len(re.findall(r"^Query ", second, re.M)) == 2
    block = first.split("Query m01")[1].split("\nQuery ")[0]
    for label in (
        "dense top-5",
        "Maniscope",
        "Ricci-Filtration",
        "dropped (best by cosine):",
        "ISO-RAG",
        "G3RAG",
        "seeds:",
        "| diffused:",
        "Ricci -> Maniscope",
        "passages:",
    ):
        assert label in block, label
    # ISO-RAG reaches the bridge passage through the mention graph from the first hop
    iso_line = next(line for line in block.splitlines() if line.strip().startswith("ISO-RAG"))
    assert "hop-01b(via hop-01a)" in iso_line
    assert "hop-01b  Edda Marsh: Edda Marsh spent her childhood" in block


def test_quality_table_has_every_method_and_dense_matches_a_reference(runs):
    import pytrec_eval
    import torch

    from geograph.data import Encoder

    cache, (first, _) = runs
    rows = table(first, "all queries")
    assert set(rows) == set(METHOD_ROWS)
    assert all(len(v) == 5 and v[4] > 0 for v in rows.values())  # four metrics + ms/query
    # dense row recomputed independently: numpy cosine top-10, pytrec_eval nDCG@10 and recall@5
    data = load_demo()
    enc = Encoder(cache=str(cache))
    c = enc.encode(data.passages()).double().numpy()
    q = enc.encode(data.queries).double().numpy()
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    sim = q @ c.T
    run = {}
    for qi, qid in enumerate(data.query_ids):
        top = np.argsort(-sim[qi], kind="stable")[:10]
        run[qid] = {data.doc_ids[j]: float(10 - r) for r, j in enumerate(top)}
    ev = pytrec_eval.RelevanceEvaluator(data.qrels, {"ndcg_cut.10", "recall.5"})
    res = ev.evaluate(run)
    ndcg = np.mean([r["ndcg_cut_10"] for r in res.values()])
    recall = np.mean([r["recall_5"] for r in res.values()])
    assert rows["dense"][0] == pytest.approx(ndcg, abs=6e-4)
    assert rows["dense"][1] == pytest.approx(recall, abs=6e-4)
    assert torch.is_tensor(enc.encode(data.queries[:1]))


def test_graph_methods_find_the_second_hop(runs):
    _, (first, _) = runs
    hop = table(first, "multi-hop")
    single = table(first, "single-topic")
    assert set(hop) == set(METHOD_ROWS) and set(single) == set(METHOD_ROWS)
    # HitAll@5 (both passages of a bridge question in the top 5): dense misses many, ISO-RAG's
    # title-mention graph brings the second passage in
    assert hop["ISO-RAG"][2] > hop["dense"][2] + 0.3
    assert single["dense"][0] > 0.9  # the single-topic part stays easy for dense
    assert "Where each method differs from dense" in first
    for name in METHOD_ROWS[1:]:
        assert re.search(rf"^  {re.escape(name)}\s+top-5 differs on\s+\d+/42 queries", first, re.M), name


def test_pick_queries_spreads_over_parts():
    data = load_demo()
    picked = [data.query_ids[i] for i in pick_queries(data, 3)]
    assert picked == ["q1", "q2", "m01"]
    assert len(pick_queries(data, 100)) == 42
