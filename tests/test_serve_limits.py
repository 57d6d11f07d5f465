"""The bounded cost of one ``geograph serve`` request, without starting a server: the caps on
candidates (per request and per padded batch), the character and token cuts of request texts,
the one-line 422s naming the flag, and every route typed in the OpenAPI document."""

import queue
import time
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import require

require("litserve")
require("prometheus_client")

from geograph.data import DEMO_PATH  # noqa: E402
from geograph.serve.config import ConfigError, ServeConfig, load_config  # noqa: E402
from geograph.serve.schema import RerankRequest, RetrieveRequest, set_limits  # noqa: E402

DEMO = str(DEMO_PATH)


@pytest.fixture(scope="module")
def app():
    """A ricci server's app (built, never run: the validation and the schema need no worker)."""
    from geograph.serve.server import build_server

    cfg = ServeConfig(method="ricci", corpus=DEMO, accelerator="cpu", max_candidates=50, max_batch_candidates=40)
    yield build_server(cfg).app
    set_limits()


@pytest.fixture(scope="module")
def client(app):
    from fastapi.testclient import TestClient

    return TestClient(app)


@pytest.mark.parametrize(
    "path, body, fragment",
    [
        (
            "/retrieve",
            {"query": "q", "k": 3, "candidates": 100},
            "candidates must be <= 50 (--max-candidates), got 100",
        ),
        ("/retrieve", {"query": "q", "k": 3, "candidates": 45}, "candidates must be <= 40 (--max-batch-candidates)"),
        ("/rerank", {"query": "q", "candidate_ids": ["x"] * 51}, "at most 50 per request (--max-candidates)"),
        ("/rerank", {"query": "q", "candidates": ["a"] * 45}, "at most 40 per request (--max-batch-candidates)"),
        ("/rerank", {"query": "q", "texts": ["a"] * 60}, "texts has 60 entries; at most 50 per request"),
        ("/rerank", {"query": "q", "texts": ["a", ""]}, "texts[1] is empty"),
        ("/rerank", {"query": "q", "texts": ["a"], "candidates": ["b"]}, "Extra inputs are not permitted"),
        (
            "/rerank",
            {"query": "q", "texts": ["a"], "truncate": True, "truncation_direction": "Left"},
            "truncation_direction: Left is not supported",
        ),
        ("/v2/rerank", {"query": "q", "documents": ["a"] * 45}, "at most 40 per request (--max-batch-candidates)"),
        ("/v1/rerank", {"query": "q", "documents": [{"text": "a"}] * 51}, "at most 50 per request (--max-candidates)"),
    ],
)
def test_oversized_requests_get_one_line_naming_the_limit(client, path, body, fragment):
    r = client.post(path, json=body)
    assert r.status_code == 422, (path, r.text[:300])
    text = r.json()["message"] if path.startswith("/v") else r.json()["detail"][0]["msg"]
    assert fragment in text and "\n" not in text, text
    if path == "/rerank":  # the dialect's tag is not part of the location
        assert r.json()["detail"][0]["loc"][:2] in (["body"], ["body", "candidates"], ["body", "texts"])


