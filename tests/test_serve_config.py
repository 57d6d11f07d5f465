"""``geograph serve`` without HTTP: config file and flags, one-line start errors, the request schema,
the in-memory text cache, and the worker's batched answers against per-request module calls."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import require

require("litserve")
yaml = require("yaml")

from geograph.data import DEMO_PATH  # noqa: E402
from geograph.data.cache import MemoryCache  # noqa: E402
from geograph.serve.config import ConfigError, load_config  # noqa: E402
from geograph.serve.schema import RerankRequest, RetrieveRequest, set_limits  # noqa: E402

DEMO = str(DEMO_PATH)


def write(tmp_path, data, name="serve.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return str(path)


def test_config_file_flags_override_and_params(tmp_path):
    path = write(
        tmp_path,
        {
            "method": "iso",
            "corpus": DEMO,
            "port": 9001,
            "max_batch_size": 8,
            "params": {"beta": 0.3, "m": 4},
            "query_prefix": "query: ",
        },
    )
    cfg = load_config(["--config", path, "--port", "9002", "--param", "L=20", "--param", "beta=0.5"])
    assert (cfg.method, cfg.port, cfg.max_batch_size, cfg.query_prefix) == ("iso", 9002, 8, "query: ")
    assert cfg.params == {"beta": 0.5, "m": 4, "L": 20}
    assert load_config(["--method", "maniscope", "--corpus", DEMO]).candidates == 20


def test_example_config_is_valid():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = load_config(["--config", os.path.join(root, "configs", "serve.yaml")])
    assert cfg.method == "maniscope" and cfg.params


@pytest.mark.parametrize(
    "data, argv, fragment",
    [
        ({"method": "maniscope", "corpus": DEMO, "prot": 1}, [], "prot: unknown key"),
        ({"method": "maniscope", "corpus": DEMO, "port": "eighty"}, [], "port:"),
        ({"method": "maniscope", "corpus": DEMO, "max_batch_size": 0}, [], "max_batch_size:"),
        ({"method": "maniscope", "corpus": DEMO, "params": {"beta": 1}}, [], "unknown key 'beta' for method maniscope"),
        ({"method": "maniscope", "corpus": DEMO}, ["--param", "alpha=2"], "alpha must be a float in [0, 1], got 2"),
        ({"method": "nope", "corpus": DEMO}, [], "method:"),
        ({"method": "maniscope", "corpus": "/no/such/dir"}, [], "corpus:"),
        ({"method": "maniscope", "corpus": DEMO, "graph": DEMO}, [], "graph applies to iso and g3"),
        ({"method": "maniscope", "corpus": DEMO, "host": "10.0.0.1"}, [], "host:"),
        (
            {"method": "g3", "corpus": DEMO, "graph": DEMO, "params": {"band": [0, 1]}},
            [],
            "band is fixed by the saved graph",
        ),
        ("- a list", [], "expected a mapping"),
        ("method: [unclosed", [], "not valid YAML"),
        ({"corpus": DEMO}, [], "method: missing"),
        ({"method": "maniscope", "corpus": DEMO}, ["--param", "k"], "expected KEY=VALUE"),
    ],
)
def test_bad_config_is_one_line_config_error(tmp_path, data, argv, fragment):
    with pytest.raises(ConfigError) as e:
        load_config(["--config", write(tmp_path, data), *argv])
    assert fragment in str(e.value) and "\n" not in str(e.value)


def run_cli(*argv, env=None):
    return run_cli_all([list(argv)], env=env)[0]


def run_cli_all(argvs, env=None):
    """``geograph serve`` with each argument list, the processes started together (each waits mostly
    on its imports); their completed processes, in order."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    cmds = [[sys.executable, "-m", "geograph", "serve", *argv] for argv in argvs]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for c in cmds]
    done = []
    for cmd, proc in zip(cmds, procs):
        out, err = proc.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(cmd, proc.returncode, out, err))
    return done


