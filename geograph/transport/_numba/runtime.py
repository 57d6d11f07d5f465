"""How geograph compiles its numba kernels: where the on-disk cache goes, one lock, warm-up.

Cache (chosen once per process, when the first kernel module is imported, and logged on the
``geograph`` logger): numba's ``cache=True`` needs a writable directory, and with none it fails
at import with ``RuntimeError: cannot cache function ...: no locator available`` (a package on a
read-only mount with a read-only ``$HOME``, as Kubernetes' ``readOnlyRootFilesystem`` gives).
The first writable one of these is used:

1. ``$NUMBA_CACHE_DIR`` when set (numba's own override);
2. the package's ``__pycache__`` (numba's default);
3. ``$GEOGRAPH_CACHE/numba`` when ``$GEOGRAPH_CACHE`` is set (geograph's cache root);
4. numba's user-wide cache (``~/.cache/numba``);
5. ``<tempdir>/geograph-numba-<uid>``, created private (mode 0700; one owned by another user or
   open to others is not used: a fresh private temporary directory is);
6. none: the kernels compile in memory in every process (a warning).

Safety: numba's cache index is a pickle, so whoever can write the cache directory runs code in
every process that loads it. The first writable directory of 1-4 is used only when it is owned by
the current user and neither group- nor world-writable; otherwise a warning names it and the
kernels are cached in a fresh private temporary directory (``tempfile.mkdtemp``, mode 0700) for
this process instead.

The choice only applies to geograph's kernels (``numba.config.CACHE_DIR`` is set while they are
decorated, then restored). :func:`cache_info` reports it.

Freshness: numba keys a cached kernel on its own source file only, but a kernel compiles in the
kernels it calls and the constants it reads from other files (the Ricci drivers of
``ricci.py`` call and inline the simplex of ``simplex.py``). Every cached kernel's
key therefore also holds a digest of all of :data:`KERNEL_SOURCES` (:func:`sources_digest`): an
edit to any of them recompiles every kernel instead of loading a stale one.

First compilation: a kernel that is not in the cache compiles on its first call (every kernel
together, as :func:`warmup` compiles them: about a minute of one core; loading them from the cache
in a later process: well under a second on an idle machine; docs/runtime.md has the measurement).
Before the first compilation of a process, one notice on the ``geograph`` logger (level WARNING,
so it reaches stderr without any logging set up) says so; a kernel loaded from the cache says
nothing. :func:`compile_stats` counts both.

Threads: the parallel entry points (:func:`locked`) release the GIL while they run and run one
at a time per process. Each already spreads its work over every numba thread, and numba's
``workqueue`` threading layer (what numba falls back to when neither TBB nor OpenMP loads) does
not support parallel kernels launched from several threads at once (it aborts the process);
the lock makes concurrent calls safe on every layer, and releasing the GIL lets the caller's
other Python threads (a server's I/O, torch work) run during a solve.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from typing_extensions import ParamSpec

if TYPE_CHECKING:
    from numba.core.caching import FunctionCache
    from numba.core.decorators import _JITOptions
    from numba.core.dispatcher import Dispatcher
    from typing_extensions import Unpack

__all__ = ["cache_info", "compile_stats", "jit", "locked", "warmup", "sources_digest", "KERNEL_SOURCES"]

logger = logging.getLogger("geograph")

#: held by every parallel numba entry point while it runs (see the module docstring)
KERNEL_LOCK = threading.Lock()

#: the files (in this package) whose code or constants a compiled kernel may hold: every module
#: with a kernel, and the modules they read constants from (the module docstring's "Freshness")
KERNEL_SOURCES = ("runtime.py", "simplex.py", "ricci.py", "grc.py", "simplex_stats.py")

#: measured (docs/runtime.md): every kernel compiled by :func:`warmup` in a fresh process with an
#: empty cache, and loaded from that cache by the next process
COLD_COMPILE = "a minute"
WARM_LOAD = "a second"

_F = TypeVar("_F", bound=Callable[..., Any])
_P = ParamSpec("_P")
_R = TypeVar("_R")


class LockedKernel(Protocol[_P, _R]):
    """What :func:`locked` returns: the entry point, and the compiled kernel behind it."""

    kernel: Dispatcher[Callable[_P, _R]]

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R: ...


@functools.cache
def sources_digest() -> str:
    """SHA-256 of the contents of :data:`KERNEL_SOURCES`, read once per process."""
    digest = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(__file__))
    for name in KERNEL_SOURCES:
        with open(os.path.join(here, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read() + b"\0")
    return digest.hexdigest()


@functools.cache
def _kernel_cache_class() -> type[FunctionCache]:
    """numba's per-function disk cache, keyed also on :func:`sources_digest`.

    ``FunctionCache._index_key(sig, codegen)`` is numba's (private) key of one compiled
    signature in a function's index: the signature, the target and hashes of the function's
    bytecode; the digest is appended to it. ``tests/test_numba_runtime.py`` checks that the key
    still has that shape.
    """
    from numba.core.caching import FunctionCache

    class KernelCache(FunctionCache):
        def _index_key(self, sig: object, codegen: object) -> tuple[object, ...]:
            key = super()._index_key(sig, codegen)  # type: ignore[no-untyped-call]  # numba's private, untyped
            return (*key, sources_digest())

        def load_overload(self, sig: object, target_context: object) -> object:
            found = super().load_overload(sig, target_context)  # type: ignore[no-untyped-call]
            if found is None:  # numba compiles next
                _announce_compile()
            return found

    return KernelCache


@functools.cache
def _null_cache_class() -> type[Any]:
    """numba's no-cache (every process compiles), announcing its compilations as :class:`KernelCache`."""
    from numba.core.caching import NullCache

    class AnnouncedNullCache(NullCache):
        def load_overload(self, sig: object, target_context: object) -> object:
            _announce_compile()
            return None

    return AnnouncedNullCache


