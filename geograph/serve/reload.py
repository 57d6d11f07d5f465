"""Hot reload of ``geograph serve``: ``POST /admin/reload`` serves the saved corpus and graph anew, without downtime.

The route exists only when the server has an API key (and needs it: :mod:`~geograph.serve.auth`);
without a key it is not registered (404). It reads the same paths the server started with
(``corpus``, ``graph``, ``projection``): after ``geograph update --data CORPUS --graph GRAPH``
has replaced them, a reload serves the new version.

Versions: the corpus the server started on is version 0; each successful reload serves the next
number. Every ``/retrieve`` and ``/rerank`` answer says in ``version`` which one computed it.

The protocol, between the API server that takes the request and the inference workers (shared
memory, :class:`ReloadChannel`; files in a directory of the server's own for what does not fit):

1. **prepare**: the API server notes the saved files' identity (:func:`files_token`: device,
   inode, size and modification time of ``corpus.jsonl`` and of every file of the graph and
   projection manifests) and asks for a new attempt. Each worker, in a thread of its own, reads
   the corpus (through the on-disk embedding cache), loads and checks the artefacts and builds
   its module, exactly as at start; the files' identity before and after must be the one noted
   (files replaced meanwhile fail the attempt). Worker 0 also writes the new request limits
   (corpus ids, size, the bounds on ``k``). Meanwhile every worker keeps answering from the
   version it serves.
2. **commit** once every worker is ready (else **abort**: the first failure is the answer, one
   line, and every worker drops what it loaded). At commit a new version number is published;
   each worker swaps its reference to the served state (one assignment) and acknowledges.
   A batch reads that reference once, when it starts
   (:meth:`~geograph.serve.api.GeoAPI.predict`), so a batch is computed on one version, a batch
   under way when the swap comes finishes on the old one, and every batch started after it uses
   the new.
3. The API servers check requests against the new limits from then on (each reads them when it
   sees the new version), and the route answers ``200 {"version", "corpus_version", "passages",
   "seconds"}`` only once every worker has acknowledged: a request sent after that answer is
   computed on the new version.

A request checked against the old limits that reaches a worker after the swap is checked again
against the version that answers it: one that no longer fits (a ``candidate_ids`` entry removed,
a ``k`` above the new corpus's bound) gets ``409`` naming the field and the version, never an
answer mixed from two versions. One reload runs at a time (another gets ``409``); workers that
do not load within ``reload_timeout`` seconds give ``503`` and the old version keeps serving.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from starlette.types import ASGIApp, Receive, Scope, Send

    from geograph.serve.api import GeoAPI, Served

#: the route of the reload
RELOAD_PATH = "/admin/reload"
#: how often a worker's reload thread looks at the shared state (seconds)
POLL = 0.02


class ReloadChannel:
    """Shared memory between the API servers (forked from the main process) and the inference
    workers (spawned with the LitAPI that holds this channel).

    Attributes:
        attempt: the reload attempt the workers are asked to prepare (0: none yet).
        token: the sha256 of :func:`files_token` noted for that attempt.
        prepared: per worker, the attempt it has ready, or minus it when it failed.
        commit: the attempt to swap to, or minus it to abort.
        version: the version number a committed attempt is served as.
        serving: per worker, the version it serves.
        limits: the attempt whose request limits the API servers must use (0: the start's).
        directory: where workers leave the new limits and their errors.
        lock: held by the API server that runs a reload (one at a time).

    The lock is an unnamed semaphore shared with the API servers, which are forked from the main
    process; the workers never take it and get none (``None`` in a worker). A lock from the spawn
    context would be a named semaphore, unlinked only by a finalizer of the process that made it:
    ``geograph serve`` leaves with ``os._exit``, so the finalizer never ran and multiprocessing's
    resource tracker warned of a leaked semaphore at every stop of a server with an API key.
    """

    def __init__(self, directory: str | Path, workers: int = 0) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.directory = str(directory)
        self.attempt = ctx.Value("q", 0, lock=False)
        self.token = ctx.Array("c", 64, lock=False)
        self.commit = ctx.Value("q", 0, lock=False)
        self.version = ctx.Value("q", 0, lock=False)
        self.limits = ctx.Value("q", 0, lock=False)
        self.lock = mp.get_context("fork").Lock()
        self.seen_limits = 0  # the attempt whose limits this process uses (a plain attribute: per process)
        self.set_workers(workers)

    def set_workers(self, workers: int) -> None:
        """Size the per-worker slots (before the workers and API servers start)."""
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.workers = int(workers)
        self.prepared = ctx.Array("q", max(self.workers, 1), lock=False)
        self.serving = ctx.Array("q", max(self.workers, 1), lock=False)

    def __getstate__(self) -> dict[str, Any]:
        # pickled for the spawned workers: the lock stays with the API servers (a fork-context
        # lock cannot go to a spawned process)
        return {**self.__dict__, "lock": None}

    def limits_file(self, attempt: int) -> Path:
        return Path(self.directory) / f"limits-{attempt}.json"

    def error_file(self, attempt: int, worker: int) -> Path:
        return Path(self.directory) / f"error-{attempt}-{worker}.txt"


def files_token(settings: dict[str, Any]) -> str:
    """A sha256 of what identifies the saved files the server reads: for ``corpus.jsonl`` and every
    file the graph's and projection's manifests list (the manifests included), its device, inode,
    size and modification time (a file replaced by an atomic rename or a directory swap changes)."""
    import hashlib

    paths = [Path(settings["corpus"]) / "corpus.jsonl"]
    for key in ("graph", "projection"):
        if settings.get(key) is None:
            continue
        root = Path(settings[key])
        paths.append(root / "manifest.json")
        try:
            files = json.loads((root / "manifest.json").read_text()).get("files") or {}
        except (OSError, ValueError, AttributeError):
            files = {}
        paths += [root / name for name in sorted(files)]
    h = hashlib.sha256()
    for p in paths:
        try:
            st = p.stat()
            h.update(f"{p}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{p}:missing\n".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class Limits:
    """The request limits that depend on the served corpus (the rest are the configuration's)."""

    ids: list[str]
    k_min: int
    k_max: int | None
    k_max_reason: str
    corpus_version: int | None

    def as_limits(self) -> dict[str, Any]:
        """The entries of :data:`geograph.serve.schema.LIMITS` these replace."""
        return {
            "ids": frozenset(self.ids),
            "num_docs": len(self.ids),
            "k_min": self.k_min,
            "k_max": self.k_max,
            "k_max_reason": self.k_max_reason,
            "corpus_version": self.corpus_version,
        }


def write_limits(path: Path, limits: Limits) -> None:
    from geograph._io import atomic_write_json

    atomic_write_json(
        {
            "ids": limits.ids,
            "k_min": limits.k_min,
            "k_max": limits.k_max,
            "k_max_reason": limits.k_max_reason,
            "corpus_version": limits.corpus_version,
        },
        path,
    )


def read_limits(path: Path) -> Limits:
    d = json.loads(Path(path).read_text())
    return Limits(d["ids"], d["k_min"], d["k_max"], d["k_max_reason"], d["corpus_version"])


# -- the worker's side --------------------------------------------------------------------------
def follow_reloads(
    api: GeoAPI, channel: ReloadChannel, worker: int, stop: threading.Event | None = None
) -> threading.Thread:
    """Start the thread of an inference worker that prepares, swaps and acknowledges reloads
    (``api``: the worker's :class:`~geograph.serve.api.GeoAPI`, whose ``load`` builds a served state
    and whose ``served`` is swapped) until ``stop`` is set (a worker's: never, it ends with the process)."""
    thread = threading.Thread(
        target=_follow,
        args=(api, channel, worker, stop or threading.Event()),
        daemon=True,
        name=f"geograph-reload-{worker}",
    )
    thread.start()
    return thread


def _follow(api: GeoAPI, channel: ReloadChannel, worker: int, stop: threading.Event) -> None:
    handled = channel.attempt.value
    pending = None
    while not stop.is_set():
        attempt = channel.attempt.value
        if attempt != handled:
            handled, pending = attempt, None
            pending = _prepare(api, channel, worker, attempt)
        if pending is not None:
            commit = channel.commit.value
            if commit == attempt:
                api.served = pending.with_version(channel.version.value)  # the swap: one assignment
                channel.serving[worker] = api.served.version
                pending = None
            elif commit == -attempt:
                pending = None
        time.sleep(POLL)


def _prepare(api: GeoAPI, channel: ReloadChannel, worker: int, attempt: int) -> Served | None:
    expected = channel.token.value.decode()
    try:
        before = files_token(api.settings)
        served = api.load(version=-1)
        after = files_token(api.settings)
        if not before == after == expected:
            raise ValueError("the saved files changed while they were read; reload again")
        if worker == 0:
            write_limits(channel.limits_file(attempt), served.limits())
    except Exception as e:  # noqa: BLE001 - any failure is the attempt's one-line answer
        from geograph._io import atomic_write, one_line

        line = one_line(e)
        print(f"geograph serve: worker {worker}: reload failed: {line}", file=sys.stderr, flush=True)
        atomic_write(channel.error_file(attempt, worker), lambda f: f.write(line.encode()))
        channel.prepared[worker] = -attempt
        return None
    channel.prepared[worker] = attempt
    return served


# -- the API server's side ----------------------------------------------------------------------
class ReloadError(Exception):
    """A reload that did not happen: ``status`` and one line; the old version keeps serving."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def reload_now(channel: ReloadChannel, settings: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one reload (blocking; call it in a thread): prepare, commit, wait for every worker.

    Returns:
        ``{"version", "corpus_version", "passages", "seconds"}`` of the version now served.

    Raises:
        ReloadError: 409 (another reload under way, or a worker could not load the saved
            version: its line), 503 (workers not ready or not switched within ``timeout``).
    """
    if not channel.lock.acquire(block=False):
        raise ReloadError(409, "reload: another reload is under way")
    try:
        return _reload(channel, settings, timeout)
    finally:
        channel.lock.release()


def _wait(cond: Callable[[], bool], deadline: float) -> bool:
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL)
    return True


def _reload(channel: ReloadChannel, settings: dict[str, Any], timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    deadline = t0 + timeout
    attempt = channel.attempt.value + 1
    channel.token.value = files_token(settings).encode()
    channel.attempt.value = attempt  # the workers start to load
    workers = range(channel.workers)
    done = _wait(lambda: all(abs(channel.prepared[w]) == attempt for w in workers), deadline)
    failed = [w for w in workers if channel.prepared[w] == -attempt]
    if not done or failed:
        channel.commit.value = -attempt  # every worker drops what it loaded
        if failed:
            try:
                line = channel.error_file(attempt, failed[0]).read_text().strip()
            except OSError:
                line = "unknown error"
            raise ReloadError(409, f"reload: {line}; version {channel.version.value} keeps serving")
        raise ReloadError(
            503,
            f"reload: the workers did not load the saved version within reload_timeout ({timeout:g} s); "
            f"version {channel.version.value} keeps serving",
        )
    limits = read_limits(channel.limits_file(attempt))
    version = channel.version.value + 1
    channel.version.value = version
    channel.commit.value = attempt  # every worker swaps at its next batch
    if not _wait(lambda: all(channel.serving[w] == version for w in workers), deadline + 10 * POLL + 5):
        late = [w for w in workers if channel.serving[w] != version]
        raise ReloadError(503, f"reload: workers {late} did not switch to version {version} in time")
    channel.limits.value = attempt  # the API servers check requests against these from now on
    return {
        "version": version,
        "corpus_version": limits.corpus_version,
        "passages": len(limits.ids),
        "seconds": round(time.monotonic() - t0, 3),
    }


def refresh_limits(channel: ReloadChannel) -> None:
    """Make this API server's request limits those of the served version (read once per version;
    call it on the event loop's thread, which validates the requests)."""
    from geograph.serve.schema import LIMITS

    current = channel.limits.value
    if current == channel.seen_limits:
        return
    LIMITS.update(read_limits(channel.limits_file(current)).as_limits())
    channel.seen_limits = current


class LimitsMiddleware:
    """ASGI middleware: before a request is read, this API server's limits are the served version's
    (another API server may have run the reload)."""

    def __init__(self, app: ASGIApp, channel: ReloadChannel) -> None:
        self.app, self.channel = app, channel

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.channel.limits.value != self.channel.seen_limits:
            refresh_limits(self.channel)
        await self.app(scope, receive, send)


def add_reload_route(app: FastAPI, channel: ReloadChannel, settings: dict[str, Any], timeout: float) -> None:
    """Register ``POST /admin/reload`` (:func:`reload_now` in a thread: the API server keeps serving)."""
    import asyncio

    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, Field

    class ReloadResponse(BaseModel):
        """``POST /admin/reload``'s answer: the version every worker now serves."""

        version: int = Field(description="the version number now served (0 at start, one more each reload)")
        corpus_version: int | None = Field(description="the saved graph's corpus version (null without a graph)")
        passages: int = Field(description="passages of the corpus now served")
        seconds: float = Field(description="the reload's wall time")

    class ReloadFailure(BaseModel):
        detail: str = Field(description="one line: why; the version served before keeps serving")

    async def admin_reload() -> JSONResponse:  # (no return model: response_model=None, the answer is built here)
        try:
            answer = await asyncio.to_thread(reload_now, channel, settings, timeout)
        except ReloadError as e:
            return JSONResponse(status_code=e.status, content={"detail": str(e)})
        refresh_limits(channel)  # here, not in the thread: no request is checked against half of them
        return JSONResponse(content=answer)

    app.add_api_route(
        RELOAD_PATH,
        admin_reload,
        methods=["POST"],
        response_model=None,
        responses={
            200: {"model": ReloadResponse, "description": "the version now served by every worker"},
            409: {
                "model": ReloadFailure,
                "description": "another reload, or a saved version that cannot be served",
            },
            503: {"model": ReloadFailure, "description": "the workers did not load or switch within reload_timeout"},
        },
        summary="serve the saved corpus and graph again (needs the API key)",
    )


def worker_index() -> int:
    """This inference worker's index (LitServe sets ``LITSERVE_WORKER_ID`` before ``setup``)."""
    return int(os.environ.get("LITSERVE_WORKER_ID", "0"))
