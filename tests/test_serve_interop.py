"""``/v1/rerank`` and ``/v2/rerank`` of ``geograph serve`` driven by the real clients, and the API key.

One Ricci-Filtration server (it drops documents, so ``meta.dropped`` is exercised) with an API
key, on 127.0.0.1, for the whole module. Every client's order is compared with the module called
directly on the same candidates (embedded one text at a time, as the server does): the ``cohere``
SDK (``ClientV2`` on v2, ``Client`` on v1), ``langchain-cohere``'s ``CohereRerank``, LlamaIndex's
``CohereRerank`` postprocessor and ``cohere-haystack``'s ``CohereRanker``; and ``POST /rerank``
in text-embeddings-inference's dialect, driven by ``huggingface-api-haystack``'s
``HuggingFaceTEIRanker`` (Haystack's TEI ranker), whose answer leaves the dropped texts out.
"""

import json
import time

import pytest
import torch

from conftest import require

require("litserve")
requests = require("requests")
cohere = require("cohere")

from test_serve_http import EXTRA_TEXTS, Server, env, metric_values, settled_metrics, text_encoder, unit  # noqa: E402,F401

from geograph import RicciFiltration  # noqa: E402

pytestmark = pytest.mark.integration

KEY = "test-key-0123456789abcdef"
TOL = 1e-6


@pytest.fixture(scope="module")
def server(env):
    s = Server(env, "ricci", "--api-key", KEY, "--max-batch-size", "8", "--batch-timeout", "0.05")
    yield s
    s.kill()


@pytest.fixture(scope="module")
def case(env, text_encoder):
    """A query, 12 passages of the demo corpus, and the module's own answer on them."""
    data = env["data"]
    query = list(data.queries)[2]
    docs = data.passages()[:10] + EXTRA_TEXTS[:2]
    q, d = text_encoder.encode([query]), text_encoder.encode(docs)
    res = RicciFiltration()(q, d[None])
    order = [j for j in res.order[0].tolist() if bool(res.keep[0, j])]
    dropped = [j for j in range(len(docs)) if not bool(res.keep[0, j])]
    assert dropped and len(order) >= 3, "the case must keep some documents and drop some"
    return {
        "query": query,
        "docs": docs,
        "order": order,
        "dropped": dropped,
        "scores": [float(res.scores[0, j]) for j in order],
    }


def headers(key=KEY):
    return {"Authorization": f"Bearer {key}"}


def test_cohere_v2_client_order_scores_top_n_and_dropped(server, case):
    client = cohere.ClientV2(api_key=KEY, base_url=server.url)
    r = client.rerank(model="ricci", query=case["query"], documents=case["docs"])
    assert [x.index for x in r.results] == case["order"]
    assert r.meta.dropped == case["dropped"] and r.model == "ricci"
    for x, s in zip(r.results, case["scores"]):
        assert abs(x.score - s) <= TOL
        assert abs(x.relevance_score - (s + 1) / 2) <= TOL  # Ricci-Filtration: cosine [-1, 1] onto [0, 1]
    rel = [x.relevance_score for x in r.results]
    assert rel == sorted(rel, reverse=True) and all(0 <= v <= 1 for v in rel)
    top = client.rerank(model="ricci", query=case["query"], documents=case["docs"], top_n=2)
    assert [x.index for x in top.results] == case["order"][:2]
    for n in (0, 10**4):  # 0 and above the count: all
        assert [
            x.index for x in client.rerank(model="ricci", query=case["query"], documents=case["docs"], top_n=n).results
        ] == case["order"]
    # omitted model: the served one
    body = requests.post(
        server.url + "/v2/rerank",
        json={"query": case["query"], "documents": case["docs"], "top_n": None},
        headers=headers(),
        timeout=120,
    ).json()
    assert [x["index"] for x in body["results"]] == case["order"] and "document" not in body["results"][0]


