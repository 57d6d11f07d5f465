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
ignore SIGINT, the forked processes block it (:func:`default_signals`: uvicorn would catch it),
and the main process coordinates the stop.

No process outlives the main process, however it ends (``kill -9``, the out-of-memory killer):
every process it starts asks Linux for a signal when its parent dies
(``prctl(PR_SET_PDEATHSIG)``, :func:`die_with_parent`) as its first act, and ends at once if
the parent is already gone. The processes forked from the main process (LitServe's queue
manager and API servers) do it in a fork hook (:func:`arm_fork_hooks`) and get SIGKILL; the
spawned ones (inference workers, LitServe's logger) do it while they unpickle their arguments
(:class:`ParentGuard`, held by the LitAPI and the logger): a worker gets SIGTERM and leaves
through Python's exit path as in a normal stop (so the resource tracker, which exits when the
last of them has, finds nothing to report), the logger SIGKILL. Linux sends the signal when the
*thread* that started the process ends: every process is started from the main thread, which
lives as long as the main process; a process started from another thread watches its parent
from a thread of its own instead (:func:`die_with_parent`).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import ctypes
    from multiprocessing.process import BaseProcess
    from types import FrameType

    from geograph.serve._litserve import GeoLitServer

log = logging.getLogger("geograph.serve")

#: the running server's state in the main process: ``stopping`` (a flag shared with the API servers),
#: ``port``, ``timeout``, ``server``, ``draining``, ``failure`` (the line that says why it stopped)
STATE: dict[str, Any] = {}


def _stopping() -> bool:
    return "stopping" in STATE and bool(STATE["stopping"].value)


def watch_workers(server: GeoLitServer, interval: float = 0.5) -> None:
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


def announce_ready(server: GeoLitServer, interval: float = 0.1) -> None:
    """Print ``server.ready_line`` (:func:`~geograph.serve.info.listening_line`) on stderr once, as
    soon as ``/health`` answers ``ok``: every inference worker is ready and the port accepts
    connections (an API server listens only once its application has started). A thread of the
    main process, started with the worker monitor; it prints nothing if the server stops first.
    """
    import socket

    from litserve.utils import WorkerSetupStatus

    host, port = server.probe_address
    while not _stopping():
        try:
            status = dict(server.workers_setup_status)
        except Exception:  # the manager is gone: the server is stopping
            return
        if status and all(v == WorkerSetupStatus.READY for v in status.values()):
            try:
                with socket.create_connection((host, port), timeout=1):
                    pass
            except OSError:
                pass
            else:
                if not _stopping():
                    print(server.ready_line, file=sys.stderr, flush=True)
                return
        time.sleep(interval)


