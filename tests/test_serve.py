"""``geograph serve`` over loopback: answers equal the modules' direct output, batching under load, 4xx."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytest.importorskip("litserve")
requests = pytest.importorskip("requests")

from geograph import Maniscope, RicciFiltration  # noqa: E402
from geograph.data import DEMO_PATH, Encoder, load_demo  # noqa: E402
from geograph.retrievers import DenseRetriever  # noqa: E402

TEXT_QUERIES = ["a cat sleeping on a sofa", "volcanic eruptions and lava", "how vaccines train the immune system",
                "taking photos at night", "stock market crash"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def corpus():
    data = load_demo()
    enc = Encoder(progress=False)
    emb = enc.encode(data.passages())
    enc.encode(TEXT_QUERIES)  # into the cache: the server's encoder then reads the same vectors
    return data, emb, enc


def start(method, *extra):
    port = free_port()
    cmd = [sys.executable, "-m", "geograph", "serve", "--method", method, "--corpus", str(DEMO_PATH),
           "--port", str(port), "--accelerator", "cpu", *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stdout.read().decode()[-3000:]}")
        try:
            if requests.get(url + "/health", timeout=2).text == "ok":
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(0.5)
    stop(proc)
    raise RuntimeError("server did not become healthy in 180 s")


def stop(proc):
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def maniscope_server(corpus):
    proc, url = start("maniscope", "--max-batch-size", "16", "--batch-timeout", "0.05", "--candidates", "12")
    yield url
    stop(proc)


def expected_retrieve(emb, q, k, m=12):
    top = DenseRetriever(emb)(q[None], m)
    out = Maniscope()(q[None], emb[top.indices])
    return top.indices[0][out.order[0]][:k].tolist(), out.scores[0][out.order[0]][:k].tolist()


def expected_rerank(model, q, docs):
    out = model(q[None], docs[None])
    order = [j for j in out.order[0].tolist() if bool(out.keep[0, j])]
    return order, [float(out.scores[0, j]) for j in order]


def test_health_retrieve_and_rerank_equal_the_module(maniscope_server, corpus):
    data, emb, enc = corpus
    url = maniscope_server
    assert requests.get(url + "/health").text == "ok"
    q = enc.encode(TEXT_QUERIES)
    for i, text in enumerate(TEXT_QUERIES):
        r = requests.post(url + "/retrieve", json={"query": text, "k": 5})
        assert r.status_code == 200, r.text
        ids, scores = expected_retrieve(emb, q[i], 5)
        assert r.json()["ids"] == [data.doc_ids[j] for j in ids]
        assert r.json()["scores"] == pytest.approx(scores, abs=1e-5)
    cand = [3, 0, 17, 25, 8, 30, 11]
    want = expected_rerank(Maniscope(), q[0], emb[cand])
    by_ids = requests.post(url + "/rerank", json={"query": TEXT_QUERIES[0], "candidate_ids": [data.doc_ids[j] for j in cand]})
    by_emb = requests.post(url + "/rerank", json={"query_embedding": q[0].tolist(), "candidate_embeddings": emb[cand].tolist()})
    by_text = requests.post(url + "/rerank", json={"query": TEXT_QUERIES[0],
                                                   "candidates": [data.passages()[j] for j in cand]})
    for r in (by_ids, by_emb, by_text):
        assert r.status_code == 200, r.text
        assert r.json()["order"] == want[0] and r.json()["dropped"] == []
        assert r.json()["scores"] == pytest.approx(want[1], abs=1e-5)


def test_load_500_requests_16_clients_all_correct_and_batched(maniscope_server, corpus):
    data, emb, _ = corpus
    url = maniscope_server
    g = torch.Generator().manual_seed(0)
    queries = torch.nn.functional.normalize(emb[torch.randint(len(emb), (20,), generator=g)]
                                            + 0.3 * torch.randn(20, emb.shape[1], generator=g), dim=1)
    cands = [torch.randperm(len(emb), generator=g)[: 5 + i % 10].tolist() for i in range(20)]
    want_retrieve = [expected_retrieve(emb, q, 5)[0] for q in queries]
    want_rerank = [expected_rerank(Maniscope(), q, emb[c])[0] for q, c in zip(queries, cands)]
    session = requests.Session()

    def one(i):
        j = i % 20
        if i % 2:
            r = session.post(url + "/retrieve", json={"query_embedding": queries[j].tolist(), "k": 5}, timeout=60)
            ok = r.status_code == 200 and r.json()["ids"] == [data.doc_ids[x] for x in want_retrieve[j]]
        else:
            r = session.post(url + "/rerank", json={"query_embedding": queries[j].tolist(),
                                                    "candidate_ids": [data.doc_ids[x] for x in cands[j]]}, timeout=60)
            ok = r.status_code == 200 and r.json()["order"] == want_rerank[j]
        return ok, r.json().get("batch_size", 0) if r.status_code == 200 else 0

    t = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(500), timeout=240))
    seconds = time.perf_counter() - t
    assert all(ok for ok, _ in results), f"{sum(not ok for ok, _ in results)} wrong answers"
    sizes = [b for _, b in results]
    assert max(sizes) > 1, "no batch was formed under load"
    print(f"\n500 requests, 16 clients: {500 / seconds:.0f} requests/s, mean batch {sum(sizes) / len(sizes):.1f}, "
          f"max batch {max(sizes)}")


@pytest.mark.parametrize("body, fragment", [
    (b"{not json", "JSON decode error"),
    (json.dumps({"query_embedding": [0.1, 0.2], "candidate_ids": ["photo-0"]}).encode(), "384 values"),
    (b'{"query_embedding": [' + b",".join([b"NaN"] * 384) + b'], "candidate_ids": ["photo-0"]}', "NaN"),
    (json.dumps({"query": "cats", "candidates": []}).encode(), "at least 1 item"),
    (json.dumps({"query": "cats", "candidate_ids": ["photo-0", "no-such-id"]}).encode(), "unknown candidate_ids"),
    (json.dumps({"query": "cats", "candidate_ids": ["photo-0"] * 1001}).encode(), "at most 1000"),
    (json.dumps({"query": "cats", "k": 5, "candidate_ids": ["photo-0"]}).encode(), "Extra inputs"),
    (json.dumps({"query": "cats", "query_embedding": [0.0] * 384, "candidate_ids": ["photo-0"]}).encode(), "exactly one"),
])
def test_bad_input_is_422_and_the_server_keeps_serving(maniscope_server, corpus, body, fragment):
    url = maniscope_server
    r = requests.post(url + "/rerank", data=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert fragment in r.text
    good = requests.post(url + "/retrieve", json={"query": TEXT_QUERIES[1], "k": 3})
    assert good.status_code == 200 and len(good.json()["ids"]) == 3


def test_oversized_payload_is_413(maniscope_server):
    r = requests.post(maniscope_server + "/rerank", data=b" " * (11 * 2**20), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert requests.get(maniscope_server + "/health").text == "ok"


def test_ricci_server_reports_dropped_candidates(corpus):
    data, emb, enc = corpus
    proc, url = start("ricci")
    try:
        q = enc.encode(TEXT_QUERIES[:1])[0]
        cand = list(range(0, 36, 2))
        r = requests.post(url + "/rerank", json={"query": TEXT_QUERIES[0], "candidate_ids": [data.doc_ids[j] for j in cand]})
        assert r.status_code == 200, r.text
        out = RicciFiltration()(q[None], emb[cand][None])
        assert r.json()["order"] == [j for j in out.order[0].tolist() if bool(out.keep[0, j])]
        assert r.json()["dropped"] == [j for j in range(len(cand)) if not bool(out.keep[0, j])]
        assert requests.post(url + "/retrieve", json={"query": TEXT_QUERIES[0], "k": 0}).status_code == 422
    finally:
        stop(proc)


@pytest.mark.parametrize("method", ["iso", "g3"])
def test_retriever_apis_equal_the_module_in_process(method, corpus):
    """The worker code path (setup + batched predict) for the corpus retrievers, without HTTP."""
    from geograph import serve

    data, emb, enc = corpus
    api = serve.RetrieveAPI("retrieve", method, str(DEMO_PATH))
    api.setup("cpu")
    q = enc.encode(TEXT_QUERIES)
    reqs = [serve.RetrieveRequest(query=t, k=3 + i % 3) for i, t in enumerate(TEXT_QUERIES)]
    got = api.predict(api.batch(reqs))
    model = serve.build_model(method, emb)
    for i, (req, res) in enumerate(zip(reqs, got)):
        out = model(q[i : i + 1], req.k)
        assert res["ids"] == [data.doc_ids[j] for j in out.indices[0].tolist()]
        assert res["scores"] == pytest.approx(out.scores[0].tolist(), abs=1e-5)
        assert res["batch_size"] == len(reqs)


@pytest.mark.parametrize("method", ["iso", "g3"])
def test_retriever_servers_over_http(method, corpus):
    from geograph import serve

    data, emb, enc = corpus
    proc, url = start(method)
    try:
        assert requests.post(url + "/rerank", json={"query": "x", "candidate_ids": ["photo-0"]}).status_code == 404
        model = serve.build_model(method, emb)
        q = enc.encode(TEXT_QUERIES)
        for i, text in enumerate(TEXT_QUERIES):
            r = requests.post(url + "/retrieve", json={"query": text, "k": 4})
            assert r.status_code == 200, r.text
            out = model(q[i : i + 1], 4)
            assert r.json()["ids"] == [data.doc_ids[j] for j in out.indices[0].tolist()]
            assert r.json()["scores"] == pytest.approx(out.scores[0].tolist(), abs=1e-5)
    finally:
        stop(proc)