_announced = threading.Event()
_announce_lock = threading.Lock()


def _announce_compile() -> None:
    """The one notice of a process, before its first kernel compilation (see the module docstring)."""
    if _announced.is_set():
        return
    with _announce_lock:
        if _announced.is_set():
            return
        _announced.set()
    source, directory = _choose()
    if directory is None:
        where = "no writable cache directory: every process compiles them again (set NUMBA_CACHE_DIR)"
    else:
        where = f"cached in {directory}: later processes load them in about {WARM_LOAD}"
    logger.warning(
        "geograph: compiling the numba kernels of the exact solvers (up to about %s, each once); %s",
        COLD_COMPILE,
        where,
    )


def compile_stats() -> dict[str, dict[str, int]]:
    """Per compiled kernel of geograph that this process has called: signatures loaded from the
    on-disk cache (``cache_hits``) and compiled here (``cache_misses``), numba's own counts."""
    out: dict[str, dict[str, int]] = {}
    for kernel in _kernels:
        stats = kernel.stats
        hits, misses = sum(stats.cache_hits.values()), sum(stats.cache_misses.values())
        if hits or misses:
            counts = out.setdefault(kernel.py_func.__qualname__, {"cache_hits": 0, "cache_misses": 0})
            counts["cache_hits"] += hits
            counts["cache_misses"] += misses
    return out


#: every kernel made by :func:`jit` in this process
_kernels: list[Dispatcher[Any]] = []