@pytest.mark.integration
def test_cli_config_errors_exit_2_with_one_line(tmp_path):
    unknown = write(tmp_path, {"method": "maniscope", "corpus": DEMO, "workers": 2})
    r, missing = run_cli_all([["--config", unknown], ["--config", str(tmp_path / "missing.yaml")]])
    assert r.returncode == 2
    assert r.stderr.strip() == "geograph serve: workers: unknown key"
    r = missing
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.integration
def test_cli_startup_errors_exit_1_with_one_line(tmp_path):
    """Artefacts that do not match the corpus (bad parameter values are config errors: the registry's bounds)."""
    from geograph import CorpusGraph

    small = CorpusGraph.from_knn(torch.nn.functional.normalize(torch.randn(7, 384), dim=1), 2)
    small.save(tmp_path / "graph")
    from geograph.artefacts import EncoderIdentity
    from geograph.data import load_demo

    e5 = EncoderIdentity("intfloat/e5-small-v2", sha256="b" * 64)  # a graph of the demo's size, another model
    other = CorpusGraph.from_knn(torch.nn.functional.normalize(torch.randn(111, 384), dim=1), 2)
    other.save_pretrained(tmp_path / "e5", encoder=e5, ids=load_demo().doc_ids)
    cases = [
        (["--method", "iso", "--graph", str(tmp_path / "graph")], "graph: "),
        (["--method", "iso", "--graph", str(tmp_path / "e5")], "; the encoder in use is sentence-transformers/"),
        (["--method", "iso", "--projection", write(tmp_path, "not a checkpoint", "p.pt")], "projection: cannot read"),
    ]
    runs = run_cli_all([["--corpus", DEMO, "--port", "1", *argv] for argv, _ in cases])
    for (_, fragment), r in zip(cases, runs):
        lines = [x for x in r.stderr.splitlines() if x.startswith("geograph serve:")]
        assert r.returncode == 1, r.stderr[-2000:]
        assert "Traceback" not in r.stderr and len(lines) == 1 and fragment in lines[0], r.stderr[-2000:]


def test_served_corpus_is_its_passages_whatever_the_judgements_say(tmp_path):
    """A corpus updated by ``geograph update`` may lose a passage that qrels still judge: the server,
    which reads no judgements, takes it; an id given twice is one line naming it."""
    import json

    from geograph.serve.corpus import read_corpus

    (tmp_path / "qrels").mkdir()
    rows = [{"_id": "a", "title": "", "text": "one"}, {"_id": "b", "title": "T", "text": "two"}]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "q", "text": "one?"}) + "\n")
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq\tgone\t1\n")
    data = read_corpus(tmp_path)
    assert data.doc_ids == ["a", "b"] and data.passages() == ["one", "T two"]
    rows.append({"_id": "a", "text": "again"})
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match="holds the id 'a' twice"):
        read_corpus(tmp_path)


def test_memory_cache_is_bounded_lru():
    c = MemoryCache(2)
    v = np.arange(6, dtype=np.float32).reshape(3, 2)
    c.put(["a", "b"], v[:2])
    assert c.get(["a"])[1] == []  # "a" is now the most recent
    c.put(["c"], v[2:])
    found, missing = c.get(["a", "b", "c"])
    assert missing == [1] and len(c) == 2
    np.testing.assert_array_equal(found[0], v[0])
    np.testing.assert_array_equal(found[2], v[2])
    assert MemoryCache(0).get(["a"])[1] == [0]
    with pytest.raises(ValueError, match="maxsize"):
        MemoryCache(-1)


@pytest.fixture
def limits():
    set_limits(
        method="maniscope",
        dim=3,
        ids=frozenset({"a", "b"}),
        num_docs=30,
        max_candidates=4,
        max_k=1000,
        default_candidates=10,
        k_min=1,
        k_max=None,
    )
    yield
    set_limits()


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"query_embedding": [0, 0, 0], "candidate_ids": ["a"]}, "query_embedding is the zero vector"),
        ({"query": "x", "candidate_embeddings": [[1, 0, 0], [0, 0, 0]]}, "candidate_embeddings[1] is the zero vector"),
        ({"query": "x", "candidate_ids": ["a", "b"], "top_n": 3}, "top_n (3) must be <="),
        ({"query": "x", "candidates": ["a", ""]}, "candidates[1] is empty"),
        ({"query": "x", "candidate_ids": ["a"] * 5}, "at most 4"),
        (
            {"query": "x", "candidate_ids": ["a"], "max_tokens_per_doc": 8},
            "max_tokens_per_doc applies to candidates (texts) only",
        ),
        ({"query": "x", "candidates": ["a"], "max_tokens_per_doc": 0}, "max_tokens_per_doc"),
    ],
)
def test_rerank_schema_rejects(limits, body, fragment):
    with pytest.raises(ValueError, match=None) as e:
        RerankRequest(**body)
    assert fragment in str(e.value)


