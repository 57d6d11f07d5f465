"""Ray, when asked for: a connection (a local Ray or a cluster) and the tile executor that runs tiles as Ray tasks.

Nothing here imports Ray at module level: ``import geograph`` never loads it (the ``ray`` extra
is optional). geograph schedules nothing itself: every tile is one Ray task, Ray places and
retries them, and the corpus travels once through Ray's object store (read zero-copy by the
workers of a node).
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypedDict

import numpy as np
import torch

__all__ = ["ray_session", "RayExecutor", "import_ray", "LOCAL"]

#: the ``--ray`` value (and ``address``) that starts a local Ray instead of joining a cluster
LOCAL = "local"


class RaySession(TypedDict):
    """What :func:`ray_session` yields."""

    address: str
    started: bool
    seconds: float
    cpus: int


def import_ray() -> ModuleType:
    """``ray``, or a one-line ImportError naming the extra."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError("Ray is not installed: pip install 'geograph-rag[ray]'") from exc
    return ray


def _check_address(address: str | None) -> str | None:
    if address is None or address == LOCAL:
        return None
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"address must be None, 'local', 'auto', 'ray://HOST:PORT' or 'HOST:PORT', got {address!r}")
    return address.strip()


@contextlib.contextmanager
def ray_session(
    address: str | None = None, *, num_cpus: int | None = None, runtime_env: dict[str, Any] | None = None
) -> Iterator[RaySession]:
    """Ray for the ``with`` block: joined, started, or reused.

    - Ray already initialised in this process (``ray.is_initialized()``): used as it is and left
      running (``address`` must then be ``None``).
    - ``address`` ``None`` / ``"local"``: a local Ray with ``num_cpus`` CPUs (default: all) is
      started and shut down at the end. Its workers import the same geograph as this process
      (its package directory goes first on their ``PYTHONPATH``).
    - ``"auto"``, ``"ray://HOST:PORT"`` or ``"HOST:PORT"``: the running cluster is joined (and left
      at the end); its nodes need geograph installed, or pass ``runtime_env={"py_modules": [...]}``.

    Yields ``{"address": ..., "started": bool, "seconds": time to connect, "cpus": cluster CPUs}``.
    """
    ray = import_ray()
    address = _check_address(address)
    if ray.is_initialized():
        if address is not None:
            raise ValueError(
                f"address={address!r}: Ray is already initialised in this process; pass address=None to use it"
            )
        yield {"address": "existing", "started": False, "seconds": 0.0, "cpus": _cpus(ray)}
        return
    t0 = time.perf_counter()
    env = dict(runtime_env or {})
    if address is None:
        root = str(Path(__file__).resolve().parents[2])  # the directory holding this geograph package
        env_vars = dict(env.get("env_vars") or {})
        env_vars.setdefault(
            "PYTHONPATH", os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        )
        env["env_vars"] = env_vars
        ray.init(
            num_cpus=num_cpus, include_dashboard=False, runtime_env=env, logging_level="WARNING", log_to_driver=False
        )
    else:
        ray.init(address=address, runtime_env=env or None, logging_level="WARNING")
    try:
        yield {
            "address": address or LOCAL,
            "started": address is None,
            "seconds": time.perf_counter() - t0,
            "cpus": _cpus(ray),
        }
    finally:
        ray.shutdown()


def _cpus(ray: ModuleType) -> int:
    return int(ray.cluster_resources().get("CPU", 1))


# -- the executor ---------------------------------------------------------------------------------
def _pack(value: Any) -> Any:
    """Tensors as numpy arrays (Ray stores them once and workers map them zero-copy), recursively in lists."""
    if isinstance(value, torch.Tensor):
        return _Array(value.detach().cpu().numpy())
    if isinstance(value, (list, tuple)):
        return type(value)(_pack(v) for v in value)
    if isinstance(value, dict):
        return {k: _pack(v) for k, v in value.items()}
    return value


def _unpack(value: Any) -> Any:
    if isinstance(value, _Array):
        with warnings.catch_warnings():  # the object store's arrays are read-only; the tiles only read them
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(value.array)
    if isinstance(value, (list, tuple)):
        return type(value)(_unpack(v) for v in value)
    if isinstance(value, dict):
        return {k: _unpack(v) for k, v in value.items()}
    return value


class _Array:
    """A numpy array that was a tensor (so that a caller's own numpy arrays stay numpy)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self) -> tuple[type[_Array], tuple[np.ndarray]]:
        return (_Array, (self.array,))


def _run_tile(fn: Callable[[dict[str, Any], Any], Any], shared: dict[str, Any], item: Any) -> Any:
    """One tile on a Ray worker: the same function the local build calls, on the same inputs."""
    return _pack(fn(_unpack(shared), item))


class RayExecutor:
    """Runs each tile of a :func:`~geograph.knn.allpairs.tile_executor` block as a Ray task.

    The tiles' shared inputs (the corpus, the options) are put into Ray's object store once per
    call; each task returns its tile's partial result, which the caller merges as results
    arrive. A task whose worker dies is retried by Ray (``max_retries``); when the retries run
    out the call raises (nothing partial is returned).

    Args:
        num_cpus: CPUs a task reserves (1: one tile per core, torch on one thread in it).
        max_retries: Ray's retries of a task whose worker died.
        parallelism: tasks Ray can run at once (default: the cluster's CPUs // num_cpus); the
            IVF join cuts its cells into 4 groups per slot.
    """

    session: RaySession  # the Ray it runs on (set by on_ray)

    def __init__(self, *, num_cpus: float = 1, max_retries: int = 3, parallelism: int | None = None) -> None:
        if not num_cpus > 0:
            raise ValueError(f"num_cpus must be positive, got {num_cpus!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be a non-negative integer, got {max_retries!r}")
        self.ray = import_ray()
        if not self.ray.is_initialized():
            raise RuntimeError("RayExecutor needs a running Ray: use it inside geograph.distributed.ray_session()")
        self.num_cpus, self.max_retries = num_cpus, max_retries
        self.parallelism = parallelism or max(1, int(_cpus(self.ray) // num_cpus))
        self.tasks = 0
        self._remote = self.ray.remote(_run_tile).options(
            num_cpus=num_cpus, max_retries=max_retries, retry_exceptions=False, name="geograph_tile"
        )

    def __call__(
        self, fn: Callable[[dict[str, Any], Any], Any], shared: dict[str, Any], items: Sequence[Any]
    ) -> Iterator[tuple[Any, Any]]:
        ray = self.ray
        ref = ray.put(_pack(shared))
        pending = {self._remote.remote(fn, ref, item): item for item in items}
        self.tasks += len(pending)
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for d in done:
                    item = pending.pop(d)
                    try:
                        out = ray.get(d)
                    except ray.exceptions.RayTaskError as exc:  # the tile itself raised: not a lost worker
                        raise RuntimeError(
                            f"Ray tile {getattr(fn, '__name__', fn)}({item!r}) raised "
                            f"{str(exc).strip().splitlines()[-1]}"
                        ) from exc
                    except ray.exceptions.RayError as exc:
                        raise RuntimeError(
                            f"Ray tile {getattr(fn, '__name__', fn)}({item!r}) failed after "
                            f"{self.max_retries} retries, so nothing was built: "
                            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                        ) from exc
                    yield item, _unpack(out)
        finally:
            for d in pending:  # an error or an abandoned generator: stop the rest
                ray.cancel(d, force=True)
            del ref