def _writable(path: str) -> bool:
    """numba's own test: the directory can be created (private, when it is created here) and a file
    written in it."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
        return True
    except (OSError, ValueError):
        return False


def _unsafe(path: str) -> str | None:
    """Why ``path`` may not hold a cache this process loads (``None``: it may): owned by another
    user, or writable by its group or by everyone."""
    try:
        st = os.stat(os.path.realpath(path))
    except OSError as e:
        return f"cannot stat it ({e.strerror or e})"
    uid = os.getuid() if hasattr(os, "getuid") else None
    if uid is not None and st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by its group or by everyone (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _fresh_tempdir() -> str | None:
    """A new private (0700) temporary directory for this process, or ``None`` when none can be made."""
    try:
        return tempfile.mkdtemp(prefix="geograph-numba-")
    except OSError:
        return None


def _private_tempdir() -> str | None:
    """``<tempdir>/geograph-numba-<uid>`` if it is ours and private, else a fresh private one."""
    try:
        base = tempfile.gettempdir()
    except (OSError, FileNotFoundError):  # no usable temporary directory
        return None
    uid = os.getuid() if hasattr(os, "getuid") else None
    path = os.path.join(base, f"geograph-numba-{uid if uid is not None else 'user'}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(path)
        ours = stat.S_ISDIR(st.st_mode) and (uid is None or st.st_uid == uid) and not st.st_mode & 0o077
    except OSError:
        ours = False
    if ours and _writable(path):
        return path
    return _fresh_tempdir()  # someone else's (a cache there would be code we load), or too open


def _first_writable() -> tuple[str, str] | None:
    """The first writable candidate of 1-4 of the module docstring, unchecked for ownership."""
    import numba

    package = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__")
    # $NUMBA_CACHE_DIR, read when numba was imported
    explicit: str | None = numba.config.CACHE_DIR  # type: ignore[attr-defined]  # numba.config sets its attributes from the environment at import
    if explicit:
        if _writable(explicit):
            return "NUMBA_CACHE_DIR", explicit
        logger.warning(
            "geograph: NUMBA_CACHE_DIR=%s is not writable; looking for another numba cache directory", explicit
        )
    if _writable(package):
        return "package", package
    root = os.environ.get("GEOGRAPH_CACHE")
    if root and _writable(os.path.join(root, "numba")):
        return "GEOGRAPH_CACHE", os.path.join(root, "numba")
    try:
        from numba.misc.appdirs import AppDirs

        user = AppDirs(appname="numba", appauthor=False).user_cache_dir  # type: ignore[no-untyped-call]  # numba's vendored appdirs is untyped
    except Exception:  # noqa: BLE001 - numba internals moved: skip this candidate
        user = None
    if user and _writable(user):
        return "user", user
    return None


@functools.cache
def _choose() -> tuple[str, str | None]:
    found = _first_writable()
    if found is not None:
        source, directory = found
        reason = _unsafe(directory)
        if reason is None:
            return source, directory
        tmp = _fresh_tempdir()
        logger.warning(
            "geograph: not caching numba kernels in %s (%s, %s): anyone who can write there runs code in "
            "this process; using the private temporary directory %s instead",
            directory,
            source,
            reason,
            tmp,
        )
        return ("temp", tmp) if tmp is not None else ("none", None)
    tmp = _private_tempdir()
    if tmp is not None:
        return "temp", tmp
    return "none", None


def cache_info() -> dict[str, str | None]:
    """Where geograph's numba kernels are cached: ``{"source": ..., "directory": ...}``.

    ``source`` is ``"NUMBA_CACHE_DIR"``, ``"package"``, ``"GEOGRAPH_CACHE"``, ``"user"``,
    ``"temp"`` or ``"none"`` (compiled in memory, ``directory`` is ``None``); see the module
    docstring for the order.
    """
    source, directory = _choose()
    return {"source": source, "directory": directory}


_logged = False


def _log_choice() -> None:
    global _logged
    if _logged:
        return
    _logged = True
    source, directory = _choose()
    if source == "none":
        logger.warning(
            "geograph: no writable directory for numba's cache (package, $GEOGRAPH_CACHE, ~/.cache, "
            "the temporary directory): the kernels compile in memory in every process; set "
            "NUMBA_CACHE_DIR to a writable directory to keep them"
        )
    elif source == "package":
        logger.debug("geograph: numba kernels cached in %s", directory)
    else:
        logger.info(
            "geograph: numba kernels cached in %s (%s; the package's __pycache__ is not writable%s)",
            directory,
            source,
            "" if source != "NUMBA_CACHE_DIR" else " or not used",
        )


@contextlib.contextmanager
def _cache_dir(path: str) -> Iterator[None]:
    import numba

    old = numba.config.CACHE_DIR  # type: ignore[attr-defined]  # numba.config sets its attributes from the environment at import
    numba.config.CACHE_DIR = path  # type: ignore[attr-defined]
    try:
        yield
    finally:
        numba.config.CACHE_DIR = old  # type: ignore[attr-defined]


def jit(**flags: Unpack[_JITOptions]) -> Callable[[_F], Dispatcher[_F]]:
    """``numba.njit(**flags)`` with the on-disk cache of :func:`cache_info` (or none), keyed also on
    :func:`sources_digest`."""
    from numba import njit

    source, directory = _choose()
    _log_choice()

    def decorate(fn: _F) -> Dispatcher[_F]:
        kernel = njit(cache=False, **flags)(fn)
        _kernels.append(kernel)
        if directory is None:
            kernel._cache = _null_cache_class()()  # type: ignore[attr-defined]  # numba's private
            return kernel
        # numba's enable_caching() with the digest in the key; the locator is picked here
        with _cache_dir(directory) if source != "package" else contextlib.nullcontext():
            kernel._cache = _kernel_cache_class()(kernel.py_func)  # type: ignore[attr-defined]  # numba's private
        return kernel

    return decorate


@contextlib.contextmanager
def torch_threads_kept() -> Iterator[None]:
    """Keep the calling thread's torch (OpenMP) thread count across a call that may change it.

    A library that sets its own OpenMP threads (faiss, numba) sets the calling thread's count,
    which torch shares. numba's OpenMP threading layer, started by a process's first parallel kernel or first
    ``numba.get_num_threads()``, sets the starting thread's OpenMP count to numba's own
    (``NUMBA_NUM_THREADS``, all cores); torch shares that count, so a server worker limited to one
    thread would run torch on every core after its first exact Ricci call. numba passes its count
    to each parallel region itself: restoring the caller's does not change the kernels.
    """
    import torch

    before = torch.get_num_threads()
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def numba_threads() -> int:
    """``numba.get_num_threads()``, which starts numba's threading layer, keeping torch's count."""
    import numba

    with torch_threads_kept():
        return int(numba.get_num_threads())


def locked(kernel: Dispatcher[Callable[_P, _R]]) -> LockedKernel[_P, _R]:
    """A Python entry point that runs the compiled ``kernel`` under :data:`KERNEL_LOCK`.

    The kernel should be compiled with ``nogil=True``: waiting threads then sleep on the lock
    without holding the GIL, and the running one does not hold it either.
    """

    run = cast("Callable[..., _R]", kernel)

    @functools.wraps(kernel.py_func)
    def call(*args: Any) -> _R:
        with KERNEL_LOCK, torch_threads_kept():
            return run(*args)

    entry = cast("LockedKernel[_P, _R]", call)
    entry.kernel = kernel
    return entry


def warmup() -> dict[str, object]:
    """Compile (or load from the cache) every numba kernel geograph runs, on tiny inputs.

    Runs the exact Ricci flow, the exact Ollivier-Ricci curvature and the exact batched OT
    through their public functions, so every signature a later call uses is compiled: the
    first real request does not pay for compilation (seconds per kernel without a cache).
    Call it at start-up (a server before it reports healthy); repeated calls are cheap.

    Returns:
        ``{"seconds": ..., "threading_layer": ..., "threads": ..., **cache_info()}``.

    Example:
        >>> info = warmup()
        >>> sorted(info)
        ['directory', 'seconds', 'source', 'threading_layer', 'threads']
    """
    import numba
    import torch

    from geograph.transport.curvature import ollivier_ricci
    from geograph.transport.flow import ricci_flow
    from geograph.transport.solvers import emd

    t0 = time.perf_counter()
    n = 4
    adj = torch.ones(1, n, n, dtype=torch.bool) & ~torch.eye(n, dtype=torch.bool)
    w = torch.ones(1, n, n, dtype=torch.float64)
    ricci_flow(adj, w, iterations=2, solver="exact")
    ollivier_ricci(w, adj, solver="exact")
    c = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]], dtype=torch.float64)
    half = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    emd(c, half, half)
    return {
        "seconds": time.perf_counter() - t0,
        "threading_layer": numba.threading_layer(),  # type: ignore[attr-defined]  # exported at runtime, not in the stubs
        "threads": numba_threads(),
        **cache_info(),
    }