def test_cohere_v1_client_objects_return_documents(server, case):
    client = cohere.Client(api_key=KEY, base_url=server.url)
    docs = [{"text": t} for t in case["docs"]]
    r = client.rerank(model="ricci", query=case["query"], documents=docs, return_documents=True, top_n=3)
    assert [x.index for x in r.results] == case["order"][:3]
    assert [x.document.text for x in r.results] == [case["docs"][j] for j in case["order"][:3]]
    plain = client.rerank(model="ricci", query=case["query"], documents=case["docs"])
    assert [x.index for x in plain.results] == case["order"] and plain.results[0].document is None
    # rank_fields: the named fields as "field: value" lines are what is embedded
    fielded = [{"title": "t", "body": t} for t in case["docs"]]
    r = requests.post(
        server.url + "/v1/rerank",
        json={
            "model": "ricci",
            "query": case["query"],
            "documents": fielded,
            "rank_fields": ["body"],
            "return_documents": True,
        },
        headers=headers(),
        timeout=120,
    ).json()
    assert r["results"][0]["document"] == fielded[r["results"][0]["index"]]


def test_extensions_through_additional_body_parameters(server, env):
    emb = env["emb"]
    g = torch.Generator().manual_seed(7)
    q = unit(emb[3] + 0.2 * torch.randn(emb.shape[1], generator=g))
    docs = unit(emb[:15] + 0.3 * torch.randn(15, emb.shape[1], generator=g))
    res = RicciFiltration()(q[None], docs[None])
    want = [j for j in res.order[0].tolist() if bool(res.keep[0, j])]
    client = cohere.ClientV2(api_key=KEY, base_url=server.url)
    r = client.rerank(
        model="ricci",
        query="ignored: query_embedding is used",
        documents=[f"d{i}" for i in range(15)],
        request_options={
            "additional_body_parameters": {"query_embedding": q.tolist(), "candidate_embeddings": docs.tolist()}
        },
    )
    assert [x.index for x in r.results] == want
    assert all(abs(x.score - float(res.scores[0, x.index])) <= TOL for x in r.results)


def test_max_tokens_per_doc_cuts_documents_by_tokens(server, text_encoder):
    docs = [
        "volcanic eruptions and lava flows",
        "a cat sleeping on a sofa",
        "stock market crash today",
        "the immune system learns",
    ]
    cut = [" ".join(t.split()[:2]) for t in docs]  # these words are one word piece each
    q = "cats and sofas"
    res = RicciFiltration()(text_encoder.encode([q]), text_encoder.encode(cut)[None])
    want = [j for j in res.order[0].tolist() if bool(res.keep[0, j])]
    client = cohere.ClientV2(api_key=KEY, base_url=server.url)
    r = client.rerank(model="ricci", query=q, documents=docs, max_tokens_per_doc=2)
    assert [x.index for x in r.results] == want
    assert all(abs(x.score - float(res.scores[0, x.index])) <= TOL for x in r.results)


def test_langchain_cohere_rerank(server, case):
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    rr = CohereRerank(model="ricci", cohere_api_key=KEY, base_url=server.url, top_n=3)
    docs = [Document(page_content=t, metadata={"i": i}) for i, t in enumerate(case["docs"])]
    got = rr.compress_documents(docs, case["query"])
    assert [d.metadata["i"] for d in got] == case["order"][:3]


def test_llamaindex_cohere_rerank(server, case):
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.postprocessor.cohere_rerank import CohereRerank

    pp = CohereRerank(model="ricci", api_key=KEY, base_url=server.url, top_n=4)
    nodes = [NodeWithScore(node=TextNode(text=t, id_=str(i)), score=0.0) for i, t in enumerate(case["docs"])]
    got = pp.postprocess_nodes(nodes, QueryBundle(case["query"]))
    assert [int(n.node.node_id) for n in got] == case["order"][:4]


def test_haystack_cohere_ranker(server, case):
    from haystack import Document
    from haystack.utils import Secret
    from haystack_integrations.components.rankers.cohere import CohereRanker

    ranker = CohereRanker(model="ricci", api_key=Secret.from_token(KEY), api_base_url=server.url, top_k=5)
    docs = [Document(content=t, meta={"i": i}) for i, t in enumerate(case["docs"])]
    got = ranker.run(query=case["query"], documents=docs)["documents"]
    assert [d.meta["i"] for d in got] == case["order"][:5]


