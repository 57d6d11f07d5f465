"""Every use of LitServe's internals by ``geograph serve``, in one place: the seams.

The rest of :mod:`geograph.serve` uses LitServe's public API (``LitAPI``, ``LitServer``,
``Logger``); where its behaviour had to change, the override is here, and so is every read of a
private LitServe name. Written against LitServe 0.2.19 and checked for :data:`TESTED_RANGE`,
the serve extra's requirement; ``tests/test_litserve_seams.py`` checks without starting a server
that each name below still exists with the parameters used here, so an upgrade that moves one
fails there.

Overrides (each says the upstream behaviour it changes and why):

* ``LitServer._register_api_endpoints``: one POST route per route of the API (:attr:`GeoAPI.routes
  <geograph.serve.api.GeoAPI.routes>`), all on the API's one queue, each handled by
  :class:`ForgetfulHandler`, without LitServe's ``no_auth`` dependency (upstream: one route,
  ``api_path``, LitServe's handler, and an auth dependency always, which FastAPI runs in its
  thread pool when it is the synchronous ``no_auth``);
* ``LitServer._start_worker_monitoring``: geograph's monitor
  (:func:`~geograph.serve.lifecycle.watch_workers`) instead of LitServe's, and the thread that
  prints where the server listens once it answers (:func:`~geograph.serve.lifecycle.announce_ready`);
* ``LitServer._init_manager``: notes LitServe's logger processes, to stop them first, and gives
  the API servers a response transport read by one thread (:class:`ThreadedReceiveTransport`);
* ``MPQueueTransport.areceive``: a response queue read by one reader thread, not by a thread-pool
  call per answer (:class:`ThreadedReceiveTransport`);
* ``LitServer._perform_graceful_shutdown``: the logger processes stop before the manager, drained
  API servers are left out, the inference workers stop together;
* ``RegularRequestHandler._submit_request`` and ``handle_request``: a request's entry leaves the
  response table whatever happens to the request, and a worker's :class:`VersionConflict` answer
  becomes that request's 409 (:class:`ForgetfulHandler`);
* ``BatchedLoop.get_batch_requests``: a batch collected by blocking waits, bounded by its texts
  and their tokens (:class:`WaitingBatchedLoop`), each request's wait noted for the timings;
* ``LitLoop.put_response``: the answers go out from a sender thread of the worker, not from the
  thread that computes the next batch (:class:`WaitingBatchedLoop`).

Private names read or called: ``LitServer._callback_runner``, ``LitServer._register_spec_endpoints``
(in the routes' override), ``LitServer._inference_workers_config_for_api``
(:func:`worker_status_keys`), ``LitAPI._logger_queue`` (:func:`logging_enabled`),
``litserve.loops.base._SENTINEL_VALUE`` and ``_StopLoopError`` (the batch loop's stop),
``litserve.server.no_auth`` (compared with, in the routes' override), ``LitServer._transport``
and ``MPQueueTransport._queues`` / ``_closed`` (:class:`ThreadedReceiveTransport`), and the
queue item ``(response_queue_id, uid, arrival time, payload)`` that ``_submit_request`` puts and
the loop reads. Also multiprocessing's ``SyncManager._process`` (:func:`manager_pid`).
"""

from __future__ import annotations

import contextvars
import logging
import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from queue import Empty
from typing import Any

from geograph.serve.lifecycle import announce_ready, stop_processes, watch_workers

try:
    import litserve as ls
except ImportError:  # pragma: no cover - exercised only without the serve extra
    ls = None  # only without the serve extra

#: the LitServe versions these seams were checked against (the serve extra's requirement in pyproject.toml)
TESTED_RANGE = ">=0.2.19,<0.3"

#: seconds an idle worker's blocking wait for the next request lasts before it looks again
IDLE_WAIT = 0.5

#: seconds a stopping worker waits for its sender thread to hand over the answers it holds
FLUSH_WAIT = 5.0

log = logging.getLogger(__name__)


class VersionConflict(str):
    """A worker's answer to a request the served corpus version cannot take (checked against the
    limits of the version before a reload): :class:`ForgetfulHandler` turns it into a 409 with this
    line (LitServe answers a batch's error to every request of the batch; this marker is one request's)."""


