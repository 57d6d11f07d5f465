"""``geograph serve`` over real HTTP on 127.0.0.1, every method.

* property: hundreds of concurrent random requests (k, pools, query and candidate forms,
  endpoints) per method; each answer equals the same request sent alone (ids exactly, scores
  within 1e-6) and the module called directly on that request alone; once more with
  ``--workers-per-device 2 --api-servers 2``;
* bounded load: 1000 requests from 32 clients, 0 wrong answers, 0 5xx (req/s, p50/p99 printed);
* bad input: a 4xx naming the field, then the next good request is answered;
* ``/metrics``: exact counter deltas for a known burst;
* lifecycle: every server is stopped with SIGTERM to its main process or SIGINT to its process
  group (a terminal's Ctrl-C); no process of its tree remains, the port is closed, the exit
  status is 0 and the output holds no traceback and no leaked-semaphore warning;
* the on-disk embedding cache (pre-warmed with the demo corpus) gains no file.
"""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import require

require("litserve")
requests = require("requests")
psutil = require("psutil")
require("prometheus_client")

# every test here talks to a `geograph serve` subprocess
pytestmark = pytest.mark.integration

from geograph import CorpusGraph, G3Retriever, ISORetriever, Maniscope, RicciFiltration  # noqa: E402
from geograph.bench.serve.process import wait_healthy  # noqa: E402
from geograph.data import DEMO_PATH, Encoder, load_demo  # noqa: E402
from geograph.retrievers import DenseRetriever  # noqa: E402
from geograph.serve.pool import worker_threads  # noqa: E402

TOL = 1e-6
EXTRA_TEXTS = [
    "a cat sleeping on a sofa",
    "volcanic eruptions and lava",
    "how vaccines train the immune system",
    "taking photos at night",
    "stock market crash",
]


# -- fixtures and helpers ---------------------------------------------------------------------
def snapshot(path):
    return sorted((str(p.relative_to(path)), p.stat().st_size) for p in path.rglob("*"))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A cache directory pre-warmed with the demo corpus, and the servers' environment."""
    cache = tmp_path_factory.mktemp("geograph-cache")
    data = load_demo()
    corpus_emb = Encoder(cache=str(cache), progress=False).encode(data.passages())
    before = snapshot(cache)
    yield {
        "cache": cache,
        "before": before,
        "data": data,
        "emb": corpus_emb,
        "env": {**os.environ, "HF_HUB_OFFLINE": "1", "GEOGRAPH_CACHE": str(cache), "TOKENIZERS_PARALLELISM": "false"},
    }


@pytest.fixture(scope="module")
def text_encoder():
    """Each request text alone (padded to its bucket, one torch thread): the vector the server gives
    it in any group (geograph.serve.corpus; tests/test_serve_encoding.py checks that bit for bit
    against a reference computed from the raw model)."""
    from geograph.serve.corpus import TextEncoder

    enc = TextEncoder(None, memory=0)
    memo = {}

    class Memo:  # each distinct text encoded once here too (the server keeps them in its LRU)
        @staticmethod
        def encode(texts):
            for t in texts:
                if t not in memo:
                    memo[t] = enc.encode_requests([t])[0]
            return torch.stack([memo[t] for t in texts])

    return Memo()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, env, method, *extra):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "geograph",
            "serve",
            "--method",
            method,
            "--corpus",
            str(DEMO_PATH),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--accelerator",
            "cpu",
            "--timeout",
            "300",
            *extra,
        ]  # a generous queue timeout: 2 CPU cores shared with other jobs
        if "--workers-per-device" not in extra:  # one worker: quicker to start (auto is tested below)
            cmd += ["--workers-per-device", "1"]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env["env"], start_new_session=True
        )
        self.log = []
        self.reader = threading.Thread(target=lambda: self.log.extend(self.proc.stdout), daemon=True)
        self.reader.start()
        try:
            wait_healthy(self.url, self.proc, 300, self.output)
        except RuntimeError:
            self.kill()
            raise

    def output(self):
        return b"".join(self.log).decode(errors="replace")[-4000:]

    def tree(self):
        main = psutil.Process(self.proc.pid)
        return [main, *main.children(recursive=True)]

    def stop(self, sig=signal.SIGTERM, group=False):
        """Signal the main process (or its whole process group, as a terminal's Ctrl-C does);
        seconds until the whole tree is gone and the port closed."""
        procs = self.tree()
        assert len(procs) >= 4, [p.cmdline() for p in procs]  # main, manager, worker(s), API server(s)
        t = time.monotonic()
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            os.kill(self.proc.pid, sig)
        self.proc.wait(timeout=60)
        _, alive = psutil.wait_procs(procs, timeout=10)
        seconds = time.monotonic() - t
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"still running after {sig.name}: {[(p.pid, p.cmdline()) for p in alive]}"
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", self.port)) != 0, "the port still accepts connections"
        assert self.proc.returncode == 0, self.output()
        self.reader.join(timeout=10)  # the output up to the last process's exit (the resource tracker's)
        log = b"".join(self.log).decode(errors="replace")
        assert "Traceback" not in log and "leaked semaphore" not in log, f"a clean stop printed:\n{log[-4000:]}"
        return seconds

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for_lines(server, fragment, n, seconds=10):
    """The server's output lines holding ``fragment`` once there are ``n`` (the output is read
    by a thread: a line written before /health said ok may still be in the pipe)."""
    deadline = time.monotonic() + seconds
    while True:
        lines = [x for x in b"".join(server.log).decode(errors="replace").splitlines() if fragment in x]
        if len(lines) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def post(session, url, body, timeout=120):
    r = session.post(url, json=body, timeout=timeout)
    return r.status_code, (r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text)


