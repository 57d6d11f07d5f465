"""Requests that would buy unbounded work, against a live ``geograph serve``: an oversized pool,
a 2 MB document, a burst of the largest requests; each gets its one-line 4xx or a bounded
answer, and the server stays healthy and answers the next normal request.

One Maniscope server with ``--max-candidates 50 --max-batch-candidates 120``.
"""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch

from conftest import require

require("litserve")

from test_serve_http import EXTRA_TEXTS, Server, env, text_encoder  # noqa: E402,F401

from geograph import Maniscope  # noqa: E402

pytestmark = pytest.mark.integration

TOL = 1e-6
MAX, CELLS = 50, 120


@pytest.fixture(scope="module")
def server(env):
    s = Server(env, "maniscope", "--max-candidates", str(MAX), "--max-batch-candidates", str(CELLS))
    yield s
    s.kill()


def healthy(server):
    assert requests.get(server.url + "/health", timeout=30).text == "ok"
    r = requests.post(server.url + "/retrieve", json={"query": EXTRA_TEXTS[0], "k": 3}, timeout=120)
    assert r.status_code == 200 and len(r.json()["ids"]) == 3


def test_oversized_pools_and_lists_get_one_line_naming_the_flag(server, env):
    ids = env["data"].doc_ids
    for path, body, fragment in (
        ("/retrieve", {"query": "cats", "k": 5, "candidates": 100}, "candidates must be <= 50 (--max-candidates)"),
        ("/rerank", {"query": "cats", "candidate_ids": ids[:51]}, "at most 50 per request (--max-candidates)"),
        ("/rerank", {"query": "cats", "texts": ["a"] * 51}, "at most 50 per request (--max-candidates)"),
        ("/v2/rerank", {"query": "cats", "documents": ["a"] * 51}, "at most 50 per request (--max-candidates)"),
        ("/v1/rerank", {"query": "cats", "documents": ["a"] * 51}, "at most 50 per request (--max-candidates)"),
    ):
        r = requests.post(server.url + path, json=body, timeout=120)
        assert r.status_code == 422, (path, r.text[:300])
        text = r.json()["message"] if path.startswith("/v") else r.json()["detail"][0]["msg"]
        assert fragment in text and "\n" not in text, (path, text)
    healthy(server)


def test_a_2mb_document_is_answered_as_its_cut(server, text_encoder):
    """Its vector is its first max_text_chars characters' (then the encoder's max_seq_length
    tokens): the order equals the module's on the cut text, on every dialect."""
    words = "volcanic eruptions carry ash and lava over the valley while farmers watch the sky ".split()
    big = " ".join(words[i % len(words)] for i in range(400000))[: 2 * 2**20]
    docs = [big] + EXTRA_TEXTS
    query = "lava flows from a volcano"
    q = text_encoder.encode([query])
    res = Maniscope()(q, text_encoder.encode([big[:20000]] + EXTRA_TEXTS)[None])
    want = res.order[0].tolist()
    r = requests.post(server.url + "/rerank", json={"query": query, "candidates": docs}, timeout=300)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["order"] == want
    assert all(abs(a - float(res.scores[0, j])) <= TOL for a, j in zip(r.json()["scores"], want))
    tei = requests.post(server.url + "/rerank", json={"query": query, "texts": docs}, timeout=300).json()
    assert [x["index"] for x in tei] == want
    v2 = requests.post(server.url + "/v2/rerank", json={"query": query, "documents": docs}, timeout=300).json()
    assert [x["index"] for x in v2["results"]] == want
    healthy(server)


def test_a_burst_of_the_largest_requests_is_batched_within_the_cap(server, env, text_encoder):
    """48 concurrent requests of 40 candidates each: every answer is the module's, and no batch
    holds more than CELLS // 40 of them (the padded bound); then the server answers as before."""
    data, emb = env["data"], env["emb"]
    g = torch.Generator().manual_seed(5)
    calls = []
    for i in range(48):
        idx = torch.randperm(len(data.doc_ids), generator=g)[:40].tolist()
        calls.append((EXTRA_TEXTS[i % len(EXTRA_TEXTS)], idx))

    def one(call):
        query, idx = call
        body = {"query": query, "candidate_ids": [data.doc_ids[j] for j in idx]}
        r = requests.post(server.url + "/rerank", json=body, timeout=300)
        assert r.status_code == 200, r.text[:300]
        return r.json()

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, calls))
    assert max(a["batch_size"] for a in answers) <= CELLS // 40
    model = Maniscope()
    for (query, idx), a in zip(calls, answers):
        out = model(text_encoder.encode([query]), emb[idx][None])
        assert a["order"] == out.order[0].tolist(), query
    pools = [{"query": EXTRA_TEXTS[i % 5], "k": 5, "candidates": MAX} for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda b: requests.post(server.url + "/retrieve", json=b, timeout=300), pools))
    assert all(r.status_code == 200 for r in got), [r.text[:200] for r in got if r.status_code != 200]
    assert max(r.json()["batch_size"] for r in got) <= CELLS // MAX
    healthy(server)
    info = json.loads(requests.get(server.url + "/info", timeout=30).text)
    assert info["server"] == "geograph" and info["method"] == "maniscope"
    assert info["limits"]["max_candidates"] == MAX and info["limits"]["max_batch_candidates"] == CELLS
    assert {"/retrieve", "/rerank", "/v1/rerank", "/v2/rerank"} <= set(info["routes"])
