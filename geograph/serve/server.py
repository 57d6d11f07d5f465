"""Building and running the LitServe server of ``geograph serve``, with a clean lifecycle.

:func:`build_server` checks everything it can in the main process before any worker starts
(the corpus is read and embedded through the on-disk cache, the module is built once, so
bad parameters and artefacts fail here with one line) and fills the request limits.
:func:`run` turns SIGTERM and SIGINT into LitServe's graceful shutdown (API servers get
``shutdown_timeout`` seconds for in-flight requests, then the workers stop) and, whatever
happened, ends every process the server started that is still alive (a walk of the process
tree: SIGTERM, then SIGKILL after ``shutdown_timeout``), so no worker, API server, logger or
manager process outlives the command.

A normal stop is quiet (no traceback, no leak warning). :class:`GeoLitServer` orders LitServe's
shutdown: its logger process blocks on a queue held by the manager process, and LitServe shuts
the manager down without stopping the logger, which then dies in an ``EOFError`` traceback; here
the logger is stopped first. The inference workers leave on SIGTERM through ``SystemExit``
(:func:`worker_signals`) so that multiprocessing runs their finalizers: a worker killed by the
signal's default action never unlinks the named semaphores libraries create in it (tqdm's lock,
made when transformers shows a progress bar loading the encoder), and the resource tracker
reports them as leaked when the server exits. A terminal's Ctrl-C reaches the whole process
group: the workers and the logger ignore SIGINT and the main process coordinates the stop.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

from geograph.serve.config import ServeConfig
from geograph.serve.models import RERANKERS, build_model, k_bounds, score_bounds

log = logging.getLogger("geograph.serve")

#: the routes whose answers come from an inference worker (the deadline applies to them)
INFERENCE_ROUTES = ("/retrieve", "/rerank", "/v1/rerank", "/v2/rerank")


class StartupError(RuntimeError):
    """The server could not start (one line)."""


def build_server(cfg: ServeConfig):
    """A configured :class:`litserve.LitServer` for ``cfg`` (call :func:`run` to serve it)."""
    try:
        import litserve as ls  # noqa: F401 - the extra's presence
        from fastapi.exceptions import RequestValidationError
    except ImportError:  # pragma: no cover - exercised only without the extra
        raise StartupError("geograph serve needs the serve extra: pip install 'geograph[serve]'") from None
    from geograph.serve.api import GeoAPI
    from geograph.serve.auth import APIKeyMiddleware, exposure_warning
    from geograph.serve.corpus import TextEncoder, read_corpus
    from geograph.serve.interop import MessageErrorMiddleware, add_routes
    from geograph.serve.metrics import JSONOnlyMiddleware, PrometheusLogger, RequestMetricsMiddleware, add_metrics_route
    from geograph.serve.schema import set_limits

    key = cfg.api_key.get_secret_value() if cfg.api_key is not None else None
    warning = exposure_warning(cfg.host, key)
    if warning is not None:
        print(f"geograph serve: {warning}", file=sys.stderr, flush=True)
    try:
        dataset = read_corpus(cfg.corpus)
        encoder = TextEncoder(
            cfg.encoder, query_prefix=cfg.query_prefix, passage_prefix=cfg.passage_prefix, cache=cfg.cache, memory=0
        )
        emb = encoder.corpus(dataset.passages())  # fills the on-disk cache before the workers start
    except (ValueError, OSError) as e:
        raise StartupError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    try:
        model = build_model(cfg.method, emb, cfg.params, graph=cfg.graph, projection=cfg.projection)
    except ValueError as e:
        msg = str(e).splitlines()[0]
        raise StartupError(
            msg if msg.split(":")[0] in ("params", "graph", "projection") else f"params: {msg}"
        ) from None
    v = int(emb.shape[0])
    if cfg.method in RERANKERS and cfg.candidates > v:
        raise StartupError(f"candidates: {cfg.candidates} exceeds the corpus size {v}")
    bounds = score_bounds(cfg.method, model) if cfg.method in RERANKERS else None
    k_min, k_max, why = k_bounds(cfg.method, model, v)
    set_limits(
        method=cfg.method,
        dim=int(emb.shape[1]),
        ids=frozenset(dataset.doc_ids),
        num_docs=v,
        max_candidates=cfg.max_candidates,
        max_k=cfg.max_k,
        default_candidates=cfg.candidates,
        k_min=k_min,
        k_max=k_max,
        k_max_reason=why,
    )
    del model, emb

    settings = cfg.model_dump()
    workers = workers_per_device(cfg.workers_per_device, cfg.accelerator)
    settings["worker_threads"] = worker_threads(
        cfg.threads, workers * (cfg.devices if isinstance(cfg.devices, int) else 1)
    )
    apis = [GeoAPI(settings)]  # one queue and one pool of workers for every endpoint (geograph.serve.api)
    devices = cfg.devices
    # the last middleware runs first: metrics count every answer, 401s and 504s included;
    # LitServe's payload limit is outside them all, and the interop error bodies are rewritten last
    middlewares = [(DeadlineMiddleware, {"seconds": cfg.request_timeout}), JSONOnlyMiddleware]
    if key is not None:
        middlewares.append((APIKeyMiddleware, {"key": key, "public": cfg.public}))
    middlewares.append((RequestMetricsMiddleware, {"apis": apis, "stopping": _stopping_flag()}))
    server = _server_class()(
        apis,
        accelerator=cfg.accelerator,
        devices=devices,
        workers_per_device=workers,
        timeout=cfg.request_timeout,
        max_payload_size=int(cfg.max_payload_mb * 2**20),
        loggers=[PrometheusLogger()],
        middlewares=middlewares,
    )
    server.app.add_exception_handler(RequestValidationError, _validation_error)
    add_metrics_route(server.app)
    if cfg.method in RERANKERS:
        add_routes(server.app, method=cfg.method, bounds=bounds)
        server.app.add_middleware(MessageErrorMiddleware)
    server.uvicorn_graceful_timeout = cfg.shutdown_timeout
    return server


#: the most inference workers per device ``workers_per_device="auto"`` starts on the CPU (each
#: holds its own copy of the model, the encoder and the corpus; they serve every endpoint)
MAX_AUTO_WORKERS = 4


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def workers_per_device(workers, accelerator: str) -> int:
    """Inference workers per device (one pool serves every endpoint): ``workers``, or for
    ``"auto"`` one per usable CPU (at most :data:`MAX_AUTO_WORKERS`) when the server runs on the
    CPU, else 1.

    Why: request texts are encoded on one thread per worker (the price of vectors that do not
    depend on batch-mates, :mod:`geograph.serve.corpus`), so one worker leaves the other cores
    idle under text traffic: on the 2-core machine ``/retrieve`` with distinct query texts went
    from 115 to 143-157 req/s with two workers (issue 26). More busy workers than cores cost
    throughput (two pools of two workers, or of two and four, on two cores: 113 and 92 req/s
    against one pool of two: 121 on ``geograph bench serve``'s mix, one seed).

    Example:
        >>> workers_per_device(3, "cpu"), workers_per_device("auto", "cpu") == min(usable_cpus(), MAX_AUTO_WORKERS)
        (3, True)
    """
    if workers != "auto":
        return int(workers)
    if accelerator == "auto":
        import torch

        on_cpu = not torch.cuda.is_available() and not (torch.backends.mps.is_available())
    else:
        on_cpu = accelerator == "cpu"
    return max(1, min(usable_cpus(), MAX_AUTO_WORKERS)) if on_cpu else 1


def worker_threads(threads, workers: int) -> int:
    """torch intra-op threads of each CPU inference worker: ``threads``, or for ``"auto"`` the
    usable CPUs divided among the ``workers`` (at least 1).

    Why: every worker's OpenMP pool spins at its barriers; with more threads than cores (two
    workers of two threads on two cores) a barrier waits for a thread that is not running, and
    a request text's encoding took 280 ms instead of 25 ms (measured on the shared 2-core
    machine): the p99 tail of issue 26.

    Example:
        >>> worker_threads(3, 2), worker_threads("auto", 10**6)
        (3, 1)
    """
    if threads != "auto":
        return int(threads)
    return max(1, usable_cpus() // max(1, workers))


def _server_class():
    """:class:`GeoLitServer`, made on first use (LitServe is an optional dependency)."""
    if "server_class" not in _STATE:
        import multiprocessing as mp

        import litserve as ls

        class GeoLitServer(ls.LitServer):
            """LitServer with geograph's worker monitor (:func:`watch_workers`) and a quiet shutdown:
            the logger process stops before the manager does, and API servers that
            :func:`drain_api_servers` already stopped are left out (LitServe would warn that
            they are "already not alive")."""

            def _register_api_endpoints(self, lit_api, request_type, response_type):
                # LitServe 0.2.19's own method (pyproject caps litserve<0.3) with :class:`ForgetfulHandler`,
                # and a POST route for each of the API's routes (GeoAPI.routes: path -> request
                # model), all on the API's one queue
                if lit_api.stream:
                    return super()._register_api_endpoints(lit_api, request_type, response_type)
                from fastapi import Depends
                from litserve.callbacks import EventTypes

                self._callback_runner.trigger_event(EventTypes.ON_SERVER_START.value, litserver=self)
                handler = _handler_class()(lit_api, self)
                routes = getattr(lit_api, "routes", {lit_api.api_path: request_type})
                if not lit_api.spec:
                    for path, model in routes.items():
                        self.app.add_api_route(
                            path,
                            _endpoint(handler, model, response_type),
                            methods=["POST"],
                            dependencies=[Depends(self.setup_auth(lit_api))],
                        )
                self._register_spec_endpoints(lit_api)

            def _start_worker_monitoring(self, manager, uvicorn_workers):
                threading.Thread(
                    target=watch_workers, args=(self,), daemon=True, name="geograph-worker-monitor"
                ).start()

            def _init_manager(self, num_api_servers):
                # starts the manager process and LitServe's logger process: note the latter
                before = {p.pid for p in mp.active_children()}
                manager = super()._init_manager(num_api_servers)
                ours = getattr(getattr(manager, "_process", None), "pid", None)
                self.logger_processes = [p for p in mp.active_children() if p.pid not in before and p.pid != ours]
                return manager

            def _perform_graceful_shutdown(self, manager, uvicorn_workers, shutdown_reason="normal"):
                live = {i: w for i, w in uvicorn_workers.items() if w.is_alive()}
                # the logger loops on a queue of the manager for ever: stopped after the manager,
                # it dies in an EOFError traceback
                stop_processes(getattr(self, "logger_processes", []), self.uvicorn_graceful_timeout)
                if not live:  # the API servers are drained: stop the workers together (LitServe
                    # stops them one after another, up to 5 s each while one finishes a batch)
                    stop_processes(self.inference_workers, 5)
                super()._perform_graceful_shutdown(manager, live, shutdown_reason)

        _STATE["server_class"] = GeoLitServer
    return _STATE["server_class"]


def _endpoint(handler, request_type, response_type):
    """The FastAPI endpoint function of one route: the request, validated as ``request_type``, to ``handler``."""

    async def endpoint_handler(request):
        return await handler.handle_request(request, request_type)

    # real classes, not the strings of this module's postponed annotations: FastAPI reads them
    endpoint_handler.__annotations__ = {"request": request_type, "return": response_type}
    return endpoint_handler


def _handler_class():
    """:class:`ForgetfulHandler`, made on first use (LitServe is an optional dependency)."""
    if "handler_class" not in _STATE:
        import contextvars

        from litserve.server import RegularRequestHandler

        uid_var: contextvars.ContextVar = contextvars.ContextVar("geograph_request_uid", default=None)

        class ForgetfulHandler(RegularRequestHandler):
            """LitServe's request handler that always removes its request's entry from the API
            server's response table. LitServe removes it only after the answer came: a request
            cancelled while it waits (a 504 of :class:`DeadlineMiddleware`, a client gone while
            the server stops) left its entry behind, and the answer arriving later filled it,
            for ever (memory grew with every 504)."""

            async def _submit_request(self, payload):
                uid, queue_id = await super()._submit_request(payload)
                uid_var.set(uid)  # the handler's task sees it after this coroutine returns
                return uid, queue_id

            async def handle_request(self, request, request_type):
                token = uid_var.set(None)
                try:
                    return await super().handle_request(request, request_type)
                finally:
                    uid = uid_var.get()
                    if uid is not None:
                        self.server.response_buffer.pop(uid, None)
                    uid_var.reset(token)

        _STATE["handler_class"] = ForgetfulHandler
    return _STATE["handler_class"]


def _stopping() -> bool:
    return "stopping" in _STATE and bool(_STATE["stopping"].value)


def watch_workers(server, interval: float = 0.5) -> None:
    """The worker monitor (a thread of the main process, replacing LitServe's).

    An inference worker that dies while the server serves (the OOM killer, a segfault) makes
    the server stop with exit status 1, so that its supervisor restarts it: within ``interval``
    the worker's status is set to error (``/health``: ``not ready`` on a connection still open),
    one line names the worker and its signal or status, then SIGTERM to this process runs the
    normal stop (the API servers stop accepting connections, so a new health check gets no
    answer or a refused connection, and drain: requests the remaining workers can answer are
    answered, the others get 503 after ``shutdown_timeout``; then the port closes). Workers that stop while the
    server stops are not reported.
    LitServe's own monitor would report those, and shuts down from its thread while the main
    thread still waits on the manager.
    """
    from litserve.utils import WorkerSetupStatus

    keys = []  # the workers' status keys, in the order of server.inference_workers
    for api in server.litapi_connector:
        endpoint = api.api_path.split("/")[-1]
        keys += [f"{endpoint}_{i}" for i in range(len(server._inference_workers_config_for_api(api.api_path)))]
    while not _stopping():
        for key, proc in zip(keys, list(server.inference_workers)):
            if proc.is_alive() or _stopping():
                continue
            code = proc.exitcode
            how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit status {code}"
            _STATE["failure"] = f"inference worker {key} (pid {proc.pid}) died ({how}); the server stopped"
            print(
                f"geograph serve: inference worker {key} (pid {proc.pid}) died ({how}); stopping",
                file=sys.stderr,
                flush=True,
            )
            try:
                server.workers_setup_status[key] = WorkerSetupStatus.ERROR  # /health: not ready
            except Exception:  # the manager is gone: the server is stopping anyway
                pass
            os.kill(os.getpid(), signal.SIGTERM)
            return
        time.sleep(interval)


def stop_processes(procs, timeout: float) -> None:
    """SIGTERM the multiprocessing processes ``procs`` (children of this one), SIGKILL after ``timeout`` s."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join(timeout)


def worker_signals() -> None:
    """Signal handling of an inference worker (called first in its ``setup``).

    SIGINT is ignored (a terminal's Ctrl-C reaches the whole process group; the main process
    stops the server); SIGTERM raises ``SystemExit(0)`` once, so the process leaves through
    multiprocessing's exit path, which runs its finalizers (named semaphores are unlinked).
    """
    import multiprocessing as mp

    if mp.current_process().name == "MainProcess":  # a worker's setup called in-process (tests): leave it
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the exit short (SIGKILL still does)
    raise SystemExit(0)


class DeadlineMiddleware:
    """ASGI middleware: a POST to an inference route still unanswered after ``seconds`` gets 504.

    LitServe's own ``timeout`` only drops a request that waited that long in the queue, when a
    worker takes it; a request whose worker hangs or dies is never answered. Here the request's
    handler is cancelled at its deadline (the API server forgets it) and the client gets
    ``504 {"detail": "no answer within request_timeout (S s)"}``.
    """

    def __init__(self, app, seconds: float) -> None:
        self.app, self.seconds = app, float(seconds)

    async def __call__(self, scope, receive, send) -> None:
        import asyncio

        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in INFERENCE_ROUTES:
            await self.app(scope, receive, send)
            return
        started = [False]

        async def send_(message):
            if message["type"] == "http.response.start":
                started[0] = True
            await send(message)

        try:
            await asyncio.wait_for(self.app(scope, receive, send_), self.seconds)
        except asyncio.TimeoutError:
            if started[0]:  # the answer is on its way already: it cannot become a 504
                return
            body = json.dumps({"detail": f"no answer within request_timeout ({self.seconds:g} s)"}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 504,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                }
            )
            await send({"type": "http.response.body", "body": body})