def fire(url, calls, clients=32):
    """Send ``calls`` [(endpoint, body)] from ``clients`` threads; [(status, json, seconds)]."""
    local = threading.local()

    def one(call):
        if not hasattr(local, "s"):
            local.s = requests.Session()
        t = time.perf_counter()
        status, body = post(local.s, url + call[0], call[1])
        return status, body, time.perf_counter() - t

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(one, calls))


def unit(x):
    return torch.nn.functional.normalize(x, dim=-1)


# -- random requests and their direct answers ------------------------------------------------
class Requests:
    """Random requests for one method and, for each, the module's answer on that request alone."""

    def __init__(self, env, text_encoder, method, seed):
        self.data, self.emb, self.enc = env["data"], env["emb"], text_encoder
        self.method, self.rng = method, random.Random(seed)
        self.v = len(self.data.doc_ids)
        self.texts = list(self.data.queries) + EXTRA_TEXTS
        self.rng.shuffle(self.texts)
        self.texts = self.texts[:12]  # a bounded set of distinct texts: each is encoded once per worker
        self.passages = self.data.passages()
        self.text_passages = self.rng.sample(range(self.v), min(16, self.v))
        g = torch.Generator().manual_seed(seed)
        self.vectors = unit(
            self.emb[torch.randint(self.v, (40,), generator=g)] + 0.3 * torch.randn(40, self.emb.shape[1], generator=g)
        )
        self.model = {"maniscope": Maniscope, "ricci": RicciFiltration}.get(method, lambda: None)()
        if method == "iso":
            self.model = ISORetriever(CorpusGraph.from_knn(self.emb, min(10, self.v - 1)))
        if method == "g3":
            self.model = G3Retriever(self.emb)

    def query(self):
        if self.rng.random() < 0.35:
            t = self.rng.choice(self.texts)
            return {"query": t}, self.enc.encode([t])[0]
        q = self.vectors[self.rng.randrange(len(self.vectors))]
        return {"query_embedding": q.tolist()}, q

    def make(self, n, max_pool):
        out = []
        for _ in range(n):
            body, q = self.query()
            if self.method in ("maniscope", "ricci") and self.rng.random() < 0.5:
                out.append(self.rerank(body, q, max_pool))
            else:
                out.append(self.retrieve(body, q, max_pool))
        return out

    def retrieve(self, body, q, max_pool):
        if self.method in ("maniscope", "ricci"):
            pool = self.rng.randint(1, min(max_pool, self.v))
            body.update(k=self.rng.randint(1, pool))
            if pool != 20 or self.rng.random() < 0.5:
                body["candidates"] = pool
            top = DenseRetriever(self.emb)(q[None], pool).indices[0]
            res = self.model(q[None], self.emb[top][None])
            kept = [int(top[j]) for j in res.order[0].tolist() if bool(res.keep[0, j])]
            want = {
                "ids": [self.data.doc_ids[j] for j in kept[: body["k"]]],
                "scores": [float(res.scores[0, j]) for j in res.order[0].tolist() if bool(res.keep[0, j])][: body["k"]],
                "dropped": [
                    self.data.doc_ids[int(top[j])]
                    for j in sorted(range(pool), key=lambda j: int(top[j]))
                    if not bool(res.keep[0, j])
                ],
            }
        else:
            lo = self.model.seeds if self.method == "g3" else 1
            hi = self.model.max_k if self.method == "iso" else self.v
            body.update(k=self.rng.randint(lo, min(hi, 30)))
            res = self.model(q[None], body["k"])
            want = {
                "ids": [self.data.doc_ids[j] for j in res.indices[0].tolist()],
                "scores": res.scores[0].tolist(),
                "dropped": [],
            }
        return "/retrieve", body, want

    def rerank(self, body, q, max_pool):
        n = self.rng.randint(1, min(max_pool, self.v))
        form = self.rng.choice(["ids", "embeddings", "texts"])
        if form == "texts":
            n = min(n, len(self.text_passages))
            idx = self.rng.sample(self.text_passages, n)
            body["candidates"] = [self.passages[j] for j in idx]
            docs = self.enc.encode(body["candidates"])
        else:
            idx = self.rng.sample(range(self.v), n)
            if form == "ids":
                body["candidate_ids"] = [self.data.doc_ids[j] for j in idx]
                docs = self.emb[idx]
            else:
                docs = unit(self.emb[idx] + 0.2 * torch.randn(n, self.emb.shape[1]))
                body["candidate_embeddings"] = docs.tolist()
        if self.rng.random() < 0.3:
            body["top_n"] = self.rng.randint(1, n)
        res = self.model(q[None], docs[None])
        order = [j for j in res.order[0].tolist() if bool(res.keep[0, j])][: body.get("top_n", n)]
        want = {
            "order": order,
            "scores": [float(res.scores[0, j]) for j in order],
            "dropped": [j for j in range(n) if not bool(res.keep[0, j])],
        }
        return "/rerank", body, want


