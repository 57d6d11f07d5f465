"""``geograph serve`` under load: the response table after a cancelled request, worker threads,
``geograph bench serve``'s options, and a soak (slow) through ``geograph bench serve --soak``."""

import asyncio
import json
import queue
from types import SimpleNamespace

import pytest

from conftest import require

require("litserve")
require("requests")
require("psutil")
require("prometheus_client")

from geograph.serve._litserve import ForgetfulHandler  # noqa: E402
from geograph.serve.config import ConfigError, load_config  # noqa: E402
from geograph.serve.pool import worker_threads, workers_per_device  # noqa: E402


def fake_server():
    """What LitServe's request handler reads of its server, with a request queue nobody serves."""
    return SimpleNamespace(
        response_buffer={},
        _get_request_queue=lambda path: queue.Queue(),
        app=SimpleNamespace(response_queue_id=0),
        active_requests=0,
        _callback_runner=SimpleNamespace(trigger_event=lambda *a, **k: None),
    )


async def cancel_waiting(handler_class):
    server = fake_server()
    handler = handler_class(SimpleNamespace(api_path="/retrieve"), server)
    task = asyncio.create_task(handler.handle_request({"query": "cats"}, dict))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if server.response_buffer:
            break
    assert len(server.response_buffer) == 1  # waiting for its answer
    task.cancel()  # what DeadlineMiddleware's 504 does to the handler
    with pytest.raises(asyncio.CancelledError):
        await task
    return server.response_buffer


def test_a_cancelled_request_leaves_no_entry_in_the_response_table():
    from litserve.server import RegularRequestHandler

    assert asyncio.run(cancel_waiting(ForgetfulHandler)) == {}
    # LitServe's own handler leaves it (the leak this handler fixes): the check can fail
    assert len(asyncio.run(cancel_waiting(RegularRequestHandler))) == 1


def batches(bodies, *, size=64, cap=None):
    """The batches :class:`~geograph.serve._litserve.WaitingBatchedLoop` forms from ``bodies`` already queued."""
    import time

    from geograph.serve._litserve import WaitingBatchedLoop

    q = queue.Queue()
    for n, body in enumerate(bodies):
        q.put((0, f"u{n}", time.monotonic(), body))
    loop = WaitingBatchedLoop()
    loop.put_response = lambda **kw: None  # the START acknowledgements go nowhere
    api = SimpleNamespace(max_batch_size=size, batch_timeout=0.0, request_timeout=60.0, max_batch_texts=cap)
    out = []
    while not q.empty():
        payloads, timed_out = loop.get_batch_requests(api, q, None)
        assert not timed_out
        out.append([uid for _, uid, _ in payloads])
    return out


def test_a_batch_takes_no_more_requests_once_its_texts_reach_max_batch_texts():
    from geograph.serve.schema import RerankRequest, RetrieveRequest

    rerank = RerankRequest(query="q", candidates=[f"passage {i}" for i in range(8)])  # 9 texts
    ids = RerankRequest(query="q", candidate_ids=["a", "b"])  # 1 text
    vector = RetrieveRequest(query_embedding=[1.0, 0.0], k=1)  # none
    assert batches([rerank] * 5, cap=16) == [["u0", "u1"], ["u2", "u3"], ["u4"]]
    assert batches([ids, rerank, ids, ids], cap=10) == [["u0", "u1"], ["u2", "u3"]]
    assert batches([vector] * 5, size=3, cap=1) == [["u0", "u1", "u2"], ["u3", "u4"]]  # no texts: the count bounds it
    assert batches([rerank] * 5, cap=None) == [["u0", "u1", "u2", "u3", "u4"]]
    assert batches([rerank] * 3, cap=1) == [["u0"], ["u1"], ["u2"]]  # a request over the cap still runs, alone
    pooled = RetrieveRequest.model_construct(query="q", k=5, candidates=20)  # a pool size, not texts: one text
    assert batches([pooled] * 5, cap=2) == [["u0", "u1"], ["u2", "u3"], ["u4"]]


def test_max_batch_texts_is_a_config_key_and_a_flag(tmp_path):
    (tmp_path / "corpus.jsonl").write_text('{"_id": "a", "text": "x"}\n')
    (tmp_path / "s.yaml").write_text("max_batch_texts: 32\n")
    base = ["--method", "maniscope", "--corpus", str(tmp_path)]
    assert load_config(base + ["--config", str(tmp_path / "s.yaml")]).max_batch_texts == 32
    assert load_config(base + ["--max-batch-texts", "8"]).max_batch_texts == 8
    assert load_config(base).max_batch_texts == 64
    with pytest.raises(ConfigError, match="max_batch_texts") as e:
        load_config(base + ["--max-batch-texts", "0"])
    assert "\n" not in str(e.value)