def test_every_route_is_typed_in_the_openapi_document(app):
    """Every POST has a typed request body and every route a 200 schema, for a reranker (all
    routes) and a corpus retriever; the /rerank body is either dialect."""
    from geograph.serve.server import build_server

    iso = build_server(ServeConfig(method="iso", corpus=DEMO, accelerator="cpu")).app
    set_limits()
    for served, routes in ((app, {"/retrieve", "/rerank", "/v1/rerank", "/v2/rerank"}), (iso, {"/retrieve"})):
        spec = served.openapi()
        posts = {p for p, ops in spec["paths"].items() if "post" in ops}
        assert posts == routes
        for path, ops in spec["paths"].items():
            for verb, op in ops.items():
                if verb == "post":
                    schema = op["requestBody"]["content"]["application/json"]["schema"]
                    assert "$ref" in schema or "oneOf" in schema, (path, schema)
                    assert op["requestBody"]["required"]
                content = op["responses"]["200"]["content"]
                assert content and all(c["schema"] for c in content.values()), (path, verb, content)
    spec = app.openapi()
    names = {
        s["$ref"].rsplit("/", 1)[1]
        for s in spec["paths"]["/rerank"]["post"]["requestBody"]["content"]["application/json"]["schema"]["oneOf"]
    }
    assert names == {"RerankRequest", "TEIRerankRequest"}
    for path, req, resp in (
        ("/v1/rerank", "CohereV1Request", "CohereResponse"),
        ("/v2/rerank", "CohereV2Request", "CohereResponse"),
    ):
        op = spec["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(req)
        assert op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(resp)
    v2 = spec["components"]["schemas"]["CohereV2Request"]["properties"]["documents"]
    assert v2["items"] == {"type": "string"}


def batches(bodies, *, cells, size=64):
    """The batches :class:`~geograph.serve._litserve.WaitingBatchedLoop` forms from ``bodies`` already queued."""
    from geograph.serve._litserve import WaitingBatchedLoop

    q = queue.Queue()
    for n, body in enumerate(bodies):
        q.put((0, f"u{n}", time.monotonic(), body))
    loop = WaitingBatchedLoop()
    acked = []
    loop.put_response = lambda **kw: acked.append(kw["uid"])
    api = SimpleNamespace(
        max_batch_size=size, batch_timeout=0.0, request_timeout=60.0, max_batch_texts=None, max_batch_candidates=cells
    )
    out = []
    while not q.empty() or getattr(loop, "held", None) is not None:
        payloads, timed_out = loop.get_batch_requests(api, q, None)
        assert not timed_out
        out.append([uid for _, uid, _ in payloads])
    assert acked == [f"u{n}" for n in range(len(bodies))]  # each acknowledged once, in order
    return out


def test_a_batch_never_passes_max_batch_candidates_padded():
    set_limits(method="maniscope", default_candidates=20, max_candidates=1000)
    try:

        def ids(n):
            return RerankRequest(query="q", candidate_ids=[f"d{i}" for i in range(n)])

        pool = RetrieveRequest(query="q", k=3)  # the default pool, 20, resolved at validation
        assert pool.candidates == 20
        # padded size: requests x the largest count; the request that would pass the cap opens the next batch
        assert batches([ids(10)] * 3 + [ids(30), ids(5)], cells=40) == [["u0", "u1", "u2"], ["u3"], ["u4"]]
        assert batches([pool] * 5, cells=40) == [["u0", "u1"], ["u2", "u3"], ["u4"]]
        assert batches([ids(2)] * 5, cells=40, size=3) == [["u0", "u1", "u2"], ["u3", "u4"]]
        assert batches([ids(50), ids(1)], cells=40) == [["u0"], ["u1"]]  # above the cap (not validated): alone
        assert batches([ids(10)] * 5, cells=None) == [["u0", "u1", "u2", "u3", "u4"]]
    finally:
        set_limits()


def test_caps_are_config_keys_and_flags(tmp_path):
    base = ["--method", "maniscope", "--corpus", DEMO]
    cfg = load_config(base)
    assert (cfg.max_candidates, cfg.max_batch_candidates, cfg.max_text_chars) == (1000, 4096, 20000)
    assert load_config(["--method", "ricci", "--corpus", DEMO]).max_candidates == 100  # auto: ricci's work is ~N^4
    assert load_config(["--method", "ricci", "--corpus", DEMO, "--max-candidates", "300"]).max_candidates == 300
    cfg = load_config(base + ["--max-batch-candidates", "64", "--max-text-chars", "500", "--max-candidates", "auto"])
    assert (cfg.max_batch_candidates, cfg.max_text_chars, cfg.max_candidates) == (64, 500, 1000)
    for flag in ("--max-text-chars", "--max-batch-candidates", "--max-candidates"):
        with pytest.raises(ConfigError, match=flag[2:].replace("-", "_")) as e:
            load_config(base + [flag, "0"])
        assert "\n" not in str(e.value)


def test_a_default_pool_above_the_caps_is_a_start_error():
    from geograph.serve.server import StartupError, build_server

    cfg = load_config(["--method", "maniscope", "--corpus", DEMO, "--candidates", "30", "--max-candidates", "25"])
    with pytest.raises(StartupError, match="candidates: the default pool 30 exceeds max_candidates 25"):
        build_server(cfg)
    set_limits()


@pytest.fixture(scope="module")
def encoder():
    from geograph.serve.corpus import TextEncoder

    return TextEncoder(None, memory=0, max_chars=20000)


def test_a_2mb_text_is_cut_to_what_a_long_one_costs(encoder, monkeypatch):
    """A 2 MB document: the tokenizer never sees more than max_chars characters of it, and its
    vector is the one of its first max_seq_length tokens (sentence-transformers' own encode of a
    short prefix, the reference)."""
    model = encoder._shared().model
    tok = model.tokenizer
    seen = []
    real = type(tok).__call__

    def spy(self, text, *a, **k):
        seen.extend(len(t) for t in ([text] if isinstance(text, str) else text))
        return real(self, text, *a, **k)

    words = "volcanic eruptions carry ash and lava over the valley while farmers watch the sky ".split()
    doc = " ".join(words[i % len(words)] for i in range(400000))[: 2 * 2**20]
    assert len(doc) == 2 * 2**20
    with monkeypatch.context() as m:
        m.setattr(type(tok), "__call__", spy)
        got = encoder.passages([doc])[0].numpy()
        encoder.truncate([doc], 3)
    assert seen and max(seen) <= 20000, max(seen)
    assert np.array_equal(got, encoder.passages([doc[:20000]])[0].numpy())
    prefix = doc[: 4 * model.max_seq_length * 8]  # well over max_seq_length tokens
    assert len(model.tokenizer(prefix)["input_ids"]) > model.max_seq_length
    ref = model.encode([prefix], normalize_embeddings=True, convert_to_numpy=True)[0]
    np.testing.assert_allclose(got, ref, atol=1e-6)
    assert encoder.cap(["abc", doc]) == ["abc", doc[:20000]]


def test_max_tokens_cut_tokenizes_no_further_than_needed(encoder, monkeypatch):
    """``max_tokens_per_doc`` cuts at the same character as a full tokenization (the reference),
    asking the tokenizer for at most max_tokens + 1 tokens."""
    tok = encoder._shared().model.tokenizer
    texts = ["a cat sleeping on a sofa in the afternoon sun", "volcanic", "x" * 50000]
    for n in (1, 3, 8, 200):
        want = []
        for t in encoder.cap(texts):
            offsets = tok(t, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            want.append(t if len(offsets) <= n else t[: offsets[n - 1][1]])
        assert encoder.truncate(texts, n) == want
    seen = []
    real = type(tok).__call__
    monkeypatch.setattr(type(tok), "__call__", lambda self, *a, **k: seen.append(k) or real(self, *a, **k))
    encoder.truncate(texts, 5)
    assert seen and all(k.get("truncation") is True and k.get("max_length") == 6 for k in seen)


def test_a_max_tokens_beyond_any_integer_cuts_nothing(encoder):
    """A ``max_tokens_per_doc`` larger than the tokenizer's integers (a fuzzer sent 10**20; the
    tokenizer raised OverflowError, a 500) cuts nothing, as any count above the texts' tokens."""
    texts = ["a cat sleeping on a sofa in the afternoon sun", "x" * 50000]
    for n in (10**6, 2**31 - 2, 2**31 - 1, 2**32, 2**64, 10**20, 10**400):
        assert encoder.truncate(texts, n) == encoder.cap(texts), n
    assert encoder.truncate(texts, 3)[0] == "a cat sleeping"  # a small count still cuts