def _validation_error(request, exc):
    """422 with each error's location and message only: the default echoes the input, which
    cannot be rendered as JSON when it holds NaN, and can be megabytes long."""
    from fastapi.responses import JSONResponse

    errors = [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")} for e in exc.errors()
    ]
    return JSONResponse(status_code=422, content={"detail": errors})


_STATE: dict = {}


def _stopping_flag():
    """A flag shared with the API servers (forked later): set when the server starts to stop."""
    import multiprocessing as mp

    if "stopping" not in _STATE:
        _STATE["stopping"] = mp.get_context("fork").Value("b", 0, lock=False)
    return _STATE["stopping"]


def _interrupt(signum, frame):
    """SIGTERM/SIGINT in the main process: drain the API servers, then LitServe's shutdown."""
    if "stopping" in _STATE:
        _STATE["stopping"].value = 1
    if not _STATE.get("draining") and "port" in _STATE:
        _STATE["draining"] = True
        manager = getattr(getattr(_STATE.get("server"), "transport_config", None), "manager", None)
        process = getattr(manager, "_process", None)
        drain_api_servers(_STATE["port"], _STATE["timeout"], exclude={getattr(process, "pid", None)})
    raise KeyboardInterrupt(signal.Signals(signum).name)


def drain_api_servers(port: int, timeout: float, exclude=frozenset()) -> None:
    """SIGTERM the API server processes (the children listening on ``port``) and wait for them.

    ``exclude``: pids to leave alone (LitServe's queue manager inherits the listening socket).

    uvicorn then stops accepting connections and lets in-flight requests finish (for at most
    ``timeout`` seconds) while the inference workers are still up to answer them; LitServe's
    own shutdown, which runs next, closes the queues first.
    """
    import multiprocessing as mp

    import psutil

    ours = {p.pid: p for p in mp.active_children()}
    servers = []
    for p in psutil.Process().children():
        if p.pid in exclude:
            continue
        try:
            if any(
                c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in p.net_connections("tcp")
            ):
                servers.append(p)
        except psutil.Error:
            pass
    for p in servers:
        try:
            p.terminate()
        except psutil.Error:
            pass
    # wait through multiprocessing where it started the process: it then knows the process
    # ended (a wait by psutil reaps it, and LitServe would find it alive and SIGKILL its pid)
    deadline = time.monotonic() + timeout + 1
    for p in servers:
        if p.pid in ours:
            ours[p.pid].join(max(0.0, deadline - time.monotonic()))
        else:
            psutil.wait_procs([p], timeout=max(0.0, deadline - time.monotonic()))


