"""The processes of ``geograph serve``: signals, the worker monitor, and a stop that leaves none behind.

:func:`~geograph.serve.server.run` turns SIGTERM and SIGINT into LitServe's graceful shutdown
(:func:`interrupt`: API servers get ``shutdown_timeout`` seconds for in-flight requests, then the
workers stop) and, whatever happened, ends every process the server started that is still alive
(:func:`stop_children`, a walk of the process tree: SIGTERM, then SIGKILL after
``shutdown_timeout``), so no worker, API server, logger or manager process outlives the command.

A normal stop is quiet (no traceback, no leak warning).
:class:`~geograph.serve._litserve.GeoLitServer` orders LitServe's shutdown: its logger process
blocks on a queue held by the manager process, and LitServe shuts the manager down without
stopping the logger, which then dies in an ``EOFError`` traceback; there the logger is stopped
first. The inference workers leave on SIGTERM through ``SystemExit`` (:func:`worker_signals`) so
that multiprocessing runs their finalizers: a worker killed by the signal's default action never
unlinks the named semaphores libraries create in it (tqdm's lock, made when transformers shows a
progress bar loading the encoder), and the resource tracker reports them as leaked when the
server exits. A terminal's Ctrl-C reaches the whole process group: the workers and the logger
ignore SIGINT and the main process coordinates the stop.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

log = logging.getLogger("geograph.serve")

#: the running server's state in the main process: ``stopping`` (a flag shared with the API servers),
#: ``port``, ``timeout``, ``server``, ``draining``, ``failure`` (the line that says why it stopped)
STATE: dict = {}


def _stopping() -> bool:
    return "stopping" in STATE and bool(STATE["stopping"].value)


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

    from geograph.serve._litserve import worker_status_keys

    keys = worker_status_keys(server)  # in the order of server.inference_workers
    while not _stopping():
        for key, proc in zip(keys, list(server.inference_workers)):
            if proc.is_alive() or _stopping():
                continue
            code = proc.exitcode
            how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit status {code}"
            STATE["failure"] = f"inference worker {key} (pid {proc.pid}) died ({how}); the server stopped"
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


def stopping_flag():
    """A flag shared with the API servers (forked later): set when the server starts to stop."""
    import multiprocessing as mp

    if "stopping" not in STATE:
        STATE["stopping"] = mp.get_context("fork").Value("b", 0, lock=False)
    return STATE["stopping"]


def interrupt(signum, frame):
    """SIGTERM/SIGINT in the main process: drain the API servers, then LitServe's shutdown."""
    if "stopping" in STATE:
        STATE["stopping"].value = 1
    if not STATE.get("draining") and "port" in STATE:
        STATE["draining"] = True
        from geograph.serve._litserve import manager_pid

        drain_api_servers(STATE["port"], STATE["timeout"], exclude={manager_pid(STATE.get("server"))})
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


def default_signals() -> None:  # in forked API servers: uvicorn installs its own handlers
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
