"""The batch loop's sender thread: a worker's answers leave from a thread of their own, in the
order the loop gives them, a failed send loses only its answer, and a stopping worker sends
every answer it holds first."""

import pickle
import queue
import threading
import time
from types import SimpleNamespace

import pytest

from conftest import require

require("litserve")

from litserve.loops.base import _SENTINEL_VALUE, _StopLoopError  # noqa: E402
from litserve.utils import LitAPIStatus, LoopResponseType  # noqa: E402

from geograph.serve._litserve import WaitingBatchedLoop  # noqa: E402


class Transport:
    """Records each answer sent (its uid) and the thread that sent it; slow, and failing on ``fail``."""

    def __init__(self, fail=()):
        self.sent, self.threads, self.fail = [], set(), set(fail)

    def send(self, item, consumer_id):
        uid = item[0]
        time.sleep(0.002)  # a round trip to the queue manager
        if uid in self.fail:
            raise ConnectionError("the manager is gone")
        self.sent.append(uid)
        self.threads.add(threading.get_ident())


def answer(loop, transport, uid):
    loop.put_response(transport, 0, uid, {"uid": uid}, LitAPIStatus.OK, LoopResponseType.REGULAR)


def stop(loop, transport):
    """The stop sentinel, as the worker's loop meets it."""
    q = queue.Queue()
    q.put(_SENTINEL_VALUE)
    api = SimpleNamespace(batch_timeout=0.0, request_timeout=60.0, max_batch_size=8)
    with pytest.raises(_StopLoopError):
        loop.get_batch_requests(api, q, transport)


def test_answers_leave_from_a_sender_thread_in_order_and_a_stop_sends_them_all_first():
    loop, transport = WaitingBatchedLoop(), Transport()
    start = time.perf_counter()
    for uid in range(40):
        answer(loop, transport, uid)
    queued = time.perf_counter() - start
    assert queued < 40 * 0.002, "the compute thread waited for the sends"
    stop(loop, transport)
    assert transport.sent == list(range(40)), "an answer lost, sent twice or out of order"
    assert transport.threads and threading.get_ident() not in transport.threads


def test_a_failed_send_loses_only_its_answer():
    loop, transport = WaitingBatchedLoop(), Transport(fail={3})
    for uid in range(8):
        answer(loop, transport, uid)
    assert loop.flush()
    assert transport.sent == [0, 1, 2, 4, 5, 6, 7]


def test_a_loop_that_sent_answers_pickles_without_its_sender():
    loop, transport = WaitingBatchedLoop(), Transport()
    answer(loop, transport, 0)
    assert loop.flush()
    copy = pickle.loads(pickle.dumps(loop))
    assert getattr(copy, "outbox", None) is None
    answer(copy, transport, 1)  # the copy starts its own sender
    assert copy.flush() and transport.sent == [0, 1]
