"""Building and running the LitServe server of ``geograph serve``.

:func:`build_server` checks everything it can in the main process before any worker starts
(the corpus is read and embedded through the on-disk cache, the module is built once, so
bad parameters and artefacts fail here with one line) and fills the request limits.
:func:`run` serves until SIGTERM or SIGINT and stops every process the server started
(:mod:`~geograph.serve.lifecycle`).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from typing import TYPE_CHECKING

from geograph.serve.config import ServeConfig
from geograph.serve.lifecycle import STATE, arm_fork_hooks, interrupt, stop_children, stopping_flag
from geograph.serve.models import RERANKERS, build_model, k_bounds, score_bounds
from geograph.serve.pool import worker_threads, workers_per_device

if TYPE_CHECKING:
    from fastapi import FastAPI

    from geograph.serve._litserve import GeoLitServer


class StartupError(RuntimeError):
    """The server could not start (one line)."""


def build_server(cfg: ServeConfig) -> GeoLitServer:
    """A configured :class:`litserve.LitServer` for ``cfg`` (call :func:`run` to serve it)."""
    try:
        import litserve as ls  # noqa: F401 - the extra's presence
        from fastapi.exceptions import RequestValidationError
    except ImportError:  # pragma: no cover - exercised only without the extra
        raise StartupError("geograph serve needs the serve extra: pip install 'geograph-rag[serve]'") from None
    from geograph.serve._litserve import GeoLitServer, worker_status_keys
    from geograph.serve.api import GeoAPI
    from geograph.serve.auth import APIKeyMiddleware, exposure_warning
    from geograph.serve.corpus import TextEncoder, read_corpus
    from geograph.serve.info import add_info_route, add_not_found_handler, describe, listening_line
    from geograph.serve.interop import MessageErrorMiddleware, add_routes
    from geograph.serve.middleware import DeadlineMiddleware, JSONOnlyMiddleware, validation_error
    from geograph.serve.prometheus import PrometheusLogger, RequestMetricsMiddleware, add_metrics_route
    from geograph.serve.schema import set_limits
    from geograph.serve.tei import add_tei_dialect

    key = cfg.api_key.get_secret_value() if cfg.api_key is not None else None
    warning = exposure_warning(cfg.host, key)
    if warning is not None:
        print(f"geograph serve: {warning}", file=sys.stderr, flush=True)
    try:
        dataset = read_corpus(cfg.corpus)
        encoder = TextEncoder(
            cfg.encoder,
            query_prefix=cfg.query_prefix,
            passage_prefix=cfg.passage_prefix,
            cache=cfg.cache,
            memory=0,
            backend=cfg.encoder_backend,
        )
        emb = encoder.corpus(dataset.passages())  # fills the on-disk cache before the workers start
    except (ValueError, OSError, ImportError) as e:
        raise StartupError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    try:
        model = build_model(
            cfg.method,
            emb,
            cfg.params,
            graph=cfg.graph,
            projection=cfg.projection,
            ids=dataset.doc_ids,
            encoder=encoder,  # its identity, and the agreement of its backend with the artefact's
        )
    except ValueError as e:
        msg = str(e).splitlines()[0]
        raise StartupError(
            msg if msg.split(":")[0] in ("params", "graph", "projection") else f"params: {msg}"
        ) from None
    v = int(emb.shape[0])
    if cfg.method in RERANKERS and cfg.candidates > v:
        raise StartupError(f"candidates: {cfg.candidates} exceeds the corpus size {v}")
    # max_candidates: the config's validator has replaced "auto" by a number
    if cfg.method in RERANKERS and cfg.candidates > min(cfg.max_candidates, cfg.max_batch_candidates):  # type: ignore[operator]
        raise StartupError(
            f"candidates: the default pool {cfg.candidates} exceeds max_candidates {cfg.max_candidates} "
            f"or max_batch_candidates {cfg.max_batch_candidates}"
        )
    bounds = score_bounds(cfg.method, model) if cfg.method in RERANKERS else None
    k_min, k_max, why = k_bounds(cfg.method, model, v)
    corpus_version = None if cfg.graph is None else int(getattr(model.graph, "corpus_version", 0))
    set_limits(
        method=cfg.method,
        dim=int(emb.shape[1]),
        ids=frozenset(dataset.doc_ids),
        num_docs=v,
        max_candidates=cfg.max_candidates,
        max_batch_candidates=cfg.max_batch_candidates,
        max_k=cfg.max_k,
        default_candidates=cfg.candidates,
        k_min=k_min,
        k_max=k_max,
        k_max_reason=why,
        corpus_version=corpus_version,
    )
    dim = int(emb.shape[1])
    del model, emb

    settings = cfg.model_dump()
    workers = workers_per_device(cfg.workers_per_device, cfg.accelerator)
    settings["worker_threads"] = worker_threads(
        cfg.threads, workers * (cfg.devices if isinstance(cfg.devices, int) else 1)
    )
    apis = [GeoAPI(settings)]  # one queue and one pool of workers for every endpoint (geograph.serve.api)
    devices = cfg.devices
    # the last middleware runs first: metrics count every answer, 401s and 504s included, and the
    # interop error bodies are rewritten last; LitServe appends its gzip compression and payload
    # limit after these, outside them all, so every middleware here reads and writes plain bodies
    middlewares = [(DeadlineMiddleware, {"seconds": cfg.request_timeout}), JSONOnlyMiddleware]
    if key is not None:
        middlewares.append((APIKeyMiddleware, {"key": key, "public": cfg.public}))
    middlewares.append((RequestMetricsMiddleware, {"apis": apis, "stopping": stopping_flag()}))
    channel = None
    if key is not None:  # POST /admin/reload only behind the key (geograph.serve.reload)
        from geograph.serve.reload import LimitsMiddleware, ReloadChannel

        channel = ReloadChannel(tempfile.mkdtemp(prefix="geograph-reload-"))
        middlewares.append((LimitsMiddleware, {"channel": channel}))
    if cfg.method in RERANKERS:
        middlewares.append(MessageErrorMiddleware)
    server = GeoLitServer(
        apis,
        accelerator=cfg.accelerator,
        devices=devices,
        workers_per_device=workers,
        timeout=cfg.request_timeout,
        max_payload_size=int(cfg.max_payload_mb * 2**20),
        loggers=[PrometheusLogger()],
        middlewares=middlewares,
    )
    server.app.add_exception_handler(RequestValidationError, validation_error)
    if channel is not None:
        from geograph.serve.reload import add_reload_route

        channel.set_workers(len(worker_status_keys(server)))  # one slot a worker
        apis[0].reload_channel = channel  # pickled with the API into every worker
        add_reload_route(server.app, channel, settings, cfg.reload_timeout)
        server.reload_directory = channel.directory
    add_metrics_route(server.app)
    if cfg.method in RERANKERS:  # a reranker's bounds are set above
        add_routes(server.app, method=cfg.method, bounds=bounds)  # type: ignore[arg-type]
        add_tei_dialect(server.app, bounds=bounds)  # type: ignore[arg-type]
    identity = encoder.identity
    about = describe(
        cfg,
        encoder={**identity.as_dict(), "dim": identity.dim or dim, "path": encoder.corpus_encoder.model_path},
        dim=dim,
        num_docs=v,
        corpus_version=corpus_version,
        workers=len(worker_status_keys(server)),
    )
    add_info_route(server.app, about, channel)
    add_not_found_handler(server.app, cfg.method)
    type_internal_routes(server.app)
    server.uvicorn_graceful_timeout = cfg.shutdown_timeout
    server.ready_line = listening_line(
        cfg.host, cfg.port, cfg.method, about["workers"]["inference_workers"], identity.name
    )
    server.probe_address = ({"0.0.0.0": "127.0.0.1", "::": "::1"}.get(cfg.host, cfg.host), cfg.port)
    return server


def type_internal_routes(app: FastAPI) -> None:
    """The OpenAPI answers of LitServe's ``GET`` routes: ``/`` and ``/health`` answer text
    (``/health``: ``ok``, or 503 ``not ready``) (the answers are unchanged; ``/info`` is geograph's,
    :mod:`~geograph.serve.info`)."""
    from fastapi.responses import PlainTextResponse

    for route in app.router.routes:
        path = getattr(route, "path", None)
        if path in ("/", "/health"):  # LitServe's APIRoutes
            route.response_class = PlainTextResponse  # type: ignore[attr-defined]
            if path == "/health":
                route.responses = {503: {"description": "not ready: a worker is starting or failed"}}  # type: ignore[attr-defined]


def run(cfg: ServeConfig) -> int:
    """Serve ``cfg`` until SIGTERM/SIGINT; 0 after a clean stop, 1 after a stop because an inference
    worker died (raises :class:`StartupError`)."""
    own_dir: str | None = None
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:  # before prometheus_client is imported anywhere
        own_dir = tempfile.mkdtemp(prefix="geograph-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = own_dir
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main_pid = os.getpid()
    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    arm_fork_hooks()  # the processes forked from here end when this one does, however it ends
    for key in ("draining", "port", "failure"):
        STATE.pop(key, None)
    if "stopping" in STATE:
        STATE["stopping"].value = 0
    try:
        server = build_server(cfg)
        STATE.update(port=cfg.port, timeout=cfg.shutdown_timeout, server=server)
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
            reload_dir = getattr(STATE.get("server"), "reload_directory", None)
            if reload_dir is not None:
                shutil.rmtree(reload_dir, ignore_errors=True)
            if own_dir is not None:
                shutil.rmtree(own_dir, ignore_errors=True)
            for s, h in previous.items():
                signal.signal(s, h)
            arm_fork_hooks(False)
    if "failure" in STATE:
        print(f"geograph serve: {STATE['failure']}", file=sys.stderr, flush=True)
        return 1
    return 0