@pytest.mark.parametrize(
    "body, method, fragment",
    [
        ({"query": "x", "k": 11}, "maniscope", "k (11) must be <= candidates (10)"),
        ({"query": "x", "k": 5, "candidates": 31}, "ricci", "candidates must be <= 30"),
        ({"query": "x", "k": 1}, "g3", "k (1) must be >= 2"),
        ({"query": "x", "k": 31}, "g3", "k (31) must be <= 30"),
        ({"query": "x", "k": 3, "candidates": 5}, "iso", "candidates applies to maniscope and ricci"),
    ],
)
def test_retrieve_schema_rejects(limits, body, method, fragment):
    set_limits(
        method=method,
        dim=3,
        num_docs=30,
        max_k=1000,
        default_candidates=10,
        k_min=2 if method == "g3" else 1,
        k_max=30 if method == "g3" else None,
    )
    with pytest.raises(ValueError) as e:
        RetrieveRequest(**body)
    assert fragment in str(e.value)
    assert RetrieveRequest(query="x", k=2).k == 2


def test_worker_reads_results_with_one_host_transfer_per_batch(monkeypatch, tmp_path):
    """The worker's result handling on a batch that interleaves ``/rerank`` and ``/retrieve``
    requests (one pool serves both): one ``.cpu()`` per endpoint and batch, no host read of a
    tensor in the server's code (the modules' own input checks are not counted), answers in the
    batch's order equal per-request calls."""
    from geograph import Maniscope
    from geograph.data import Encoder, load_demo
    from geograph.retrievers import DenseRetriever
    from geograph.serve.api import GeoAPI
    from geograph.serve.config import load_config
    from geograph.serve.models import k_bounds

    cfg = load_config(["--method", "maniscope", "--corpus", DEMO, "--param", "early_stop=false"])
    data = load_demo()
    emb = Encoder(progress=False).encode(data.passages())
    set_limits(
        method="maniscope",
        dim=emb.shape[1],
        num_docs=len(emb),
        default_candidates=20,
        max_k=1000,
        ids=frozenset(data.doc_ids),
        max_candidates=1000,
    )
    try:
        g = torch.Generator().manual_seed(0)
        qs = torch.nn.functional.normalize(emb[:6] + 0.3 * torch.randn(6, emb.shape[1], generator=g), dim=1)
        rer = [
            RerankRequest(query_embedding=q.tolist(), candidate_ids=[data.doc_ids[j] for j in range(i, 3 * i + 4)])
            for i, q in enumerate(qs)
        ]
        ret = [RetrieveRequest(query_embedding=q.tolist(), k=1 + i, candidates=2 + 3 * i) for i, q in enumerate(qs)]
        api = GeoAPI(cfg.model_dump())
        assert set(api.routes) == {"/retrieve", "/rerank"}
        api.setup("cpu")
        counts = {"cpu": 0, "host": 0}
        real_cpu = torch.Tensor.cpu

        def cpu(self, *a, **k):
            counts["cpu"] += 1
            return real_cpu(self, *a, **k)

        def host(name):
            real = getattr(torch.Tensor, name)

            def f(self, *a, **k):
                if "geograph/serve/" in sys._getframe(1).f_code.co_filename.replace(os.sep, "/"):
                    counts["host"] += 1  # the server's own code (the modules' input checks are theirs)
                return real(self, *a, **k)

            return f

        monkeypatch.setattr(torch.Tensor, "cpu", cpu)
        for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
            monkeypatch.setattr(torch.Tensor, name, host(name))
        got = api.predict([r for pair in zip(rer, ret) for r in pair])  # rerank, retrieve, rerank, ...
        got_rer, got_ret = got[0::2], got[1::2]
        assert counts == {"cpu": 2, "host": 0}, counts
        assert [a["batch_size"] for a in got] == [6] * 12
        assert all("order" in a for a in got_rer) and all("ids" in a for a in got_ret)
        monkeypatch.undo()
        model = Maniscope(early_stop=False)
        for i, got in enumerate(got_rer):
            out = model(qs[i : i + 1], emb[list(range(i, 3 * i + 4))][None])
            assert got["order"] == out.order[0].tolist() and got["batch_size"] == 6
            np.testing.assert_allclose(got["scores"], out.scores[0][out.order[0]].tolist(), atol=1e-6)
        for i, (req, got) in enumerate(zip(ret, got_ret)):
            top = DenseRetriever(emb)(qs[i : i + 1], req.candidates).indices[0]
            out = model(qs[i : i + 1], emb[top][None])
            assert got["ids"] == [data.doc_ids[j] for j in top[out.order[0]].tolist()][: req.k]
        assert k_bounds("maniscope", model, len(emb)) == (1, None, "")
    finally:
        set_limits()