def same(got, want, where):
    keys = ("ids", "dropped") if "ids" in want else ("order", "dropped")
    for key in keys:
        assert got[key] == want[key], f"{where}: {key} {got[key]} != {want[key]}"
    assert len(got["scores"]) == len(want["scores"]), where
    assert all(abs(a - b) <= TOL for a, b in zip(got["scores"], want["scores"])), (
        f"{where}: scores {got['scores']} != {want['scores']}"
    )


def check_property(server, reqs, n, max_pool, seed_note):
    calls = reqs.make(n, max_pool)
    together = fire(server.url, [(e, b) for e, b, _ in calls])
    session = requests.Session()
    alone = [post(session, server.url + e, b) for e, b, _ in calls]
    sizes = []
    for i, ((endpoint, body, want), (s1, got1, _), (s2, got2)) in enumerate(zip(calls, together, alone)):
        where = f"{seed_note} request {i} {endpoint} {json.dumps(body)[:200]}"
        assert s1 == 200 and s2 == 200, f"{where}: {s1} {got1} / {s2} {got2}"
        assert got2["batch_size"] == 1
        same(got1, got2, where + " (concurrent vs alone)")
        same(got1, want, where + " (server vs module)")
        assert all(isinstance(x, float) and x == x and abs(x) != float("inf") for x in got1["scores"])
        sizes.append(got1["batch_size"])
    assert max(sizes) > 1, "no batch of more than one request was formed"
    return sizes


# -- the tests -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def maniscope(env):
    server = Server(env, "maniscope", "--max-batch-size", "16", "--batch-timeout", "0.02")
    yield server
    server.kill()


def test_maniscope_property_and_module_parity(maniscope, env, text_encoder):
    sizes = check_property(maniscope, Requests(env, text_encoder, "maniscope", seed=1), 120, 30, "maniscope")
    print(f"\nmaniscope: 120 requests, mean batch {sum(sizes) / len(sizes):.1f}, max {max(sizes)}")


