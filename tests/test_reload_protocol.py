"""The reload protocol of ``geograph serve`` (geograph.serve.reload) between an API server and its
workers, with workers that load in threads of this process: commit only when every worker is
ready, the answer only once every worker serves the new version, an abort on any failure or
timeout that leaves every worker on the version it served; and a version's check of requests
checked against another one's limits."""

import os
import tempfile
import threading
import time
from types import SimpleNamespace

import pytest

from geograph.serve.api import Served
from geograph.serve.reload import ReloadChannel, ReloadError, follow_reloads, refresh_limits, reload_now
from geograph.serve.schema import LIMITS, RerankRequest, RetrieveRequest, set_limits


def served(version, ids, corpus_version=None, k_max=None):
    return Served(
        version=version,
        ids=list(ids),
        index={x: i for i, x in enumerate(ids)},
        corpus=None,
        model=None,
        dense=None,
        k_min=2,
        k_max=k_max,
        k_max_reason="the corpus size",
        corpus_version=corpus_version,
    )


class Worker:
    """A worker's reload side: ``load`` gives the next corpus (or fails, or takes its time)."""

    def __init__(self, settings, ids):
        self.settings, self.ids = settings, ids
        self.served = served(0, ids)
        self.fail, self.delay, self.touch = None, 0.0, None

    def load(self, version):
        time.sleep(self.delay)
        if self.touch is not None:  # the saved files replaced while this worker reads them
            self.touch()
        if self.fail:
            raise ValueError(self.fail)
        return served(version, self.ids, corpus_version=7, k_max=len(self.ids))


@pytest.fixture
def cluster(tmp_path):
    (tmp_path / "corpus.jsonl").write_text('{"_id": "a"}\n')
    settings = {"corpus": str(tmp_path), "graph": None, "projection": None}
    channel = ReloadChannel(tempfile.mkdtemp(dir=tmp_path), 2)
    workers = [Worker(settings, ["a", "b", "c"]) for _ in range(2)]
    stop = threading.Event()
    threads = [follow_reloads(w, channel, i, stop) for i, w in enumerate(workers)]
    set_limits(method="g3", ids=frozenset(["a"]), num_docs=1, k_min=2, k_max=1)
    yield channel, settings, workers, tmp_path
    stop.set()
    for t in threads:
        t.join(timeout=5)
    set_limits()


def test_a_reload_answers_once_every_worker_serves_the_new_version(cluster):
    channel, settings, workers, _ = cluster
    answer = reload_now(channel, settings, timeout=30)
    assert answer["version"] == 1 and answer["corpus_version"] == 7 and answer["passages"] == 3
    assert [w.served.version for w in workers] == [1, 1]  # acknowledged before the answer
    refresh_limits(channel)  # (the route does it before it answers)
    assert LIMITS["num_docs"] == 3 and LIMITS["ids"] == frozenset("abc") and LIMITS["k_max"] == 3
    assert reload_now(channel, settings, timeout=30)["version"] == 2


def test_a_worker_that_cannot_load_aborts_the_reload_for_all(cluster):
    channel, settings, workers, _ = cluster
    reload_now(channel, settings, timeout=30)
    first = [w.served for w in workers]
    workers[1].fail = "graph: built over corpus 3 x 8; the corpus in use is 4 x 8"
    with pytest.raises(ReloadError) as e:
        reload_now(channel, settings, timeout=30)
    assert (
        e.value.status == 409
        and "graph: built over corpus" in str(e.value)
        and "version 1 keeps serving" in str(e.value)
    )
    time.sleep(0.2)
    assert [w.served for w in workers] == first  # the worker that loaded dropped it
    workers[1].fail = None
    assert reload_now(channel, settings, timeout=30)["version"] == 2


def test_a_slow_worker_is_a_503_and_nobody_switches(cluster):
    channel, settings, workers, _ = cluster
    workers[0].delay = 1.0
    with pytest.raises(ReloadError) as e:
        reload_now(channel, settings, timeout=0.3)
    assert e.value.status == 503 and "reload_timeout" in str(e.value)
    time.sleep(1.2)  # the slow worker finishes loading after the abort: it must not switch
    assert [w.served.version for w in workers] == [0, 0]
    workers[0].delay = 0.0
    assert reload_now(channel, settings, timeout=30)["version"] == 1