def test_api_key_guards_every_endpoint_but_health(server, case):
    assert requests.get(server.url + "/health", timeout=30).text == "ok"
    body = {"model": "ricci", "query": case["query"], "documents": case["docs"][:3]}
    for path in ("/v2/rerank", "/v1/rerank", "/rerank", "/retrieve"):
        r = requests.post(server.url + path, json=body, timeout=30)
        assert r.status_code == 401 and "missing API key" in r.json()["message"], (path, r.text)
        r = requests.post(server.url + path, json=body, headers=headers("wrong"), timeout=30)
        assert r.status_code == 401 and r.json()["message"] == "invalid API key", (path, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
    for path in ("/metrics", "/docs", "/openapi.json", "/info"):
        assert requests.get(server.url + path, timeout=30).status_code == 401, path
        assert requests.get(server.url + path, headers={"Authorization": f"Basic {KEY}"}, timeout=30).status_code == 401
    assert requests.get(server.url + "/metrics", headers=headers(), timeout=30).status_code == 200
    from cohere.errors import UnauthorizedError  # cohere 5 loads its submodules lazily: import it by name

    with pytest.raises(UnauthorizedError):
        cohere.ClientV2(api_key="wrong", base_url=server.url).rerank(model="ricci", query="q", documents=["a"])
    r = requests.post(server.url + "/retrieve", json={"query": case["query"], "k": 3}, headers=headers(), timeout=120)
    assert r.status_code == 200


def _bad(dim, limit=1000):
    z, ok = [0.0] * dim, [0.1] * dim
    return [
        ("/v2/rerank", {"query": "q", "documents": []}, 422, "documents: List should have at least 1 item"),
        ("/v1/rerank", {"query": "q", "documents": ["a", {"text": "b"}]}, 422, "mixes strings and objects"),
        ("/v2/rerank", {"query": "q", "documents": [{"text": "b"}]}, 422, "must be strings on /v2/rerank"),
        (
            "/v2/rerank",
            {"model": "rerank-v3.5", "query": "q", "documents": ["a"]},
            404,
            "'rerank-v3.5' is not served here",
        ),
        (
            "/v2/rerank",
            {"query": "q", "documents": ["a"], "top_n": -1},
            422,
            "top_n: Input should be greater than or equal to 0",
        ),
        ("/v2/rerank", {"query": "", "documents": ["a"]}, 422, "query: String should have at least 1 character"),
        ("/v2/rerank", {"documents": ["a"]}, 422, "query: Field required"),
        ("/v2/rerank", {"query": "q", "documents": ["a", ""]}, 422, "documents[1] is empty"),
        ("/v1/rerank", {"query": "q", "documents": [{"title": "x"}]}, 422, "documents[0] is empty"),
        ("/v2/rerank", {"query": "q", "documents": ["a"] * (limit + 1)}, 422, f"documents has {limit + 1} entries"),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "k": 3}, 422, "k: unknown field"),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "max_tokens_per_doc": 0}, 422, "max_tokens_per_doc"),
        (
            "/v2/rerank",
            {"query": "q", "documents": ["a"], "query_embedding": [0.1, 0.2]},
            422,
            f"query_embedding must have {dim} values",
        ),
        (
            "/v2/rerank",
            {"query": "q", "documents": ["a"], "query_embedding": z},
            422,
            "query_embedding is the zero vector",
        ),
        (
            "/v2/rerank",
            {"query": "q", "documents": ["a", "b"], "candidate_embeddings": [ok]},
            422,
            "candidate_embeddings has 1 rows",
        ),
        (
            "/v2/rerank",
            {"query": "q", "documents": ["a"], "candidate_embeddings": [z]},
            422,
            "candidate_embeddings[0] is the zero vector",
        ),
        (
            "/v1/rerank",
            {"query": "q", "documents": ["a"], "rank_fields": ["text"]},
            422,
            "rank_fields applies to documents given as objects",
        ),
    ]