def test_load_1000_requests_32_clients(maniscope, env, text_encoder):
    reqs = Requests(env, text_encoder, "maniscope", seed=2)
    distinct = reqs.make(200, 30)
    calls = [distinct[i % len(distinct)] for i in range(1000)]
    t = time.perf_counter()
    got = fire(maniscope.url, [(e, b) for e, b, _ in calls], clients=32)
    seconds = time.perf_counter() - t
    five = sum(s >= 500 for s, _, _ in got)
    wrong = 0
    for (_, _, want), (_, body, _) in zip(calls, got):
        try:
            same(body, want, "load")
        except (AssertionError, TypeError, KeyError):
            wrong += 1
    lat = sorted(x for _, _, x in got)
    assert five == 0 and wrong == 0, f"{five} 5xx, {wrong} wrong answers of 1000"
    print(
        f"\nload: 1000 requests, 32 clients: {1000 / seconds:.0f} req/s, p50 {1000 * lat[500]:.0f} ms, "
        f"p99 {1000 * lat[989]:.0f} ms, mean batch {sum(b['batch_size'] for _, b, _ in got) / 1000:.1f} "
        "(2 shared CPU cores, other jobs running)"
    )


def _bad_cases(dim, first_id):
    nan = b'{"query_embedding": [' + b",".join([b"NaN"] * dim) + b'], "candidate_ids": ["' + first_id.encode() + b'"]}'
    return [
        ("/rerank", b"{not json", "application/json", 422, "JSON decode error"),
        (
            "/rerank",
            json.dumps({"query_embedding": [0.1, 0.2], "candidate_ids": [first_id]}).encode(),
            None,
            422,
            "query_embedding must have",
        ),
        ("/rerank", nan, None, 422, "query_embedding contains NaN"),
        ("/rerank", json.dumps({"query": "cats", "candidates": []}).encode(), None, 422, "candidates"),
        (
            "/rerank",
            json.dumps({"query": "cats", "candidate_ids": [first_id, "no-such-id"]}).encode(),
            None,
            422,
            "unknown candidate_ids",
        ),
        (
            "/rerank",
            json.dumps({"query": "cats", "candidate_ids": [first_id] * 1001}).encode(),
            None,
            422,
            "candidate_ids has 1001 entries",
        ),
        (
            "/rerank",
            json.dumps({"query": "cats", "k": 5, "candidate_ids": [first_id]}).encode(),
            None,
            422,
            "Extra inputs",
        ),
        (
            "/rerank",
            json.dumps({"query": "cats", "query_embedding": [0.5] * dim, "candidate_ids": [first_id]}).encode(),
            None,
            422,
            "exactly one of query",
        ),
        (
            "/rerank",
            json.dumps({"query_embedding": [0.0] * dim, "candidate_ids": [first_id]}).encode(),
            None,
            422,
            "query_embedding is the zero vector",
        ),
        (
            "/rerank",
            json.dumps({"query": "cats", "candidate_embeddings": [[0.0] * dim]}).encode(),
            None,
            422,
            "candidate_embeddings[0] is the zero vector",
        ),
        (
            "/rerank",
            json.dumps({"query": "cats", "candidate_ids": [first_id], "top_n": 2}).encode(),
            None,
            422,
            "top_n (2)",
        ),
        ("/retrieve", json.dumps({"query": "cats", "k": 0}).encode(), None, 422, "k"),
        ("/retrieve", json.dumps({"query": "cats", "k": 21}).encode(), None, 422, "k (21) must be <= candidates (20)"),
        (
            "/retrieve",
            json.dumps({"query": "cats", "k": 5, "candidates": 10**6}).encode(),
            None,
            422,
            "candidates must be <=",
        ),
        (
            "/retrieve",
            json.dumps({"query": "cats", "k": 5}).encode(),
            "text/plain",
            415,
            "content-type must be application/json",
        ),
        ("/retrieve", b"query=cats&k=5", "application/x-www-form-urlencoded", 415, "content-type"),
        ("/rerank", b" " * (20 * 2**20), "application/json", 413, "Payload too large"),
    ]