def test_files_replaced_during_the_load_fail_the_reload(cluster):
    channel, settings, workers, root = cluster

    def touch():
        (root / "corpus.new").write_text('{"_id": "b"}\n')
        os.replace(root / "corpus.new", root / "corpus.jsonl")

    workers[0].touch = touch
    with pytest.raises(ReloadError, match="changed while they were read"):
        reload_now(channel, settings, timeout=30)
    assert [w.served.version for w in workers] == [0, 0]


def test_one_reload_at_a_time(cluster):
    channel, settings, _, _ = cluster
    assert channel.lock.acquire(block=False)  # another API server's reload under way
    try:
        with pytest.raises(ReloadError, match="another reload is under way") as e:
            reload_now(channel, settings, timeout=30)
        assert e.value.status == 409
    finally:
        channel.lock.release()


def test_a_request_checked_against_another_version_is_named_not_answered():
    set_limits(method="maniscope", dim=2, ids=frozenset(["a", "b", "gone"]), num_docs=3)
    try:
        now = served(4, ["a", "b"])
        stale = RerankRequest(query_embedding=[1.0, 0.0], candidate_ids=["a", "gone"])
        assert now.conflict(stale, "maniscope") == "candidate_ids: unknown ids ['gone']"
        assert now.conflict(RerankRequest(query_embedding=[1.0, 0.0], candidate_ids=["b"]), "maniscope") is None
        pool = RetrieveRequest(query_embedding=[1.0, 0.0], k=1, candidates=3)
        assert now.conflict(pool, "maniscope") == "candidates: 3 exceeds the corpus size 2"
        set_limits(method="g3", dim=2, k_min=2, k_max=5)
        bounded = served(4, ["a", "b", "c"], k_max=3)
        assert "k: 5 is outside [2, 3]" in bounded.conflict(RetrieveRequest(query_embedding=[1.0, 0.0], k=5), "g3")
        assert bounded.conflict(RetrieveRequest(query_embedding=[1.0, 0.0], k=3), "g3") is None
    finally:
        set_limits()


def test_a_batch_is_answered_from_the_version_it_started_on():
    """A reload's swap that lands while a batch runs (here: inside the module call) changes nothing
    in that batch's answers; the next batch is the new version's."""
    pytest.importorskip("litserve")
    import torch

    from geograph.data import DEMO_PATH
    from geograph.outputs import RetrievalOutput
    from geograph.serve.api import GeoAPI
    from geograph.serve.config import load_config

    api = GeoAPI(load_config(["--method", "g3", "--corpus", str(DEMO_PATH)]).model_dump())
    api.device = torch.device("cpu")
    new = served(1, ["c", "b", "a"])
    # the stage timings the batch reads (no request text here: nothing is encoded)
    api.encoder = SimpleNamespace(timings={"tokenise": 0.0, "encode": 0.0})

    class Model:
        def __call__(self, q, k):
            api.served = new  # the reload thread swaps here, mid-batch
            idx = torch.tensor([[0, 1]]).expand(q.shape[0], 2)
            return RetrievalOutput(indices=idx, scores=torch.tensor([[0.9, 0.5]]).expand(q.shape[0], 2))

    old = Served(
        version=0,
        ids=["a", "b", "c"],
        index={"a": 0, "b": 1, "c": 2},
        corpus=torch.eye(3),
        model=Model(),
        dense=None,
        k_min=1,
        k_max=3,
        k_max_reason="",
        corpus_version=None,
    )
    api.served = old
    set_limits(method="g3", dim=3, k_min=1, k_max=3)
    try:
        reqs = [RetrieveRequest(query_embedding=[1.0, 0.0, 0.0], k=2) for _ in range(3)]
        got = api.predict(reqs)
        assert [(a["ids"], a["version"]) for a in got] == [(["a", "b"], 0)] * 3
        new_model = Model()
        api.served = Served(**{**new.__dict__, "model": new_model, "corpus": torch.eye(3)})
        assert [(a["ids"], a["version"]) for a in api.predict(reqs[:1])] == [(["c", "b"], 1)]
    finally:
        set_limits()