def test_worker_threads_divide_the_cpus_among_the_workers(monkeypatch):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert [worker_threads("auto", n) for n in (1, 2, 3, 8, 20)] == [8, 4, 2, 1, 1]
    assert worker_threads(3, 2) == 3


def test_auto_workers_are_one_per_cpu_on_the_cpu_at_most_four_and_one_per_gpu(monkeypatch):
    import os

    import torch

    for cpus, want in ((1, 1), (2, 2), (3, 3), (64, 4)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)))
        assert workers_per_device("auto", "cpu") == want
        assert workers_per_device("auto", "cuda") == 1
        assert workers_per_device(2, "cuda") == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert workers_per_device("auto", "auto") == 1  # a GPU: auto picks it, one worker per device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert workers_per_device("auto", "auto") == 4


@pytest.mark.parametrize("flag", ["--threads", "--workers-per-device"])
@pytest.mark.parametrize(
    "value, fragment", [("0", "must be a positive integer"), ("many", "expected a positive integer or 'auto'")]
)
def test_bad_threads_is_one_line(tmp_path, flag, value, fragment):
    name = flag[2:].replace("-", "_")
    (tmp_path / "corpus.jsonl").write_text('{"_id": "a", "text": "x"}\n')
    with pytest.raises(ConfigError, match=f"{name}: {fragment}") as e:
        load_config(["--method", "maniscope", "--corpus", str(tmp_path), flag, value])
    assert "\n" not in str(e.value)
    assert getattr(load_config(["--method", "maniscope", "--corpus", str(tmp_path), flag, "2"]), name) == 2
    assert getattr(load_config(["--method", "maniscope", "--corpus", str(tmp_path)]), name) == "auto"


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--clients", "0"], "--clients must be >= 1, got 0"),
        (["--requests", "-1"], "--requests must be >= 0, got -1"),
        (["--soak", "10", "--url", "http://127.0.0.1:1"], "--soak reads the memory of the server's processes"),
        (["--corpus", "/no/such/folder"], "is not a BEIR-format folder"),
        (["--timeout", "0"], "--timeout must be > 0"),
    ],
)
def test_bench_serve_bad_options_are_one_line(capsys, argv, fragment):
    from geograph.bench.serve.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1, err


def test_bench_serve_answers_compare_ids_order_and_scores():
    from geograph.bench.serve.soak import same_answer

    want = {"order": [2, 0], "scores": [0.9, 0.1], "dropped": [1]}
    assert same_answer(dict(want), want)
    assert not same_answer({**want, "order": [0, 2]}, want)
    assert not same_answer({**want, "scores": [0.9, 0.1 + 2e-6]}, want)
    assert not same_answer({**want, "dropped": []}, want)
    assert not same_answer(None, want)


@pytest.mark.slow
@pytest.mark.integration
def test_soak_mixed_requests_bounded_memory_no_wrong_answer_no_5xx(tmp_path):
    """256 mixed requests (texts, vectors, candidate texts and ids) from 16 clients, drawn from 96
    requests answered alone first: after a warm-up pass no server process grows by more than
    50 MB, every answer equals the one given alone, none is a 5xx, and the server stops cleanly.
    The workers' text LRU holds 64 texts, fewer than the pool's (~300), so texts are encoded
    again in groups with whatever shares their batch."""
    from geograph.bench.serve.cli import main

    code = main(
        [
            "--text-requests",
            "0",
            "--requests",
            "0",
            "--soak",
            "256",
            "--pool",
            "96",
            "--clients",
            "16",
            "--repeat",
            "1",
            "--server-arg=--accelerator=cpu",
            "--server-arg=--timeout=300",
            "--server-arg=--max-batch-size=16",
            "--server-arg=--text-cache-size=64",
            "--out",
            str(tmp_path),
        ]
    )
    result = json.loads((tmp_path / "serve.json").read_text())
    s = result["soak"]
    print(f"\nsoak: {s['requests']} requests, {s['req_per_s']:.1f} req/s, RSS growth (MB) {s['rss_growth_mb']}")
    assert s["requests"] == 256 and s["alone_not_200"] == 0
    assert s["status_5xx"] == 0 and s["status_other"] == 0, s
    assert s["wrong"] == 0, s
    assert not s["processes_gone"] and len(s["rss_growth_mb"]) >= 4  # main, manager, workers, API server
    assert s["max_rss_growth_mb"] <= 50, s["rss_growth_mb"]
    assert result["server_exit_status"] == 0 and code == 0
    assert result["encoder_limit"] is None and result["serving_limit"] is None  # no text phase: not measured
