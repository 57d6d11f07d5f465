"""Start `geograph serve` (METHOD, default iso) with 3 CPU workers on a saved graph, wait for /health,
answer one /retrieve, and sum the memory of the server's process tree from /proc/PID/smaps_rollup.

Usage: METHOD=g3 python measure.py CODE_DIR DATA_DIR GRAPH_DIR PORT > result.json
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import psutil

code, root, graph, port = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
env = {
    **os.environ,
    "PYTHONPATH": code,
    "GEOGRAPH_CACHE": f"{root}/cache",
    "HF_HUB_OFFLINE": "1",
    "PYTHONWARNINGS": "ignore",
}
cmd = [
    sys.executable,
    "-m",
    "geograph",
    "serve",
    "--method",
    os.environ.get("METHOD", "iso"),
    "--corpus",
    f"{root}/corpus",
    "--graph",
    graph,
    "--cache",
    f"{root}/cache",
    "--workers-per-device",
    "3",
    "--threads",
    "1",
    "--port",
    port,
]
t0 = time.time()
proc = subprocess.Popen(
    cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(f"{root}/serve-{port}.log", "w"), start_new_session=True
)
try:
    while True:
        if proc.poll() is not None:
            sys.exit(f"server exited {proc.returncode}; see {root}/serve-{port}.log")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200 and b"ok" in r.read():
                    break
        except Exception:
            pass
        if time.time() - t0 > 1500:
            sys.exit("no health in 1500 s")
        time.sleep(5)
    ready = time.time() - t0
    body = json.dumps({"query": "synthetic passage number 7", "k": 10}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/retrieve", body, {"Content-Type": "application/json"})
    answer = json.loads(urllib.request.urlopen(req, timeout=60).read())
    time.sleep(3)
    rows, tot = [], {"Rss": 0, "Pss": 0, "Shared_Clean": 0, "Private_Dirty": 0}
    for p in [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True):
        try:
            roll = {}
            for line in open(f"/proc/{p.pid}/smaps_rollup"):
                h = line.split()
                if h[0].rstrip(":") in tot:
                    roll[h[0].rstrip(":")] = int(h[1]) // 1024
        except (FileNotFoundError, ProcessLookupError):
            continue
        rows.append({"pid": p.pid, "name": " ".join(p.cmdline()[-2:])[:40], **roll})
        for k in tot:
            tot[k] += roll.get(k, 0)
    print(
        json.dumps(
            {
                "graph": graph,
                "code": code,
                "ready_s": round(ready),
                "answer_keys": sorted(answer) if isinstance(answer, dict) else None,
                "total_MiB": tot,
                "processes": rows,
            },
            indent=1,
        )
    )
finally:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
