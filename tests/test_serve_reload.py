"""``POST /admin/reload`` on a live ``geograph serve`` (ISO-RAG over a saved k-NN graph, 2 workers).

Requests stream from 6 clients while the corpus folder changes, ``geograph update`` replaces the
graph and the server reloads: every answer is a 200 that equals, ids exactly and scores within
1e-6, what the module computes in this process on the version the answer reports; every request
sent after the reload's answer reports the new version. A reload of a graph that no longer
matches the corpus is one 409 line, and the server goes on serving the version it had.
"""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

from conftest import require

require("litserve")
requests = require("requests")

pytestmark = pytest.mark.integration

from geograph.bench.serve.process import wait_healthy  # noqa: E402
from geograph.cli import main  # noqa: E402
from geograph.data import Encoder, load_demo  # noqa: E402
from geograph.serve.models import build_model  # noqa: E402

KEY = "reload-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TOL = 1e-6


def write_corpus(path, records):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)  # the server never reads half a file


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Version:
    """A corpus version as the test computes it: its ids and the module built from a copy of its graph."""

    def __init__(self, records, graph_dir, cache):
        self.ids = [r["_id"] for r in records]
        enc = Encoder(cache=cache, progress=False)
        emb = enc.encode([f"{r['title']} {r['text']}".strip() for r in records])
        self.model = build_model("iso", emb, {}, graph=str(graph_dir), ids=self.ids, encoder=enc.identity)
        self.memo = {}

    def answer(self, i, q, k):
        if i not in self.memo:
            out = self.model(q[None], k)
            self.memo[i] = ([self.ids[j] for j in out.indices[0].tolist()], out.scores[0].tolist())
        return self.memo[i]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("reload")
    data = load_demo()

    def rec(i, suffix=""):
        return {"_id": data.doc_ids[i], "title": data.titles[i], "text": data.texts[i] + suffix}

    old = [rec(i) for i in range(60)]
    new = [rec(i, " Revised." if i == 9 else "") for i in range(60) if i not in (3, 41)]
    new.insert(5, new.pop(30))
    new += [rec(i) for i in range(60, 65)]
    cache = str(root / "cache")
    Encoder(cache=cache, progress=False).encode([f"{r['title']} {r['text']}".strip() for r in old + new])
    corpus = root / "corpus"
    corpus.mkdir()
    write_corpus(corpus / "corpus.jsonl", old)
    graph = root / "graph"
    assert main(["build-graph", "--data", str(corpus), "--knn", "5", "--out", str(graph), "--cache", cache]) == 0
    shutil.copytree(graph, root / "graph-v0")
    return {"root": root, "old": old, "new": new, "cache": cache, "corpus": corpus, "graph": graph}


class Load:
    """Clients that send random /retrieve requests until stopped, noting when each was sent and answered."""

    def __init__(self, url, queries, clients=6):
        self.url, self.queries, self.results = url, queries, []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(c,)) for c in range(clients)]
        for t in self.threads:
            t.start()

    def run(self, c):
        s, rng = requests.Session(), random.Random(c)
        while not self.stop.is_set():
            i = rng.randrange(len(self.queries))
            q, k = self.queries[i]
            sent = time.monotonic()
            r = s.post(self.url + "/retrieve", json={"query_embedding": q.tolist(), "k": k}, headers=AUTH, timeout=120)
            self.results.append((i, sent, time.monotonic(), r.status_code, r.json()))

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=180)
        return self.results