def test_bad_input_is_4xx_naming_the_field_and_the_server_keeps_serving(maniscope, env):
    data, emb = env["data"], env["emb"]
    for path, body, ctype, status, fragment in _bad_cases(emb.shape[1], data.doc_ids[0]):
        r = requests.post(
            maniscope.url + path, data=body, headers={"content-type": ctype or "application/json"}, timeout=120
        )
        assert r.status_code == status, (path, body[:100], r.status_code, r.text[:500])
        assert fragment in r.text, (fragment, r.text[:500])
        good = requests.post(maniscope.url + "/retrieve", json={"query": EXTRA_TEXTS[1], "k": 3}, timeout=120)
        assert good.status_code == 200 and len(good.json()["ids"]) == 3


def metric_values(url, headers=None):
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(requests.get(url + "/metrics", headers=headers, timeout=30).text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def settled_metrics(url, headers=None):
    """``/metrics`` once every request answered before the call is counted.

    The server counts a finished request through one first-in first-out queue, so a request to a
    path without a route (``endpoint="other"``) sent now is counted after all of them: wait for
    its count to move. Reading ``/metrics`` right away could miss an earlier test's last requests
    (the queue trails the answers, by seconds on a loaded machine).
    """
    before = metric_values(url, headers)
    status = requests.get(url + "/no-route-settles-the-metrics", headers=headers, timeout=30).status_code
    key = ("geograph_requests_total", (("endpoint", "other"), ("status", str(status))))
    deadline = time.monotonic() + 30
    while True:
        now = metric_values(url, headers)
        if now.get(key, 0.0) > before.get(key, 0.0):
            return now
        assert time.monotonic() < deadline, "the server's metrics did not count a request within 30 s"
        time.sleep(0.1)


def test_metrics_count_requests_errors_latency_and_batches(maniscope, env):
    emb = env["emb"]

    def deltas(before, after, name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    before = settled_metrics(maniscope.url)
    good = [("/retrieve", {"query_embedding": unit(emb[i] + 0.1).tolist(), "k": 3}) for i in range(12)]
    bad = [("/rerank", {"query": "x"})] * 5
    got = fire(maniscope.url, good + bad, clients=8)
    assert [s for s, _, _ in got] == [200] * 12 + [422] * 5
    r = requests.post(maniscope.url + "/retrieve", data=b"{}", headers={"content-type": "text/plain"})
    assert r.status_code == 415
    want = {
        ("geograph_requests_total", "/retrieve", "200"): 12,
        ("geograph_requests_total", "/rerank", "422"): 5,
        ("geograph_request_errors_total", "/rerank", "422"): 5,
        ("geograph_requests_total", "/retrieve", "415"): 1,
        ("geograph_request_errors_total", "/retrieve", "415"): 1,
    }
    deadline = time.monotonic() + 30
    while True:
        after = metric_values(maniscope.url)
        have = {k: deltas(before, after, k[0], endpoint=k[1], status=k[2]) for k in want}
        lat = deltas(before, after, "geograph_request_latency_seconds_count", endpoint="/retrieve")
        batched = deltas(before, after, "geograph_batch_size_sum", endpoint="/retrieve")
        if (have == want and lat == 13 and batched == 12) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert have == want
    assert lat == 13  # 12 answered + the 415
    assert batched == 12  # the batch sizes of the /retrieve batches add up to the requests that reached a worker
    assert 1 <= deltas(before, after, "geograph_batch_size_count", endpoint="/retrieve") <= 12


def test_cohere_v2_rerank_on_maniscope(maniscope, env, text_encoder):
    """/v2/rerank answers in Maniscope's order; relevance_score = (score + alpha) / (1 + alpha)."""
    passages = env["data"].passages()
    docs = [passages[j] for j in (0, 3, 5, 8, 13, 21)] + EXTRA_TEXTS[:2]
    query = EXTRA_TEXTS[2]
    res = Maniscope()(text_encoder.encode([query]), text_encoder.encode(docs)[None])
    order = res.order[0].tolist()
    r = requests.post(
        maniscope.url + "/v2/rerank",
        json={"model": "maniscope", "query": query, "documents": docs, "top_n": 5},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert [x["index"] for x in body["results"]] == order[:5] and body["meta"]["dropped"] == []
    for x in body["results"]:
        s = float(res.scores[0, x["index"]])
        assert abs(x["score"] - s) <= TOL and abs(x["relevance_score"] - (s + 0.3) / 1.3) <= TOL


def test_maniscope_sigint_stops_every_process(maniscope):
    seconds = maniscope.stop(signal.SIGINT, group=True)
    print(f"\nSIGINT: process tree gone in {seconds:.1f} s")
    assert seconds < 20


@pytest.mark.parametrize("method, n, max_pool", [("ricci", 48, 10), ("iso", 80, 30), ("g3", 80, 30)])
def test_property_every_method_and_sigterm(env, text_encoder, method, n, max_pool):
    pool = ["--workers-per-device", "2"] if method == "ricci" else []
    server = Server(env, method, "--max-batch-size", "16", "--batch-timeout", "0.02", *pool)
    try:
        if method == "ricci":  # healthy implies every worker of the pool compiled or loaded the numba kernels
            warmed = wait_for_lines(server, "numba kernels ready in", 2)
            pids = {p.pid for p in psutil.Process(server.proc.pid).children() if "spawn_main" in " ".join(p.cmdline())}
            assert len({int(x.split("(pid ")[1].split(")")[0]) for x in warmed} & pids) == 2, warmed
            # starting numba's threads left each worker's torch at its share of the cores
            threads = worker_threads("auto", 2)
            assert all(f"; torch {threads} threads)" in x for x in warmed), warmed
        sizes = check_property(server, Requests(env, text_encoder, method, seed=3), n, max_pool, method)
        print(f"\n{method}: {n} requests, mean batch {sum(sizes) / len(sizes):.1f}, max {max(sizes)}")
        data, emb = env["data"], env["emb"]
        q = unit(emb[0] + 0.1).tolist()
        if method == "g3":
            r = requests.post(server.url + "/retrieve", json={"query_embedding": q, "k": 1})
            assert r.status_code == 422 and "k (1) must be >= 2" in r.text
            r = requests.post(server.url + "/retrieve", json={"query_embedding": q, "k": len(data.doc_ids) + 1})
            assert r.status_code == 422 and "corpus size" in r.text
        if method == "iso":
            r = requests.post(server.url + "/retrieve", json={"query_embedding": q, "k": 10**3})
            assert r.status_code == 422 and "local set size" in r.text
        if method != "ricci":
            r = requests.post(server.url + "/rerank", json={"query_embedding": q, "candidate_ids": [data.doc_ids[0]]})
            assert r.status_code == 404
            r = requests.post(server.url + "/retrieve", json={"query_embedding": q, "k": 3, "candidates": 5})
            assert r.status_code == 422 and "candidates applies to maniscope and ricci" in r.text
        assert requests.post(server.url + "/retrieve", json={"query_embedding": q, "k": 3}).status_code == 200
        seconds = server.stop(signal.SIGTERM)
        print(f"SIGTERM: process tree gone in {seconds:.1f} s")
        assert seconds < 120, "the server did not stop after SIGTERM"  # a hang guard, not a timing check
    finally:
        server.kill()


def test_scale_out_property_and_sigterm_with_requests_in_flight(env, text_encoder):
    server = Server(
        env,
        "maniscope",
        "--workers-per-device",
        "2",
        "--api-servers",
        "2",
        "--max-batch-size",
        "8",
        "--batch-timeout",
        "0.02",
    )
    try:
        assert len(server.tree()) >= 7  # main, manager, logger, 2 API servers, 2 x 2 workers
        check_property(server, Requests(env, text_encoder, "maniscope", seed=4), 120, 30, "scale-out")
        # in-flight requests when SIGTERM arrives: each gets an answer or an error, none hangs
        reqs = Requests(env, text_encoder, "maniscope", seed=5).make(64, 30)
        results = []
        t = threading.Thread(target=lambda: results.extend(_fire_tolerant(server.url, reqs)))
        t.start()
        time.sleep(0.3)
        seconds = server.stop(signal.SIGTERM)
        t.join(timeout=60)
        assert not t.is_alive() and len(results) == 64
        for (_, _, want), (status, body) in zip(reqs, results):
            assert status in (200, 503, None), (status, body, server.output())  # None: refused or closed
            if status == 200:
                same(body, want, "in flight")
        print(
            f"\nscale-out SIGTERM with requests in flight: tree gone in {seconds:.1f} s; "
            f"{sum(s == 200 for s, _ in results)} of 64 answered, "
            f"the rest {sorted({s for s, _ in results} - {200}, key=str)}"
        )
        assert seconds < 120, "the server did not stop after SIGTERM"  # a hang guard, not a timing check
    finally:
        server.kill()


def _fire_tolerant(url, calls, timeout=30):
    def one(call):
        try:
            r = requests.post(url + call[0], json=call[1], timeout=timeout)
            return r.status_code, (r.json() if r.status_code == 200 else r.text)
        except requests.RequestException:
            return None, None

    with ThreadPoolExecutor(32) as pool:
        return list(pool.map(one, calls))


@pytest.mark.slow
@pytest.mark.integration
def test_hung_worker_gets_504_and_a_killed_worker_stops_the_server_with_status_1(env):
    """request_timeout: requests to stopped (SIGSTOP) workers get 504 at their deadline, and the
    workers answer again once resumed; then SIGKILL of one of the pool's two workers under load:
    every in-flight request ends with a status (none hangs), /health stops saying ok, the server
    exits with status 1 naming the worker, and no process remains."""
    deadline = 3.0
    server = Server(
        env, "maniscope", "--request-timeout", str(deadline), "--shutdown-timeout", "3", "--workers-per-device", "2"
    )
    try:
        q = unit(env["emb"][0] + 0.1).tolist()
        ids = env["data"].doc_ids[:5]
        retrieve, rerank = (
            ("/retrieve", {"query_embedding": q, "k": 3}),
            ("/rerank", {"query_embedding": q, "candidate_ids": ids}),
        )
        assert [s for s, _ in _fire_tolerant(server.url, [retrieve, rerank])] == [200, 200]
        main = psutil.Process(server.proc.pid)
        workers = [p for p in main.children() if "spawn_main" in " ".join(p.cmdline())]
        assert len(workers) >= 3, [p.cmdline() for p in workers]  # logger, two inference workers
        # LitServe starts the logger, then the inference workers
        pool = sorted(workers, key=lambda p: p.create_time())[1:3]
        for p in pool:
            p.suspend()
        t = time.monotonic()
        got = _fire_tolerant(server.url, [retrieve] * 4 + [rerank] * 4, timeout=60)
        seconds = time.monotonic() - t
        assert [s for s, _ in got] == [504] * 8, (got, server.output())
        assert "request_timeout (3 s)" in got[0][1]
        assert seconds < deadline + 5, seconds  # a hang guard: the deadline, not the client's 60 s
        for p in pool:
            p.resume()
        assert [s for s, _ in _fire_tolerant(server.url, [retrieve, rerank])] == [200, 200]
        victim = pool[0]
        # under load: kill one worker while requests to both endpoints are in flight
        results = []
        t = time.monotonic()
        load = threading.Thread(
            target=lambda: results.extend(_fire_tolerant(server.url, [retrieve, rerank] * 16, timeout=60))
        )
        load.start()
        time.sleep(0.5)
        victim.kill()
        health = []
        while server.proc.poll() is None and time.monotonic() - t < 60:
            try:
                health.append(requests.get(server.url + "/health", timeout=2).text)
            except requests.RequestException:
                health.append(None)
            time.sleep(0.2)
        load.join(timeout=60)
        assert not load.is_alive() and len(results) == 32
        assert server.proc.wait(timeout=60) == 1, server.output()
        statuses = [s for s, _ in results]
        assert all(s in (200, 503, 504) for s in statuses), (statuses, server.output())  # none hung or was cut
        assert health and health[-1] != "ok", health
        assert "inference worker infer_0" in server.output() and "died (signal SIGKILL)" in server.output()
        alive = [p for p in [main, *workers] if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        psutil.wait_procs(alive, timeout=10)
        assert not [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        print(
            f"\nworker killed under load: exit 1 after {time.monotonic() - t:.1f} s; in flight: "
            f"{ {s: statuses.count(s) for s in set(statuses)} }; /health {health[:1]} -> {health[-1:]}"
        )
    finally:
        server.kill()


def test_cache_directory_gained_no_files(env):
    """Runs last: every server above answered text queries and candidate texts."""
    assert snapshot(env["cache"]) == env["before"]