def test_api_key_from_flag_or_environment_and_public_groups(monkeypatch):
    base = ["--method", "maniscope", "--corpus", str(DEMO_PATH)]
    monkeypatch.delenv("GEOGRAPH_API_KEY", raising=False)
    assert load_config(base).api_key is None
    monkeypatch.setenv("GEOGRAPH_API_KEY", "from-env")
    assert load_config(base).api_key.get_secret_value() == "from-env"
    cfg = load_config(base + ["--api-key", "from-flag", "--public", "metrics", "--public", "docs"])
    assert cfg.api_key.get_secret_value() == "from-flag" and cfg.public == ["metrics", "docs"]
    assert "from-flag" not in repr(cfg)  # a secret: not shown in reprs or logs
    with pytest.raises(ConfigError, match="api_key: must not be empty"):
        load_config(base + ["--api-key", " "])
    with pytest.raises(ConfigError, match="public"):
        load_config(base + ["--public", "rerank"])


@pytest.mark.parametrize(
    "host, key, warned",
    [("0.0.0.0", None, True), ("::", None, True), ("0.0.0.0", "k", False), ("127.0.0.1", None, False)],
)
def test_start_warns_when_listening_beyond_loopback_without_a_key(monkeypatch, capsys, host, key, warned):
    import geograph.serve.corpus
    from geograph.serve.server import StartupError, build_server

    class Stop:  # end the start right after the warning, before any model is loaded
        def __init__(self, *a, **k):
            raise ValueError("stopped here")

    monkeypatch.setattr(geograph.serve.corpus, "TextEncoder", Stop)
    monkeypatch.delenv("GEOGRAPH_API_KEY", raising=False)
    cfg = load_config(
        ["--method", "maniscope", "--corpus", str(DEMO_PATH), "--host", host] + (["--api-key", key] if key else [])
    )
    with pytest.raises(StartupError, match="stopped here"):
        build_server(cfg)
    err = capsys.readouterr().err
    assert ("without an API key" in err) == warned, err


@pytest.mark.parametrize(
    "public, open_",
    [
        ([], {"/health"}),
        (["metrics"], {"/health", "/metrics"}),
        (["metrics", "docs"], {"/health", "/metrics", "/docs", "/openapi.json"}),
    ],
)
def test_api_key_middleware_opens_only_health_and_the_public_groups(public, open_):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from geograph.serve.auth import APIKeyMiddleware

    app = FastAPI()
    for path in ("/health", "/metrics", "/rerank", "/v2/rerank", "/info"):
        app.add_api_route(path, lambda: {"ok": True}, methods=["GET"])
    app.add_middleware(APIKeyMiddleware, key="k3y", public=public)
    client = TestClient(app)
    for path in ("/health", "/metrics", "/rerank", "/v2/rerank", "/info", "/docs", "/openapi.json"):
        want = 200 if path in open_ else 401
        assert client.get(path).status_code == want, path
        assert client.get(path, headers={"Authorization": "Bearer k3y"}).status_code == 200, path
        assert client.get(path, headers={"Authorization": "bearer k3y"}).status_code == 200, path
        for bad in ("Bearer k3", "Bearer k3yy", "Basic k3y", "k3y", "Bearer"):
            assert client.get(path, headers={"Authorization": bad}).status_code == want, (path, bad)