def stop_processes(procs: Iterable[BaseProcess], timeout: float) -> None:
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
    multiprocessing's exit path, which runs its finalizers (named semaphores are unlinked), and
    then ends without the interpreter's native teardown (torch's and the tokenizer's thread
    pools: about six seconds, during which the worker would still hold its memory); a worker whose
    exit hangs all the same ends by SIGALRM after :data:`EXIT_GRACE` seconds.
    """
    import atexit
    import multiprocessing as mp

    if mp.current_process().name == "MainProcess":  # a worker's setup called in-process (tests): leave it
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    atexit.register(_leave_after_sigterm)


#: seconds an inference worker may take to leave after SIGTERM before SIGALRM ends it (nothing
#: else would when the main process that stops the server is gone)
EXIT_GRACE = 10
_TERMINATED = {"by_sigterm": False}


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the exit short (SIGKILL still does)
    if hasattr(signal, "alarm"):  # SIGALRM's default action ends a worker whose exit hangs (not on Windows)
        signal.alarm(EXIT_GRACE)
    _TERMINATED["by_sigterm"] = True
    raise SystemExit(0)


def _leave_after_sigterm() -> None:
    # an exit handler of the worker: it runs after multiprocessing's exit path (the finalizers
    # have run); a worker that leaves for another reason keeps its exit status and teardown
    if _TERMINATED["by_sigterm"]:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


# -- no process outlives the main process ------------------------------------------------------
#: Linux's ``prctl`` option that sets the signal a process gets when its parent thread ends
PR_SET_PDEATHSIG = 1
#: seconds between two looks at the parent by a process that cannot use the parent-death signal
PARENT_POLL = 0.5


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - another user's process of that pid
        return True
    return True


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (``None`` where there is none: not Linux). Looked up before the server forks
    (:func:`arm_fork_hooks`), so a forked child only calls it: loading a library right after a fork
    of a process with threads could wait for a lock another thread held at the fork."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
        return prctl
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return None


def _set_pdeathsig(sig: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)``; False where it is not available."""
    fn = _prctl()
    return fn is not None and fn(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def _watch_parent(parent: int, sig: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL)
    os.kill(os.getpid(), sig)


def die_with_parent(sig: int, parent: int, main_thread: bool = True) -> None:
    """Make this process get ``sig`` when its parent, the process ``parent``, ends (now if it has).

    ``main_thread``: whether the parent started this process from its main thread. Linux's
    parent-death signal (``prctl(PR_SET_PDEATHSIG)``) fires when the parent *thread* ends, so it
    is used only then (the main thread ends with its process); otherwise, and where ``prctl`` is
    missing, a daemon thread of this process looks at its parent every :data:`PARENT_POLL` s. A
    process whose parent is alive but is not ``parent`` (not started by it) is left alone.
    """
    if os.getppid() != parent:  # adopted already, or not a child of ``parent`` at all
        if not _alive(parent):
            os.kill(os.getpid(), sig)
        return
    if not (main_thread and _set_pdeathsig(sig)):
        threading.Thread(target=_watch_parent, args=(parent, sig), daemon=True, name="geograph-parent-watch").start()
    elif os.getppid() != parent:  # the parent ended before the signal was set
        os.kill(os.getpid(), sig)


class ParentGuard:
    """Held by an object pickled into a spawned process (the LitAPI, the metrics logger): when that
    process unpickles it, before the process's target runs, the process calls
    :func:`die_with_parent` with ``sig`` (a copy made in the process that pickled it does nothing).

    Example:
        >>> import pickle, signal
        >>> copy = pickle.loads(pickle.dumps(ParentGuard(signal.SIGTERM)))  # same process: no effect
        >>> copy.sig == signal.SIGTERM
        True
    """

    def __init__(self, sig: int) -> None:
        self.sig = int(sig)

    def __reduce__(self) -> tuple[Callable[[int, int, bool], ParentGuard], tuple[int, int, bool]]:
        main = threading.current_thread() is threading.main_thread()
        return (_guarded, (self.sig, os.getpid(), main))


def _guarded(sig: int, parent: int, main_thread: bool) -> ParentGuard:
    if os.getpid() != parent:
        die_with_parent(sig, parent, main_thread)
    return ParentGuard(sig)


#: the fork hooks' state: armed while :func:`~geograph.serve.server.run` serves; the forking
#: process's pid and whether its main thread forks, noted just before each fork
_FORK: dict[str, Any] = {"registered": False, "armed": False, "parent": 0, "main_thread": True}


def _before_fork() -> None:
    _FORK["parent"] = os.getpid()
    _FORK["main_thread"] = threading.current_thread() is threading.main_thread()


def _after_fork_in_child() -> None:
    if _FORK["armed"]:
        default_signals()
        die_with_parent(signal.SIGKILL, _FORK["parent"], _FORK["main_thread"])


def arm_fork_hooks(armed: bool = True) -> None:
    """While ``armed``, a process forked from this one (LitServe's queue manager and API servers)
    gets :func:`default_signals` and SIGKILL when this process ends."""
    if not _FORK["registered"]:
        _prctl()  # looked up here, not in a forked child
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
        _FORK["registered"] = True
    _FORK["armed"] = armed


def stopping_flag() -> ctypes.c_byte:
    """A flag shared with the API servers (forked later): set when the server starts to stop."""
    import multiprocessing as mp

    if "stopping" not in STATE:
        STATE["stopping"] = mp.get_context("fork").Value("b", 0, lock=False)
    flag: ctypes.c_byte = STATE["stopping"]  # a raw shared c_byte (lock=False)
    return flag


def interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    """SIGTERM/SIGINT in the main process: drain the API servers, then LitServe's shutdown."""
    if "stopping" in STATE:
        STATE["stopping"].value = 1
    if not STATE.get("draining") and "port" in STATE:
        STATE["draining"] = True
        from geograph.serve._litserve import manager_pid

        drain_api_servers(STATE["port"], STATE["timeout"], exclude={manager_pid(STATE.get("server"))})
    raise KeyboardInterrupt(signal.Signals(signum).name)


def drain_api_servers(port: int, timeout: float, exclude: Collection[int | None] = frozenset()) -> None:
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


def default_signals() -> None:
    """Signal handling of a process forked from the main one (an API server, the queue manager).

    SIGTERM takes its default action (uvicorn installs its own handler while it serves). SIGINT
    is ignored *and blocked*: a terminal's Ctrl-C reaches the whole process group, and the main
    process drains the API servers itself (SIGTERM). uvicorn installs a handler for SIGINT too,
    so ignoring it is not enough: an API server that caught SIGINT and finished its shutdown
    before the main process's SIGTERM came raised the signal again once its handlers were
    restored, and died in a ``KeyboardInterrupt`` traceback. A blocked signal never reaches a
    handler.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


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