def logging_enabled(api: Any) -> bool:
    """Whether LitServe gave the LitAPI ``api`` its logger queue (``LitAPI.log`` puts nothing before).

    LitServe sets ``LitAPI._logger_queue`` before the API servers and the workers start, and only
    when the server has loggers; ``LitAPI.log`` without it warns on every call.
    """
    return getattr(api, "_logger_queue", None) is not None


def worker_status_keys(server: Any) -> list[str]:
    """The inference workers' keys in ``server.workers_setup_status``, in the order of
    ``server.inference_workers`` (LitServe names them ``{endpoint}_{i}``, endpoint the last part
    of the API's path)."""
    keys = []
    for api in server.litapi_connector:
        endpoint = api.api_path.split("/")[-1]
        keys += [f"{endpoint}_{i}" for i in range(len(server._inference_workers_config_for_api(api.api_path)))]
    return keys


def manager_pid(server: Any) -> int | None:
    """The pid of the server's queue manager process (``None`` before it starts): LitServe keeps the
    ``multiprocessing`` manager in ``transport_config.manager``, which holds its process in ``_process``."""
    manager = getattr(getattr(server, "transport_config", None), "manager", None)
    process = getattr(manager, "_process", None)
    pid: int | None = getattr(process, "pid", None)
    return pid


def collected(
    loop: Any,
    payloads: list[tuple[Any, Any, Any]],
    timed_out: list[tuple[Any, Any]],
    arrivals: dict[int, float],
) -> tuple[list[tuple[Any, Any, Any]], list[tuple[Any, Any]]]:
    """``(payloads, timed_out)``, a batch the loop collected, after noting on the loop
    (``loop.waits``) the seconds each of its requests waited, from its arrival to now (the batch's
    start), by the id of its payload: the API's ``predict`` reports them as the ``queue`` stage."""
    now = time.monotonic()
    loop.waits = {key: now - arrived for key, arrived in arrivals.items()}
    return payloads, timed_out


def _endpoint(
    handler: Any, request_type: type[Any], response_type: type[Any] | None
) -> Callable[[Any], Coroutine[Any, Any, Any]]:
    """The FastAPI endpoint function of one route: the request, validated as ``request_type``, to ``handler``."""

    async def endpoint_handler(request: Any) -> Any:
        return await handler.handle_request(request, request_type)

    # real classes, not the strings of this module's postponed annotations: FastAPI reads them
    endpoint_handler.__annotations__ = {"request": request_type, "return": response_type}
    return endpoint_handler


def read_answers(transport: Any, source: Any, loop: Any, inbox: Any) -> None:
    """A reader thread of :class:`ThreadedReceiveTransport`: each item of the queue ``source`` onto the
    :class:`asyncio.Queue` ``inbox`` in ``loop``'s thread, in order, until ``transport`` is closed,
    the queue's manager is gone or the loop is closed."""
    while not transport._closed:
        try:
            item = source.get(timeout=1)
        except Empty:
            continue
        except (EOFError, OSError):  # the manager is gone: the server is stopping
            return
        try:
            loop.call_soon_threadsafe(inbox.put_nowait, item)
        except RuntimeError:  # the event loop is closed
            return


