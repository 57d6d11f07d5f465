"""One build of ``geograph bench scale`` in a fresh process: its peak resident memory, its stage times and
its graph arrays on disk (optionally with the tiles on Ray, connected and warmed before the clock starts)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import queue as queues
import resource
import sys
import time
from typing import Any, cast

import numpy as np
import torch

#: the graphs the bench builds: the k-NN graph's k and the G3 graph's ``max_degree``
KNN_K = 10
MAX_DEGREE = 128


def _rss_mb() -> float:
    """Peak resident memory of this process so far, MB: ``VmHWM`` (reset by ``exec``, so a spawned
    child does not inherit its parent's peak, as ``ru_maxrss`` does), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _child(task: dict[str, Any], queue: Any) -> None:
    try:
        sys.path[:0] = task.get("pythonpath", [])  # packages installed apart (the peers' --peer-path)
        torch.set_num_threads(task["threads"])
        x = torch.from_numpy(np.load(task["path"], mmap_mode="c"))  # mapped copy-on-write: pages read from the file
        with contextlib.ExitStack() as stack:
            out: dict[str, Any] = {}
            if task.get("ray") is not None:
                executor, out["ray"] = _enter_ray(stack, task["ray"], x)
            base = _rss_mb()
            t0 = time.perf_counter()
            _build(task, x, out)
            out.update(seconds=time.perf_counter() - t0, peak_rss_mb=_rss_mb(), base_rss_mb=base)
            if "ray" in out:
                out["ray"]["tasks"] = executor.tasks
        queue.put(out)
    except BaseException as exc:  # report, do not hang the parent
        queue.put({"error": f"{type(exc).__name__}: {exc}"})
        raise


def _enter_ray(stack: contextlib.ExitStack, address: str, x: torch.Tensor) -> tuple[Any, dict[str, Any]]:
    """Connect (or start a local Ray) and warm its workers with a small build, both timed apart from the build."""
    from geograph.distributed import on_ray
    from geograph.graphs.corpus_graph import CorpusGraph

    t0 = time.perf_counter()
    executor: Any = stack.enter_context(on_ray(address))  # on_ray sets its `session` on it
    connect = time.perf_counter() - t0
    t0 = time.perf_counter()
    CorpusGraph.from_knn(x[:2048], 5, chunk_size=256)  # every worker imports torch and geograph once
    warm = time.perf_counter() - t0
    executor.tasks = 0
    return executor, {
        "address": address,
        "cpus": executor.session["cpus"],
        "connect_seconds": connect,
        "warmup_seconds": warm,
    }


def _build(task: dict[str, Any], x: torch.Tensor, out: dict[str, Any]) -> None:
    """One build of ``task["kind"]``; its graph arrays saved to ``task["out"]``."""
    if task["kind"] == "peer":
        from geograph.bench.scale.peers import run_peer

        run_peer(task, x.numpy(), out)
    elif task["kind"] == "knn":
        from geograph.graphs.corpus_graph import CorpusGraph

        g = CorpusGraph.from_knn(x, KNN_K, index=task["index"], nprobe=task["nprobe"], progress=task["progress"])
        np.save(task["out"], g.edge_index.numpy())
        out["stages"] = g.build_info.get("seconds", {})
        out["build_info"] = g.build_info
    else:
        from geograph.graphs.g3_graph import G3Graph

        g3 = G3Graph.build(
            x,
            max_degree=MAX_DEGREE,
            index=task["index"],
            nprobe=task["nprobe"],
            candidates=task["candidates"],
            density_sample=task["density_sample"],
            ranking=task["ranking"],
            progress=task["progress"],
        )
        np.savez(task["out"], crow=g3.crow.numpy(), col=g3.col.numpy(), val=g3.val.numpy(), density=g3.density.numpy())
        info = g3.build_info
        out["stages"] = {k: info[k] for k in ("density_seconds", "candidate_seconds", "edge_seconds") if k in info}
        out["build_info"] = info


def build_in_child(task: dict[str, Any]) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(task, queue))
    proc.start()
    while True:  # a child killed (out of memory) reports nothing: do not wait for it forever
        try:
            out = queue.get(timeout=5.0)
            break
        except queues.Empty:
            if not proc.is_alive():
                try:  # its last words may have arrived since
                    out = queue.get(timeout=1.0)
                except queues.Empty:
                    out = {"error": f"the process died (exit code {proc.exitcode})"}
                break
    proc.join()
    if "error" in out:
        raise RuntimeError(f"{task['kind']} build failed: {out['error']}")
    return cast("dict[str, Any]", out)