def _default_signals() -> None:  # in forked API servers: uvicorn installs its own handlers
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, signal.SIG_DFL if s == signal.SIGTERM else signal.default_int_handler)


def stop_children(timeout: float) -> list[int]:
    """SIGTERM every live descendant of this process, SIGKILL what remains after ``timeout`` s; their pids."""
    from multiprocessing import resource_tracker

    import psutil

    me = psutil.Process()
    try:
        procs = me.children(recursive=True)
    except psutil.Error:
        return []
    # multiprocessing's resource tracker ignores SIGTERM by design and exits by itself when this
    # process does (its pipe closes); signalling it would only cost the timeout
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    procs = [p for p in procs if p.pid != tracker]
    log.info("stopping %d remaining processes: %s", len(procs), [p.pid for p in procs])
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=timeout)
    log.info("stopped; %d needed SIGKILL", len(alive))
    return [p.pid for p in procs]


def run(cfg: ServeConfig) -> int:
    """Serve ``cfg`` until SIGTERM/SIGINT; 0 after a clean stop, 1 after a stop because an inference
    worker died (raises :class:`StartupError`)."""
    own_dir: str | None = None
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:  # before prometheus_client is imported anywhere
        own_dir = tempfile.mkdtemp(prefix="geograph-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = own_dir
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main_pid = os.getpid()
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    os.register_at_fork(after_in_child=_default_signals)
    for key in ("draining", "port", "failure"):
        _STATE.pop(key, None)
    if "stopping" in _STATE:
        _STATE["stopping"].value = 0
    try:
        server = build_server(cfg)
        _STATE.update(port=cfg.port, timeout=cfg.shutdown_timeout, server=server)
        server.run(
            host=cfg.host,
            port=cfg.port,
            num_api_servers=cfg.api_servers,
            generate_client_file=False,
            log_level=cfg.log_level,
            pretty_logs=False,
        )
    except KeyboardInterrupt:
        pass
    except RuntimeError as e:
        if os.getpid() != main_pid:  # a forked API server unwinding: leave it to its parent
            raise
        raise StartupError(str(e).splitlines()[0]) from None
    finally:
        if os.getpid() == main_pid:
            for s in previous:
                signal.signal(s, signal.SIG_IGN)  # a second signal must not cut the clean-up short
            stop_children(cfg.shutdown_timeout)
            if own_dir is not None:
                shutil.rmtree(own_dir, ignore_errors=True)
            for s, h in previous.items():
                signal.signal(s, h)
    if "failure" in _STATE:
        print(f"geograph serve: {_STATE['failure']}", file=sys.stderr, flush=True)
        return 1
    return 0