def test_bad_requests_get_a_status_and_a_message(server, env):
    dim = env["emb"].shape[1]
    for path, body, status, fragment in _bad(dim):
        r = requests.post(server.url + path, json=body, headers=headers(), timeout=120)
        assert r.status_code == status and fragment in r.json()["message"], (
            path,
            json.dumps(body)[:200],
            r.status_code,
            r.text[:300],
        )
    nan = b'{"query": "q", "documents": ["a"], "query_embedding": [' + b",".join([b"NaN"] * dim) + b"]}"
    raw = [
        (nan, "application/json", 422, "query_embedding contains NaN"),
        (b"{not json", "application/json", 422, "body: not valid JSON"),
        (b"[1]", "application/json", 422, "expected a JSON object"),
        (b"{}", "text/plain", 415, "content-type must be application/json"),
        (b" " * (11 * 2**20), "application/json", 413, "Payload too large"),
    ]
    for data, ctype, status, fragment in raw:
        r = requests.post(
            server.url + "/v2/rerank", data=data, headers={**headers(), "content-type": ctype}, timeout=120
        )
        assert r.status_code == status and fragment in r.json()["message"], (data[:60], r.status_code, r.text[:300])
    good = requests.post(
        server.url + "/v2/rerank", json={"query": "q", "documents": ["a", "b"]}, headers=headers(), timeout=120
    )
    assert good.status_code == 200


def test_concurrent_requests_answer_as_alone_and_are_counted(server, env, text_encoder):
    """Same per-request semantics and batching as /rerank: mixed v1/v2 requests, concurrently and alone."""
    import requests as rq

    data, emb = env["data"], env["emb"]
    passages = data.passages()
    g = torch.Generator().manual_seed(3)
    calls = []
    for i in range(16):
        n = 2 + i % 9
        idx = torch.randperm(len(passages), generator=g)[:n].tolist()
        body = {"query": EXTRA_TEXTS[i % 5], "documents": [passages[j] for j in idx]}
        if i % 3 == 0:
            body["candidate_embeddings"] = emb[idx].tolist()
        calls.append(("/v2/rerank" if i % 2 else "/v1/rerank", body))
    before = settled_metrics(server.url, headers())
    session = rq.Session()
    session.headers.update(headers())
    together = fire_auth(server.url, calls)
    alone = [session.post(server.url + p, json=b, timeout=120).json() for p, b in calls]
    for (p, b), t, a in zip(calls, together, alone):
        assert [x["index"] for x in t["results"]] == [x["index"] for x in a["results"]], (p, b["query"])
        assert all(abs(x["score"] - y["score"]) <= TOL for x, y in zip(t["results"], a["results"]))
        assert t["meta"]["dropped"] == a["meta"]["dropped"]
        q = text_encoder.encode([b["query"]])
        d = (
            torch.tensor(b["candidate_embeddings"])
            if "candidate_embeddings" in b
            else text_encoder.encode(b["documents"])
        )
        res = RicciFiltration()(q, d[None])
        assert [x["index"] for x in t["results"]] == [j for j in res.order[0].tolist() if bool(res.keep[0, j])]
    assert max(t["meta"]["batch_size"] for t in together) > 1, "no batch of more than one request was formed"
    deadline = time.monotonic() + 30
    while True:
        after = metric_values(server.url, headers())
        got = {
            p: after.get(("geograph_requests_total", (("endpoint", p), ("status", "200"))), 0)
            - before.get(("geograph_requests_total", (("endpoint", p), ("status", "200"))), 0)
            for p in ("/v1/rerank", "/v2/rerank")
        }
        if got == {"/v1/rerank": 16, "/v2/rerank": 16} or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert got == {"/v1/rerank": 16, "/v2/rerank": 16}  # each request sent twice