def test_reload_under_load_switches_every_worker_between_batches(setup):
    root, cache = setup["root"], setup["cache"]
    v0 = Version(setup["old"], root / "graph-v0", cache)
    g = torch.Generator().manual_seed(0)
    emb = v0.model.graph.embeddings
    qs = torch.nn.functional.normalize(
        emb[torch.randint(len(emb), (80,), generator=g)] + 0.3 * torch.randn(80, emb.shape[1], generator=g), dim=1
    )
    ks = torch.randint(1, 11, (80,), generator=g).tolist()
    queries = list(zip(qs, ks))

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "geograph", "serve", "--method", "iso", "--corpus", str(setup["corpus"])]
    cmd += ["--graph", str(setup["graph"]), "--host", "127.0.0.1", "--port", str(port), "--accelerator", "cpu"]
    cmd += ["--workers-per-device", "2", "--max-batch-size", "8", "--batch-timeout", "0.01", "--timeout", "300"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GEOGRAPH_CACHE": cache, "GEOGRAPH_API_KEY": KEY}
    env["TOKENIZERS_PARALLELISM"] = "false"
    log = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    reader = threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True)
    reader.start()

    def output():
        return b"".join(log).decode(errors="replace")[-4000:]

    try:
        wait_healthy(url, proc, 300, output)
        assert requests.post(url + "/admin/reload", timeout=30).status_code == 401  # behind the key

        load = Load(url, queries)
        time.sleep(1.0)
        write_corpus(setup["corpus"] / "corpus.jsonl", setup["new"])  # the corpus changes ...
        assert main(["update", "--data", str(setup["corpus"]), "--graph", str(setup["graph"]), "--cache", cache]) == 0
        shutil.copytree(setup["graph"], root / "graph-v1")  # ... and its graph is updated
        time.sleep(0.5)
        r = requests.post(url + "/admin/reload", headers=AUTH, timeout=600)
        done = time.monotonic()
        assert r.status_code == 200, (r.text, output())
        answer = r.json()
        assert answer["version"] == 1 and answer["corpus_version"] == 2 and answer["passages"] == len(setup["new"])
        corpus = requests.get(url + "/info", headers=AUTH, timeout=30).json()["corpus"]  # what GET /info says now
        assert (corpus["version"], corpus["corpus_version"], corpus["passages"]) == (1, 2, len(setup["new"]))
        time.sleep(1.5)
        results = load.finish()
        v1 = Version(setup["new"], root / "graph-v1", cache)

        versions = {0: v0, 1: v1}
        seen = {0: 0, 1: 0}
        for i, sent, _, status, body in results:
            assert status == 200, (status, body, output())
            v = body["version"]
            seen[v] += 1
            if sent > done:
                assert v == 1, f"a request sent after the reload's answer was computed on version {v}"
            ids, scores = versions[v].answer(i, *queries[i])
            assert body["ids"] == ids, (v, body["ids"], ids)
            assert all(abs(a - b) <= TOL for a, b in zip(body["scores"], scores)), (body["scores"], scores)
        after = sum(sent > done for _, sent, _, _, _ in results)
        assert seen[0] > 10 and seen[1] > 10 and after > 10, (seen, after)

        # a graph that is not the corpus's any more: refused, and version 1 keeps serving
        shutil.rmtree(setup["graph"])
        shutil.copytree(root / "graph-v0", setup["graph"])
        r = requests.post(url + "/admin/reload", headers=AUTH, timeout=600)
        assert r.status_code == 409, r.text
        detail = r.json()["detail"]
        assert "\n" not in detail and "graph:" in detail and "corpus" in detail and "version 1 keeps serving" in detail
        for i in range(5):
            q, k = queries[i]
            body = requests.post(url + "/retrieve", json={"query_embedding": q.tolist(), "k": k}, headers=AUTH).json()
            assert body["version"] == 1 and body["ids"] == v1.answer(i, q, k)[0]
        print(f"\nreload under load: {seen[0]} answers on version 0, {seen[1]} on 1 ({after} sent after), {answer}")

        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, output()
        reader.join(timeout=10)  # the output up to the last process's exit (the resource tracker's)
        assert "Traceback" not in output() and "leaked semaphore" not in output(), output()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_server_without_a_key_has_no_reload_route(setup, monkeypatch):
    from geograph.serve.config import load_config
    from geograph.serve.schema import set_limits
    from geograph.serve.server import build_server

    monkeypatch.setenv("GEOGRAPH_CACHE", setup["cache"])
    base = ["--method", "maniscope", "--corpus", str(setup["corpus"]), "--candidates", "5"]
    try:
        monkeypatch.delenv("GEOGRAPH_API_KEY", raising=False)
        server = build_server(load_config(base))
        assert "/admin/reload" not in {getattr(r, "path", None) for r in server.app.router.routes}
        server = build_server(load_config([*base, "--api-key", KEY]))
        assert "/admin/reload" in {getattr(r, "path", None) for r in server.app.router.routes}
        ok = server.app.openapi()["paths"]["/admin/reload"]["post"]["responses"]["200"]["content"]
        assert ok["application/json"]["schema"]["$ref"].endswith("ReloadResponse")
        shutil.rmtree(server.reload_directory)
    finally:
        set_limits()
