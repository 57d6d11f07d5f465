"""The server under ``geograph bench serve``: ``geograph serve`` in a subprocess, waited for until healthy,
its processes' memory read, stopped with SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence


def wait_healthy(url: str, proc: subprocess.Popen[bytes], seconds: float, output: Callable[[], str]) -> None:
    """Poll ``url/health`` every 0.5 s until it answers ``ok``. RuntimeError (with the end of
    ``output()``) when ``proc`` exits first, or when ``seconds`` pass (the process is left running)."""
    import requests

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}: {output()[-2000:]}")
        try:
            if requests.get(url + "/health", timeout=2).text == "ok":
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not healthy after {seconds:g} s")


class Server:
    """``geograph serve`` in a subprocess on a free port of 127.0.0.1, stopped with SIGTERM."""

    def __init__(self, method: str, corpus: str, extra: Sequence[str], wait: float = 600) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "geograph",
            "serve",
            "--method",
            method,
            "--corpus",
            corpus,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *extra,
        ]
        env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.log: list[bytes] = []
        # stdout is the pipe opened above
        threading.Thread(target=lambda: self.log.extend(self.proc.stdout), daemon=True).start()  # type: ignore[arg-type]
        try:
            wait_healthy(self.url, self.proc, wait, self.output)
        except RuntimeError as exc:
            self.stop()
            raise SystemExit(f"geograph bench serve: {exc}") from None

    def output(self) -> str:
        return b"".join(self.log).decode(errors="replace")

    def rss(self) -> dict[str, float]:
        """MB of resident memory of every process of the server's tree, by ``pid name``."""
        import psutil

        main = psutil.Process(self.proc.pid)
        out = {}
        for p in [main, *main.children(recursive=True)]:
            try:
                out[f"{p.pid} {p.name()}"] = p.memory_info().rss / 2**20
            except psutil.Error:
                pass
        return out

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode
