"""``POST /rerank`` in text-embeddings-inference's dialect, driven by a real TEI client.

One Ricci-Filtration server (it drops texts, which TEI's answer leaves out) with an API key.
The client is ``huggingface-api-haystack``'s ``HuggingFaceTEIRanker`` (Haystack's TEI ranker);
its order and scores are compared with the module called directly on the same texts (embedded
one at a time, as the server does). A body with ``candidates`` still gets geograph's answer.
"""

import pytest
import requests

from conftest import require

require("litserve")
require("haystack")

from test_serve_http import EXTRA_TEXTS, Server, env, text_encoder  # noqa: E402,F401

from geograph import RicciFiltration  # noqa: E402

pytestmark = pytest.mark.integration

KEY = "tei-key-0123456789abcdef"
TOL = 1e-6


@pytest.fixture(scope="module")
def server(env):
    s = Server(env, "ricci", "--api-key", KEY, "--max-batch-size", "8")
    yield s
    s.kill()


@pytest.fixture(scope="module")
def case(env, text_encoder):
    """A query, 12 passages of the demo corpus, and the module's own answer on them."""
    data = env["data"]
    query = list(data.queries)[4]
    docs = data.passages()[10:20] + EXTRA_TEXTS[2:4]
    res = RicciFiltration()(text_encoder.encode([query]), text_encoder.encode(docs)[None])
    order = [j for j in res.order[0].tolist() if bool(res.keep[0, j])]
    assert len(order) < len(docs) and len(order) >= 3, "the case must keep some texts and drop some"
    return {"query": query, "docs": docs, "order": order, "scores": [float(res.scores[0, j]) for j in order]}


def post(server, body):
    return requests.post(server.url + "/rerank", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)


def test_haystack_tei_ranker(server, case):
    tei = require("haystack_integrations.components.rankers.huggingface_api")
    from haystack import Document
    from haystack.utils import Secret

    docs = [Document(content=t, meta={"i": i}) for i, t in enumerate(case["docs"])]
    ranker = tei.HuggingFaceTEIRanker(url=server.url, top_k=5, token=Secret.from_token(KEY))
    got = ranker.run(query=case["query"], documents=docs)["documents"]
    assert [d.meta["i"] for d in got] == case["order"][:5]
    for d, s in zip(got, case["scores"]):
        assert abs(d.score - (s + 1) / 2) <= TOL  # Ricci-Filtration: cosine [-1, 1] onto [0, 1]
    raw = tei.HuggingFaceTEIRanker(url=server.url, top_k=20, raw_scores=True, token=Secret.from_token(KEY))
    got = raw.run(query=case["query"], documents=docs, truncation_direction=tei.TruncationDirection.RIGHT)
    assert [d.meta["i"] for d in got["documents"]] == case["order"]  # the dropped texts are left out
    assert all(abs(d.score - s) <= TOL for d, s in zip(got["documents"], case["scores"]))
    with pytest.raises(RuntimeError, match="truncation_direction: Left is not supported"):
        ranker.run(query=case["query"], documents=docs, truncation_direction=tei.TruncationDirection.LEFT)
    wrong = tei.HuggingFaceTEIRanker(url=server.url, token=Secret.from_token("wrong"), max_retries=1)
    with pytest.raises(RuntimeError, match="401"):
        wrong.run(query=case["query"], documents=docs)


def test_tei_answer_shape_and_the_native_dialect_on_one_path(server, case):
    r = post(server, {"query": case["query"], "texts": case["docs"], "return_text": True, "truncate": False})
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body, list) and [x["index"] for x in body] == case["order"]
    assert all(set(x) == {"index", "score", "text"} and x["text"] == case["docs"][x["index"]] for x in body)
    scores = [x["score"] for x in body]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    plain = post(server, {"query": case["query"], "texts": case["docs"]}).json()
    assert all(set(x) == {"index", "score"} for x in plain)
    native = post(server, {"query": case["query"], "candidates": case["docs"]}).json()
    assert native["order"] == case["order"] and set(native) == {"order", "scores", "dropped", "batch_size", "version"}
    assert sorted(native["dropped"] + native["order"]) == list(range(len(case["docs"])))
    for bad, fragment in (
        ({"query": case["query"], "texts": []}, "texts"),
        ({"query": case["query"], "texts": ["a"], "top_n": 1}, "Extra inputs"),
        ({"query": case["query"], "candidates": ["a"], "raw_scores": True}, "Extra inputs"),
    ):
        r = post(server, bad)
        assert r.status_code == 422 and fragment in r.text, (bad, r.text[:300])
    assert post(server, {"query": "cats", "texts": ["a cat on a sofa", "lava"]}).status_code == 200