def fire_auth(url, calls):
    from concurrent.futures import ThreadPoolExecutor

    def one(call):
        r = requests.post(url + call[0], json=call[1], headers=headers(), timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    with ThreadPoolExecutor(12) as pool:
        return list(pool.map(one, calls))


# -- the TEI dialect on /rerank ---------------------------------------------------------------
@pytest.fixture(scope="module")
def tei_case(env, text_encoder):
    """A query, 12 passages of the demo corpus, and the module's own answer on them."""
    data = env["data"]
    query = list(data.queries)[4]
    docs = data.passages()[10:20] + EXTRA_TEXTS[2:4]
    res = RicciFiltration()(text_encoder.encode([query]), text_encoder.encode(docs)[None])
    order = [j for j in res.order[0].tolist() if bool(res.keep[0, j])]
    assert len(order) < len(docs) and len(order) >= 3, "the case must keep some texts and drop some"
    return {"query": query, "docs": docs, "order": order, "scores": [float(res.scores[0, j]) for j in order]}


def post_rerank(server, body):
    return requests.post(server.url + "/rerank", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)


def test_haystack_tei_ranker(server, tei_case):
    require("haystack")
    tei = require("haystack_integrations.components.rankers.huggingface_api")
    from haystack import Document
    from haystack.utils import Secret

    docs = [Document(content=t, meta={"i": i}) for i, t in enumerate(tei_case["docs"])]
    ranker = tei.HuggingFaceTEIRanker(url=server.url, top_k=5, token=Secret.from_token(KEY))
    got = ranker.run(query=tei_case["query"], documents=docs)["documents"]
    assert [d.meta["i"] for d in got] == tei_case["order"][:5]
    for d, s in zip(got, tei_case["scores"]):
        assert abs(d.score - (s + 1) / 2) <= TOL  # Ricci-Filtration: cosine [-1, 1] onto [0, 1]
    raw = tei.HuggingFaceTEIRanker(url=server.url, top_k=20, raw_scores=True, token=Secret.from_token(KEY))
    got = raw.run(query=tei_case["query"], documents=docs, truncation_direction=tei.TruncationDirection.RIGHT)
    assert [d.meta["i"] for d in got["documents"]] == tei_case["order"]  # the dropped texts are left out
    assert all(abs(d.score - s) <= TOL for d, s in zip(got["documents"], tei_case["scores"]))
    with pytest.raises(RuntimeError, match="truncation_direction: Left is not supported"):
        ranker.run(query=tei_case["query"], documents=docs, truncation_direction=tei.TruncationDirection.LEFT)
    wrong = tei.HuggingFaceTEIRanker(url=server.url, token=Secret.from_token("wrong"), max_retries=1)
    with pytest.raises(RuntimeError, match="401"):
        wrong.run(query=tei_case["query"], documents=docs)


def test_tei_answer_shape_and_the_native_dialect_on_one_path(server, tei_case):
    r = post_rerank(
        server, {"query": tei_case["query"], "texts": tei_case["docs"], "return_text": True, "truncate": False}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body, list) and [x["index"] for x in body] == tei_case["order"]
    assert all(set(x) == {"index", "score", "text"} and x["text"] == tei_case["docs"][x["index"]] for x in body)
    scores = [x["score"] for x in body]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    plain = post_rerank(server, {"query": tei_case["query"], "texts": tei_case["docs"]}).json()
    assert all(set(x) == {"index", "score"} for x in plain)
    native = post_rerank(server, {"query": tei_case["query"], "candidates": tei_case["docs"]}).json()
    assert native["order"] == tei_case["order"]
    assert set(native) == {"order", "scores", "dropped", "batch_size", "version"}
    assert sorted(native["dropped"] + native["order"]) == list(range(len(tei_case["docs"])))
    for bad, fragment in (
        ({"query": tei_case["query"], "texts": []}, "texts"),
        ({"query": tei_case["query"], "texts": ["a"], "top_n": 1}, "Extra inputs"),
        ({"query": tei_case["query"], "candidates": ["a"], "raw_scores": True}, "Extra inputs"),
    ):
        r = post_rerank(server, bad)
        assert r.status_code == 422 and fragment in r.text, (bad, r.text[:300])
    assert post_rerank(server, {"query": "cats", "texts": ["a cat on a sofa", "lava"]}).status_code == 200
