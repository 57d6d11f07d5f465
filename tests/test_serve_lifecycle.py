"""``geograph serve`` from its first line to its last process, on 127.0.0.1 (ISO-RAG and dense
retrieval over the demo corpus: the quickest servers to start).

* once ready, one line says where it listens (method, workers, encoder), and ``/health``
  answers ``ok`` as soon as it is printed;
* ``GET /info`` describes geograph's server (method, version, encoder, corpus, limits, routes);
  a route the method does not serve (``/rerank``, ``/v2/rerank`` on a retriever) and a path no
  route serves are 404s whose one line names the routes it serves;
* a stop by SIGTERM to the main process (with an API key) or SIGINT to its process group (a
  terminal's Ctrl-C, without a key): exit status 0, no traceback, no leaked-semaphore warning,
  no process of its tree left, the port closed;
* ``kill -9`` of the main process (with a key, two workers, two API servers): within 15 s
  nothing answers on the port and none of the processes it had started is alive.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import require

require("litserve")
requests = require("requests")
psutil = require("psutil")

# every test here starts a `geograph serve` subprocess
pytestmark = pytest.mark.integration

from geograph import __version__  # noqa: E402
from geograph.data import DEFAULT_MODEL_NAME, DEMO_PATH, Encoder, load_demo  # noqa: E402

KEY = "lifecycle-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The servers' environment, with a cache pre-warmed with the demo corpus."""
    cache = tmp_path_factory.mktemp("geograph-cache")
    Encoder(cache=str(cache), progress=False).encode(load_demo().passages())
    return {**os.environ, "HF_HUB_OFFLINE": "1", "GEOGRAPH_CACHE": str(cache), "TOKENIZERS_PARALLELISM": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Server:
    """``geograph serve`` in a subprocess of its own session; its output (stdout and stderr) read
    by a thread."""

    def __init__(self, env, method, *extra, key=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "geograph", "serve", "--method", method, "--corpus", str(DEMO_PATH)]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), "--accelerator", "cpu", "--timeout", "300"]
        if "--workers-per-device" not in extra:
            cmd += ["--workers-per-device", "1"]
        env = {**env, "GEOGRAPH_API_KEY": key} if key else {k: v for k, v in env.items() if k != "GEOGRAPH_API_KEY"}
        self.proc = subprocess.Popen(
            [*cmd, *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.log = []
        self.reader = threading.Thread(target=lambda: self.log.extend(self.proc.stdout), daemon=True)
        self.reader.start()

    def output(self) -> str:
        return b"".join(self.log).decode(errors="replace")

    def lines(self, fragment):
        return [x for x in self.output().splitlines() if fragment in x]

    def wait_ready_line(self, seconds=300) -> str:
        """The line that says where the server listens, once printed (fails if the server exits first)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = self.lines("listening on")
            if found:
                return found[0]
            assert self.proc.poll() is None, f"the server exited ({self.proc.returncode}):\n{self.output()[-3000:]}"
            time.sleep(0.05)
        raise AssertionError(f"no 'listening on' line after {seconds} s:\n{self.output()[-3000:]}")

    def descendants(self):
        return psutil.Process(self.proc.pid).children(recursive=True)

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def alive(procs):
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.parametrize(
    "method, key, stop",
    [("iso", KEY, "SIGTERM to the main process"), ("dense", None, "SIGINT to the process group")],
)
def test_ready_line_info_routes_and_a_clean_stop(env, method, key, stop):
    server = Server(env, method, key=key)
    headers = AUTH if key else {}
    try:
        line = server.wait_ready_line()
        assert requests.get(server.url + "/health", timeout=5).text == "ok"  # answered as soon as it is said
        assert line == (
            f"geograph serve: listening on http://127.0.0.1:{server.port} "
            f"({method}, 1 worker, encoder {DEFAULT_MODEL_NAME})"
        )

        info = requests.get(server.url + "/info", headers=headers, timeout=30).json()
        assert info["server"] == "geograph" and info["version"] == __version__ and info["method"] == method
        # the parameters in use: the method's constructor defaults when none were given
        want = {"iso": {"knn": 10, "m": 5, "beta": 0.4}, "dense": {"index": "exact", "chunk_size": 4096}}[method]
        assert {k: info["params"].get(k) for k in want} == want, info["params"]
        assert info["encoder"]["name"] == DEFAULT_MODEL_NAME and info["encoder"]["dim"] == 384
        assert os.path.isdir(info["encoder"]["path"]) and len(info["encoder"]["sha256"]) == 64
        assert info["corpus"]["passages"] == len(load_demo().doc_ids) and info["corpus"]["version"] == 0
        assert info["corpus"]["corpus_version"] is None  # no saved graph
        limits = info["limits"]
        assert limits["max_candidates"] == 1000 and limits["max_k"] == 1000 and limits["max_batch_size"] == 64
        assert limits["max_text_chars"] > 0 and limits["k_min"] == 1 and limits["request_timeout"] == 300  # --timeout
        assert info["workers"]["inference_workers"] == 1 and info["api_key"] == bool(key)
        assert "model" not in info and "/infer" not in str(info)  # none of LitServe's internals
        routes = list(info["routes"])
        assert routes[0] == "/retrieve" and {"/health", "/info", "/metrics"} <= set(routes)
        assert ("/admin/reload" in routes) == bool(key) and "/rerank" not in routes
        if key:
            assert requests.get(server.url + "/info", timeout=30).status_code == 401

        served = ", ".join(routes)
        for path in ("/rerank", "/v2/rerank"):
            r = requests.post(server.url + path, json={"query": "q", "documents": ["a"]}, headers=headers, timeout=30)
            assert r.status_code == 404, r.text
            assert r.json() == {
                "detail": f"{path} is not served by method '{method}' (only by the rerankers: maniscope, ricci); "
                f"it serves: {served}"
            }
        r = requests.get(server.url + "/no/such/path", headers=headers, timeout=30)
        assert (
            r.status_code == 404 and r.json()["detail"] == f"no route /no/such/path; method '{method}' serves: {served}"
        )
        if not key:
            r = requests.post(server.url + "/admin/reload", timeout=30)
            assert r.status_code == 404 and r.json()["detail"].startswith(
                "/admin/reload is served only with an API key"
            )
        r = requests.post(server.url + "/retrieve", json={"query": "volcanoes", "k": 3}, headers=headers, timeout=120)
        assert r.status_code == 200 and len(r.json()["ids"]) == 3

        procs = [psutil.Process(server.proc.pid), *server.descendants()]
        assert len(procs) >= 5, [p.cmdline() for p in procs]  # main, tracker, manager, logger, worker, API server
        if stop.startswith("SIGTERM"):
            os.kill(server.proc.pid, signal.SIGTERM)
        else:
            os.killpg(server.proc.pid, signal.SIGINT)
        assert server.proc.wait(timeout=60) == 0, server.output()[-3000:]
        _, left = psutil.wait_procs(procs, timeout=15)
        left = alive(left)
        assert not left, f"still running after {stop}: {[(p.pid, p.cmdline()) for p in left]}"
        assert not port_open(server.port)
        server.reader.join(timeout=10)  # the output up to the last process's exit (the resource tracker's)
        out = server.output()
        assert "Traceback" not in out and "leaked semaphore" not in out, f"a clean stop printed:\n{out[-4000:]}"
        assert len(server.lines("listening on")) == 1
    finally:
        server.kill()


def test_no_process_outlives_a_main_process_killed_hard(env):
    server = Server(env, "iso", "--workers-per-device", "2", "--api-servers", "2", key=KEY)
    procs = []
    try:
        server.wait_ready_line()
        assert requests.get(server.url + "/health", timeout=5).text == "ok"  # both workers ready
        procs = server.descendants()
        # the resource tracker, the queue manager, the logger, two inference workers, two API servers
        assert len(procs) >= 7, [p.cmdline() for p in procs]
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)
        deadline = time.monotonic() + 15
        while (alive(procs) or port_open(server.port)) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = alive(procs)
        assert not left, f"outlived the main process: {[(p.pid, p.cmdline()) for p in left]}"
        assert not port_open(server.port), "the port still accepts connections"
        with pytest.raises(requests.ConnectionError):
            requests.get(server.url + "/health", timeout=5)
    finally:
        for p in alive(procs):
            p.kill()
        server.kill()