class AnswerSender:
    """A sender thread of the process, started at its first answer: :meth:`hand_over` queues a call
    and returns, the thread makes the calls in the order they were queued; a failed call is
    logged and loses only its answer. Pickled without the thread and its queue (a copy in another
    process starts its own)."""

    def hand_over(self, send: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Queue ``send(*args)`` for the sender thread."""
        outbox = getattr(self, "outbox", None)
        if outbox is None:  # the first answer in this process
            self.outbox = outbox = queue.Queue()
            threading.Thread(target=self._send, args=(outbox,), daemon=True, name="geograph-sender").start()
        outbox.put((send, args))

    @staticmethod
    def _send(outbox: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
        while True:
            send, args = outbox.get()
            try:
                send(*args)
            except Exception:  # one answer lost (its request times out) must not stop the others
                log.exception("geograph serve: an answer could not be sent")
            finally:
                outbox.task_done()

    def flush(self, seconds: float = FLUSH_WAIT) -> bool:
        """Wait up to ``seconds`` until the sender thread has made every queued call; whether it has."""
        outbox = getattr(self, "outbox", None)
        end = time.monotonic() + seconds
        while outbox is not None and outbox.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.005)
        return outbox is None or not outbox.unfinished_tasks

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("outbox", None)  # the thread and its queue belong to this process
        return state


if ls is not None:
    from litserve.loops.base import _SENTINEL_VALUE, _StopLoopError
    from litserve.loops.simple_loops import BatchedLoop
    from litserve.server import RegularRequestHandler, no_auth
    from litserve.transport.process_transport import MPQueueTransport
    from litserve.utils import LitAPIStatus, LoopResponseType

    _uid_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("geograph_request_uid", default=None)

    class ForgetfulHandler(RegularRequestHandler):  # type: ignore[misc]  # litserve is untyped
        """LitServe's request handler that always removes its request's entry from the API
        server's response table. LitServe removes it only after the answer came: a request
        cancelled while it waits (a 504 of :class:`~geograph.serve.middleware.DeadlineMiddleware`,
        a client gone while the server stops) left its entry behind, and the answer arriving later
        filled it, for ever (memory grew with every 504)."""

        async def _submit_request(self, payload: Any) -> tuple[str, Any]:
            # upstream: puts the request on the queue and returns its uid; here the uid is also
            # noted for handle_request, which must forget the uid's entry
            uid, queue_id = await super()._submit_request(payload)
            _uid_var.set(uid)  # the handler's task sees it after this coroutine returns
            return uid, queue_id

        async def handle_request(self, request: Any, request_type: type[Any]) -> Any:
            # upstream: the response table's entry is removed only when the answer came; here
            # also when the request is cancelled or fails
            token = _uid_var.set(None)
            try:
                response = await super().handle_request(request, request_type)
                if isinstance(response, VersionConflict):  # one request of the batch: its own 409
                    from fastapi import HTTPException

                    raise HTTPException(status_code=409, detail=str(response))
                return response
            finally:
                uid = _uid_var.get()
                if uid is not None:
                    self.server.response_buffer.pop(uid, None)
                _uid_var.reset(token)

    class ThreadedReceiveTransport(MPQueueTransport):  # type: ignore[misc]  # litserve is untyped
        """LitServe's response transport of ``multiprocessing`` manager queues, read in an API server
        by one reader thread per response queue that hands each answer to the event loop.

        Upstream, every answer read is an ``asyncio.to_thread`` call (a thread-pool task, its
        future and its wake-up) around one blocking ``get``; a py-spy profile of the HTTP front
        under load showed that machinery as a large part of its time. Here one daemon thread
        blocks on the queue and puts each answer on an :class:`asyncio.Queue` with
        ``call_soon_threadsafe``; it ends when the transport is closed, the manager is gone or
        the event loop is closed. Pickled as LitServe's own transport (the workers only send).
        """

        async def areceive(self, consumer_id: int, timeout: float | None = None, block: bool = True) -> Any:
            # upstream: asyncio.to_thread(queue.get, timeout=<= 1 s) for every answer, None on a timeout
            import asyncio

            if self._closed:
                raise asyncio.CancelledError("Transport closed")
            inboxes = self.__dict__.setdefault("inboxes", {})
            if consumer_id not in inboxes:  # the first read in this process: start the reader
                inbox: asyncio.Queue[Any] = asyncio.Queue()
                inboxes[consumer_id] = inbox
                loop = asyncio.get_running_loop()
                threading.Thread(
                    target=read_answers,
                    args=(self, self._queues[consumer_id], loop, inbox),
                    daemon=True,
                    name=f"geograph-answers-{consumer_id}",
                ).start()
            if timeout is None:
                return await inboxes[consumer_id].get()
            try:
                return await asyncio.wait_for(inboxes[consumer_id].get(), min(timeout, 1))
            except TimeoutError:
                return None

        def __reduce__(self) -> Any:
            return (MPQueueTransport, (None, self._queues))

    class GeoLitServer(ls.LitServer):  # type: ignore[misc]  # litserve is untyped
        """LitServer with geograph's worker monitor (:func:`~geograph.serve.lifecycle.watch_workers`)
        and a quiet shutdown: the logger process stops before the manager does, and API servers
        that :func:`~geograph.serve.lifecycle.drain_api_servers` already stopped are left out
        (LitServe would warn that they are "already not alive")."""

        def _register_api_endpoints(self, lit_api: Any, request_type: type[Any], response_type: type[Any]) -> Any:
            # LitServe 0.2.19's own method (pyproject caps litserve<0.3) with :class:`ForgetfulHandler`,
            # and a POST route for each of the API's routes (GeoAPI.routes: path -> request
            # model), all on the API's one queue
            if lit_api.stream:
                return super()._register_api_endpoints(lit_api, request_type, response_type)
            from fastapi import Depends
            from litserve.callbacks import EventTypes

            self._callback_runner.trigger_event(EventTypes.ON_SERVER_START.value, litserver=self)
            handler = ForgetfulHandler(lit_api, self)
            # LitServe's "no auth" is a sync dependency that FastAPI runs in its thread pool, a thread
            # hop for every request: left out (geograph's key check is a middleware, geograph.serve.auth)
            auth = self.setup_auth(lit_api)
            dependencies = [] if auth is no_auth else [Depends(auth)]
            routes = getattr(lit_api, "routes", {lit_api.api_path: request_type})
            responses = getattr(lit_api, "responses", {})
            if not lit_api.spec:
                for path, model in routes.items():
                    self.app.add_api_route(
                        path,
                        _endpoint(handler, model, responses.get(path, response_type)),
                        methods=["POST"],
                        dependencies=dependencies,
                        summary=getattr(lit_api, "summaries", {}).get(path),
                    )
            self._register_spec_endpoints(lit_api)

        def _start_worker_monitoring(self, manager: Any, uvicorn_workers: Any) -> None:
            # upstream: a thread that restarts (or reports and stops on) a dead worker, and shuts
            # the server down from that thread while the main thread still waits on the manager;
            # here geograph's monitor: a dead worker stops the server with status 1
            threading.Thread(target=watch_workers, args=(self,), daemon=True, name="geograph-worker-monitor").start()
            if hasattr(self, "ready_line"):  # the line that says where it listens, once /health says ok
                threading.Thread(target=announce_ready, args=(self,), daemon=True, name="geograph-ready").start()

        def _init_manager(self, num_api_servers: int) -> Any:
            # upstream: starts the manager process and LitServe's logger process; here the latter
            # is noted, for _perform_graceful_shutdown to stop it first
            before = {p.pid for p in mp.active_children()}
            manager = super()._init_manager(num_api_servers)
            ours = getattr(getattr(manager, "_process", None), "pid", None)
            self.logger_processes = [p for p in mp.active_children() if p.pid not in before and p.pid != ours]
            transport: Any = self.__dict__["_transport"]  # set by upstream's _init_manager
            if type(transport) is MPQueueTransport:  # the API servers, forked later, inherit it
                self._transport = ThreadedReceiveTransport(None, transport._queues)
            return manager

        def _perform_graceful_shutdown(
            self, manager: Any, uvicorn_workers: dict[Any, Any], shutdown_reason: str = "normal"
        ) -> None:
            # upstream: stops the API servers (warning about those already stopped), the workers
            # one after another, then the manager, and never the logger process; here the logger
            # first, the drained API servers left out, the workers together
            live = {i: w for i, w in uvicorn_workers.items() if w.is_alive()}
            # the logger loops on a queue of the manager for ever: stopped after the manager,
            # it dies in an EOFError traceback
            stop_processes(getattr(self, "logger_processes", []), self.uvicorn_graceful_timeout)
            if not live:  # the API servers are drained: stop the workers together (LitServe
                # stops them one after another, up to 5 s each while one finishes a batch)
                stop_processes(self.inference_workers, 5)
            super()._perform_graceful_shutdown(manager, live, shutdown_reason)

    class WaitingBatchedLoop(AnswerSender, BatchedLoop):  # type: ignore[misc]  # litserve is untyped
        """LitServe's batched loop with a batch collected by blocking waits, not by polling.

        LitServe 0.2 fills a batch with ``get(timeout=0.001)`` calls on the request queue, a
        proxy of a :class:`multiprocessing.Manager` queue: every call is a round trip to the
        manager process, about a thousand a second per idle worker (measured: 6.5% of a core per
        idle worker and 20% in the manager, taken from the busy worker on a 2-core machine).
        Here a worker waits for a batch's first request in one blocking call (up to
        :data:`IDLE_WAIT` s), then for more until ``batch_timeout`` after it, then takes what is
        already queued, up to ``max_batch_size`` requests, and no more once the batch's texts
        to encode (:func:`~geograph.serve.schema.request_texts`) reach ``max_batch_texts``,
        never past ``max_batch_tokens`` padded tokens to encode (``lit_api.request_tokens``: each
        text's token count rounded up to its bucket, tokenized here and kept for the encoding;
        the request that would pass it is held back and opens the next batch, and one over it
        alone runs alone, so no request waits for ever and the requests keep their order), and
        never past a padded size (requests x their largest candidate count,
        :func:`~geograph.serve.schema.request_candidates`) of ``max_batch_candidates``: the request
        that would pass it is held back and opens the next batch:
        encoding the request texts is most of a batch's time on the CPU and a ``/rerank``
        request with candidate texts weighs as many queries, so the bound is on the work its
        batch-mates wait for, not on a count (the requests after one with hundreds of candidate
        texts go to the next batch; the text count is checked after a request is taken, so
        those before it still wait). On ``geograph bench serve``'s mix (8 candidate texts) the
        default 64 changed nothing measurable, and 24 cost ~10% of req/s without moving p99.
        The rest of LitServe's protocol is unchanged:
        each request is acknowledged (``START``), a request older than ``request_timeout`` is
        timed out instead of run, and the stop sentinel ends the loop.

        Answers are sent by a sender thread of the worker (:meth:`put_response`), in the order
        the loop gives them: sending one is a round trip to the queue manager's process
        (pickling the answer, waiting for the manager to be scheduled), and on the compute thread
        a batch's answers, one round trip each, delayed the next batch; the sender sends them
        while the next batch encodes (torch releases the GIL). A stopping worker hands over the
        answers it holds first (up to :data:`FLUSH_WAIT` s).
        """

        def put_response(
            self,
            transport: Any,
            response_queue_id: Any,
            uid: Any,
            response_data: Any,
            status: Any,
            response_type: Any,
        ) -> None:
            # upstream: sends on the calling thread; here the answer is queued for the sender thread
            self.hand_over(
                super().put_response, (transport, response_queue_id, uid, response_data, status, response_type)
            )

        def get_batch_requests(
            self, lit_api: Any, request_queue: Any, transport: Any
        ) -> tuple[list[tuple[Any, Any, Any]], list[tuple[Any, Any]]]:
            # (here, not at the top: the logger process imports this module and needs no schema)
            from geograph.serve.schema import request_candidates, request_texts

            # upstream: polls the queue with get(timeout=0.001) until the batch is full or
            # batch_timeout has passed; here blocking waits, and a bound on the batch's texts
            payloads: list[tuple[Any, Any, Any]] = []
            timed_out: list[tuple[Any, Any]] = []
            texts, widest, tokens = 0, 0, 0
            cap = getattr(lit_api, "max_batch_texts", None)
            cells = getattr(lit_api, "max_batch_candidates", None)
            budget = getattr(lit_api, "max_batch_tokens", None)
            arrivals: dict[int, float] = {}
            item, self.held = getattr(self, "held", None), None
            if item is None:
                try:
                    item = request_queue.get(timeout=IDLE_WAIT)
                except Empty:
                    return payloads, timed_out
            end = time.monotonic() + lit_api.batch_timeout
            deadline = lit_api.request_timeout not in (-1, False)
            while True:
                if item == _SENTINEL_VALUE:
                    self.flush()  # the answers already computed go out before the worker stops
                    raise _StopLoopError()
                queue_id, uid, arrived, body = item
                if budget:  # the padded tokens its texts bring (tokenized here, kept for the encoding)
                    weight = lit_api.request_tokens(body)
                    if payloads and tokens + weight > budget:
                        self.held = item  # the next batch starts with it
                        return collected(self, payloads, timed_out, arrivals)
                    tokens += weight
                if cells:
                    width = max(widest, request_candidates(body))
                    if payloads and (len(payloads) + 1) * width > cells:
                        self.held = item  # the next batch starts with it (and acknowledges it)
                        return collected(self, payloads, timed_out, arrivals)
                    widest = width
                self.put_response(
                    transport=transport,
                    response_queue_id=queue_id,
                    uid=uid,
                    response_data=(),
                    status=LitAPIStatus.START,
                    response_type=LoopResponseType.REGULAR,
                )
                if deadline and time.monotonic() - arrived > lit_api.request_timeout:
                    timed_out.append((queue_id, uid))
                else:
                    payloads.append((queue_id, uid, body))
                    arrivals[id(body)] = arrived
                    texts += request_texts(body) if cap else 0
                if len(payloads) >= lit_api.max_batch_size or (cap and texts >= cap):
                    return collected(self, payloads, timed_out, arrivals)
                left = end - time.monotonic()
                try:
                    item = request_queue.get(timeout=left) if left > 0 else request_queue.get_nowait()
                except Empty:
                    return collected(self, payloads, timed_out, arrivals)
