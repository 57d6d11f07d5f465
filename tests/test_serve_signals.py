"""Signals in the processes ``geograph serve`` forks (API servers, the queue manager): a terminal's
Ctrl-C reaches them too, and must not end one in a traceback; the main process stops them."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import sys
import time

import pytest

from geograph.serve.lifecycle import arm_fork_hooks

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork hooks and prctl: Linux")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _app(scope, receive, send):  # the least ASGI application: uvicorn serves it
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


def _serve(port: int, err_path: str) -> None:
    # an API server's life: uvicorn's serve, stderr kept for the test
    import uvicorn

    fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    uvicorn.Server(uvicorn.Config(_app, host="127.0.0.1", port=port, log_level="error")).run()


def _wait_listening(port: int, proc: mp.process.BaseProcess) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.is_alive():
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError("the forked server never listened")


def test_a_forked_api_server_outlives_ctrl_c_and_stops_quietly_on_sigterm(tmp_path):
    """SIGINT alone (the main process's SIGTERM not yet sent) leaves the server up; SIGTERM
    then stops it with no traceback. Before, uvicorn caught the SIGINT, shut down, raised it
    again with Python's handler back in place and printed a ``KeyboardInterrupt`` traceback."""
    port, err = _free_port(), tmp_path / "stderr.txt"
    arm_fork_hooks()
    try:
        proc = mp.get_context("fork").Process(target=_serve, args=(port, str(err)))
        proc.start()
    finally:
        arm_fork_hooks(False)
    try:
        _wait_listening(port, proc)
        os.kill(proc.pid, signal.SIGINT)
        proc.join(2.0)
        assert proc.is_alive(), f"SIGINT ended the forked server:\n{err.read_text()}"
        os.kill(proc.pid, signal.SIGTERM)
        proc.join(30)
        assert not proc.is_alive()
        assert proc.exitcode in (0, -signal.SIGTERM), proc.exitcode
        assert "Traceback" not in err.read_text(), err.read_text()
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


def test_forked_processes_ignore_and_block_sigint_only_while_armed():
    def report(q):
        blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        q.put((signal.getsignal(signal.SIGINT) is signal.SIG_IGN, blocked))

    ctx = mp.get_context("fork")
    # this process's own disposition, as a command starts with it (a test before this one in the
    # same worker may have left SIGINT ignored: a child forked unarmed inherits whatever it is)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for armed in (True, False):
            q = ctx.SimpleQueue()
            arm_fork_hooks(armed)
            try:
                p = ctx.Process(target=report, args=(q,))
                p.start()
            finally:
                arm_fork_hooks(False)
            p.join(30)
            assert q.get() == (armed, armed)
    finally:
        signal.signal(signal.SIGINT, before)
