"""The compiled (numba) kernels at run time: read-only installs, the cache choice, warm-up, threads, the GIL."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

from geograph import RicciFiltration
from geograph.transport._numba import runtime as _numba
from geograph.transport._numba.runtime import cache_info, warmup

ROOT = Path(__file__).resolve().parents[1]

RICCI_SCRIPT = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
import torch, geograph
from geograph import RicciFiltration
from geograph.functional import numba_cache_info
g = torch.Generator().manual_seed(0)
q, docs = torch.randn(3, 8, generator=g), torch.randn(3, 7, 8, generator=g)
out = RicciFiltration(solver="exact", iterations=5)(q, docs)
print(json.dumps({"file": geograph.__file__, "cache": numba_cache_info(), "keep": out.keep.tolist(),
                  "length": out.query_edge_length.tolist()}))
"""


def ricci_here() -> dict:
    g = torch.Generator().manual_seed(0)
    q, docs = torch.randn(3, 8, generator=g), torch.randn(3, 7, 8, generator=g)
    out = RicciFiltration(solver="exact", iterations=5)(q, docs)
    return {"keep": out.keep.tolist(), "length": out.query_edge_length.tolist()}


def read_only_copy() -> Path:
    """The package copied into a world-readable, nobody-writable directory (the caller removes it)."""
    # a fixed path per package content, so that reruns find the kernels compiled by the last run
    # in the temporary cache (numba keys a cache directory on the source's path)
    digest = hashlib.sha1()
    for f in sorted((ROOT / "geograph").rglob("*.py")):
        digest.update(str(f.relative_to(ROOT)).encode() + f.read_bytes())
    top = Path(tempfile.gettempdir()) / f"geograph-ro-{digest.hexdigest()[:12]}"
    if top.exists():
        make_writable_and_remove(top)
    top.mkdir()
    shutil.copytree(
        ROOT / "geograph", top / "geograph", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc")
    )
    for path in [top, *top.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(
            (mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH | (0o555 if path.is_dir() else 0))
            & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
        )
    return top


def make_writable_and_remove(top: Path) -> None:
    for path in [top, *top.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    shutil.rmtree(top, ignore_errors=True)


def as_unprivileged(cmd: list[str]) -> list[str]:
    """Run as nobody when we are root (CI); a normal user already cannot write the read-only copy."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: cannot drop to an unprivileged user")
        return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    return cmd


@pytest.mark.integration
@pytest.mark.slow
def test_ricci_exact_on_a_read_only_install_with_a_read_only_home():
    """The package on a read-only path, $HOME unwritable, an unprivileged user: the exact path runs.

    Before the cache choice, importing the kernels raised ``RuntimeError: cannot cache function
    '_build_tree': no locator available``. Here numba's own locators all fail (no writable
    __pycache__, no writable ~/.cache), so the kernels go to a private temporary directory.
    """
    top = read_only_copy()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "XDG_", "GEOGRAPH_"))}
        env.update(PYTHONPATH=str(top), HOME=str(top / "geograph"), PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1")
        cmd = as_unprivileged([sys.executable, "-c", RICCI_SCRIPT])
        probe = subprocess.run(
            as_unprivileged(
                ["sh", "-c", f"mkdir {top}/geograph/functional/__pycache__ || touch {top}/geograph/x || echo read-only"]
            ),
            capture_output=True,
            text=True,
            env=env,
        )
        assert probe.stdout.strip() == "read-only", "the copy is writable: the test would check nothing"
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(top), timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        assert got["file"] == str(top / "geograph" / "__init__.py")  # the copy, not the editable install
        assert got["cache"]["source"] == "temp", got["cache"]
        assert "numba kernels cached in" in proc.stderr  # the choice is logged
        want = ricci_here()
        assert got["keep"] == want["keep"] and got["length"] == want["length"]
    finally:
        make_writable_and_remove(top)


@pytest.fixture
def fresh_choice(monkeypatch):
    """Re-run the cache choice with a patched environment (the real one is cached per process)."""
    _numba._choose.cache_clear()
    yield
    _numba._choose.cache_clear()


def test_cache_choice_order(tmp_path, monkeypatch, fresh_choice):
    import numba

    package = os.path.join(os.path.dirname(_numba.__file__), "__pycache__")
    writable = {str(tmp_path / "numba-env"), package, str(tmp_path / "gg" / "numba")}
    monkeypatch.setattr(_numba, "_unsafe", lambda p: None)  # the order only: ownership is tested below
    monkeypatch.setattr(_numba, "_writable", lambda p: str(p) in writable)
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "numba-env"))
    monkeypatch.setenv("GEOGRAPH_CACHE", str(tmp_path / "gg"))
    assert cache_info() == {"source": "NUMBA_CACHE_DIR", "directory": str(tmp_path / "numba-env")}
    _numba._choose.cache_clear()
    writable.discard(str(tmp_path / "numba-env"))  # set but unwritable: skipped
    assert cache_info()["source"] == "package"
    _numba._choose.cache_clear()
    writable.discard(package)  # a read-only install
    assert cache_info() == {"source": "GEOGRAPH_CACHE", "directory": str(tmp_path / "gg" / "numba")}
    _numba._choose.cache_clear()
    writable.clear()  # nothing writable but the temporary directory
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(_numba, "_writable", lambda p: str(p).startswith(str(tmp_path / "tmp")))
    info = cache_info()
    assert info["source"] == "temp" and info["directory"].startswith(str(tmp_path / "tmp"))
    assert stat.S_IMODE(os.stat(info["directory"]).st_mode) == 0o700
    _numba._choose.cache_clear()
    monkeypatch.setattr(_numba, "_writable", lambda p: False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    assert cache_info() == {"source": "none", "directory": None}


@pytest.mark.parametrize("where", ["NUMBA_CACHE_DIR", "GEOGRAPH_CACHE"])
def test_a_cache_dir_others_can_write_is_not_used(tmp_path, monkeypatch, fresh_choice, caplog, where):
    """Group- or world-writable: a warning names it and a fresh private temporary directory is used."""
    import numba

    shared = tmp_path / "shared" / "numba"
    shared.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    package = os.path.join(os.path.dirname(_numba.__file__), "__pycache__")
    monkeypatch.setattr(_numba, "_writable", lambda p: str(p) != package and os.access(p, os.W_OK))
    if where == "NUMBA_CACHE_DIR":
        monkeypatch.setattr(numba.config, "CACHE_DIR", str(shared))
    else:
        monkeypatch.setattr(numba.config, "CACHE_DIR", "")
        monkeypatch.setenv("GEOGRAPH_CACHE", str(shared.parent))
    for mode in (0o770, 0o707, 0o777):
        _numba._choose.cache_clear()
        shared.chmod(mode)
        caplog.clear()
        with caplog.at_level("WARNING", logger="geograph"):
            info = cache_info()
        assert info["source"] == "temp" and Path(info["directory"]).parent == tmp_path / "tmp", (mode, info)
        assert stat.S_IMODE(os.stat(info["directory"]).st_mode) == 0o700
        assert f"not caching numba kernels in {shared}" in caplog.text and f"mode {mode:o}" in caplog.text
    _numba._choose.cache_clear()
    shared.chmod(0o755)  # the user's own, not writable by others: used
    assert cache_info() == {"source": where, "directory": str(shared)}


def test_a_cache_dir_owned_by_another_user_is_not_used(tmp_path, monkeypatch, fresh_choice, caplog):
    """Owned by someone else (even if writable here, as it is for root): a private temporary one instead."""
    import numba

    mine = tmp_path / "numba"
    mine.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(mine))
    assert cache_info() == {"source": "NUMBA_CACHE_DIR", "directory": str(mine)}
    _numba._choose.cache_clear()
    owner = os.stat(mine).st_uid
    monkeypatch.setattr(os, "getuid", lambda: owner + 1)  # this process is now another user than the owner
    with caplog.at_level("WARNING", logger="geograph"):
        info = cache_info()
    assert info["source"] == "temp" and Path(info["directory"]).parent == tmp_path / "tmp"
    assert f"owned by uid {owner}, not by this user (uid {owner + 1})" in caplog.text


def test_private_tempdir_refuses_a_shared_one(tmp_path, monkeypatch):
    """A cache dir that others can write is code anyone could plant: a fresh private one is used."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shared = tmp_path / f"geograph-numba-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    got = _numba._private_tempdir()
    assert got is not None and Path(got) != shared and stat.S_IMODE(os.stat(got).st_mode) == 0o700
    shared.chmod(0o700)
    assert Path(_numba._private_tempdir()) == shared


def test_jit_without_a_cache_compiles_in_memory(monkeypatch):
    from numba.core.caching import NullCache

    monkeypatch.setattr(_numba, "_choose", lambda: ("none", None))

    @_numba.jit(nogil=True)
    def twice(x):
        return 2 * x

    assert twice(21) == 42 and isinstance(twice._cache, NullCache)


def test_cached_kernels_are_keyed_on_every_kernel_source(tmp_path, monkeypatch):
    """A cached kernel is found again only while every kernel source is unchanged: the Ricci drivers
    compile in the simplex of another file, and numba alone keys a kernel on its own file."""
    from numba.core.caching import FunctionCache

    monkeypatch.setattr(_numba, "_choose", lambda: ("NUMBA_CACHE_DIR", str(tmp_path)))

    @_numba.jit(nogil=True)
    def twice(x):
        return 2 * x

    assert twice(21) == 42 and list(tmp_path.rglob("*.nbi"))  # compiled and saved
    sig, ctx = twice.signatures[0], twice.targetctx
    key = twice._cache._index_key(sig, ctx.codegen())
    # numba's own key (signature, target, bytecode and closure hashes), then the digest
    assert key == (*FunctionCache(twice.py_func)._index_key(sig, ctx.codegen()), _numba.sources_digest())
    assert key[0] == sig and len(key) == 4
    assert twice._cache.load_overload(sig, ctx) is not None  # the saved entry loads
    monkeypatch.setattr(_numba, "sources_digest", lambda: "another simplex")
    assert twice._cache.load_overload(sig, ctx) is None  # an edit to any kernel source misses it


def test_kernel_sources_list_every_module_a_kernel_reads():
    """Every module that compiles kernels, and every private module of the package one of them imports."""
    folder = ROOT / "geograph" / "transport" / "_numba"
    listed = set(_numba.KERNEL_SOURCES)
    uses_jit = re.compile(r"^from geograph\.transport\._numba\.runtime import .*\bjit\b", re.M)
    kernels = [f for f in folder.glob("*.py") if uses_jit.search(f.read_text())]
    assert {f.name for f in kernels} >= {"simplex.py", "ricci.py"}
    for f in kernels:
        assert f.name in listed, f.name
        for name in re.findall(r"from geograph\.transport\._numba\.(\w+) import", f.read_text()):
            assert f"{name}.py" in listed, (f.name, name)
    digest = _numba.sources_digest()
    assert len(digest) == 64 and all((folder / name).is_file() for name in listed)


def test_warmup_compiles_what_the_modules_call():
    """After warmup(), Ricci-Filtration (exact, and Sinkhorn's exact re-solves) compiles nothing new."""
    from geograph.transport._numba.ricci import curvature_batch, flow_batch
    from geograph.transport._numba.simplex import emd_batch

    info = warmup()
    assert info["source"] == cache_info()["source"] and info["threading_layer"] in {"tbb", "omp", "workqueue"}
    before = {f.__name__: len(f.kernel.signatures) for f in (flow_batch, curvature_batch, emd_batch)}
    assert all(before.values()), before
    g = torch.Generator().manual_seed(1)
    q, docs = torch.randn(2, 8, generator=g), torch.randn(2, 9, 8, generator=g)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    RicciFiltration(solver="exact", iterations=3)(q, docs, mask)
    RicciFiltration(solver="sinkhorn", iterations=2, cert_tol=0.0)(q, docs, mask)  # every edge re-solved exactly
    RicciFiltration(solver="exact", iterations=3)(q.double(), docs.double())
    after = {f.__name__: len(f.kernel.signatures) for f in (flow_batch, curvature_batch, emd_batch)}
    assert after == before


def test_parallel_entry_points_release_the_gil():
    """While one thread is inside the exact flow, another thread runs Python code.

    No timing threshold: the solving thread records when it entered and left the kernel, the
    other thread timestamps its loop iterations; holding the GIL would leave none in between.
    (numba's parallel regions run without the GIL even in a kernel compiled without
    ``nogil=True``; the serial code between them holds it unless the kernel has ``nogil=True``,
    hence the flag check as well.)
    """
    import numpy as np

    from geograph.transport._numba.ricci import curvature_batch, flow_batch
    from geograph.transport._numba.simplex import emd_batch
    from geograph.transport.solvers import _MAX_PIVOTS

    for f in (flow_batch, curvature_batch, emd_batch):
        assert f.kernel.targetoptions.get("nogil") is True and f.kernel.targetoptions.get("parallel"), f.__name__
    warmup()
    rng = np.random.default_rng(0)
    n, b = 16, 48
    adj = rng.random((b, n, n)) < 0.5
    adj = np.triu(adj, 1)
    adj = adj | adj.transpose(0, 2, 1)
    mask = np.ones((b, n), dtype=bool)
    w = np.ones((b, n, n))
    span, stamps, done = [], [], threading.Event()

    def solve():
        t0 = time.perf_counter()
        flow_batch(w, adj, mask, alpha=0.5, exp_power=2.0, iterations=20, step=1.0, delta=0.0, max_pivots=_MAX_PIVOTS)
        span.extend([t0, time.perf_counter()])
        done.set()

    t = threading.Thread(target=solve)
    t.start()
    while not done.is_set():
        stamps.append(time.perf_counter())
    t.join()
    inside = [s for s in stamps if span[0] < s < span[1]]
    assert len(inside) > 10, f"{len(inside)} Python steps ran during a {span[1] - span[0]:.3f} s solve"


THREADS_KEPT = """
import torch
torch.set_num_threads(1)
from geograph import RicciFiltration
from geograph.transport._numba.runtime import warmup
q, docs = torch.randn(2, 8, dtype=torch.float64), torch.randn(2, 6, 8, dtype=torch.float64)
RicciFiltration(solver="exact")(q, docs)
after_call = torch.get_num_threads()
info = warmup()
print(after_call, torch.get_num_threads(), info["threads"])
"""


def test_starting_numbas_threads_keeps_torchs_thread_count():
    """numba's OpenMP layer, started once per process, sets the caller's OpenMP count (which torch
    shares) to all cores: a worker that asked torch for one thread keeps one (a fresh process, as
    the layer starts only once)."""
    env = {**os.environ, "NUMBA_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", THREADS_KEPT], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    after_call, after_warmup, numba_threads = map(int, out.stdout.split())
    assert (after_call, after_warmup, numba_threads) == (1, 1, 2)


NOTICE = "compiling the numba kernels of the exact solvers"

FIRST_USE = """
import json, torch
from geograph.functional import emd, numba_cache_info, numba_compile_stats
c = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]], dtype=torch.float64)
half = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
emd(c, half, half)
print(json.dumps({"cache": numba_cache_info(), "stats": numba_compile_stats()}))
"""


@pytest.mark.integration
@pytest.mark.slow
def test_first_compilation_says_so_once_and_the_next_process_loads_the_cache(tmp_path):
    """A fresh process with an empty cache: one notice (with the cache directory) before it compiles;
    the next fresh process with the same cache: no notice, the kernel loaded from the cache (numba's
    own hit and miss counts; the exact OT kernel and the simplex it calls, a part of what warmup()
    compiles, to keep the test short)."""
    cache = tmp_path / "numba"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "GEOGRAPH_"))}
    env.update(NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")

    def fresh_process():
        proc = subprocess.run([sys.executable, "-c", FIRST_USE], capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stderr, json.loads(proc.stdout.strip().splitlines()[-1])

    stderr, first = fresh_process()
    assert first["cache"] == {"source": "NUMBA_CACHE_DIR", "directory": str(cache)}
    notices = [line for line in stderr.splitlines() if NOTICE in line]
    assert len(notices) == 1 and f"cached in {cache}" in notices[0], stderr
    assert first["stats"]["_emd_batch"] == {"cache_hits": 0, "cache_misses": 1}
    assert list(cache.rglob("*.nbi")), "nothing was written to the cache"
    stderr, second = fresh_process()
    assert NOTICE not in stderr, stderr
    assert second["stats"] == {"_emd_batch": {"cache_hits": 1, "cache_misses": 0}}  # loaded, nothing compiled


@pytest.fixture
def unannounced(monkeypatch):
    """This process as if it had compiled nothing yet (the notice is once per process)."""
    monkeypatch.setattr(_numba, "_announced", threading.Event())


def test_notice_before_a_compilation_not_after_a_cache_load(tmp_path, monkeypatch, caplog, unannounced):
    monkeypatch.setattr(_numba, "_choose", lambda: ("NUMBA_CACHE_DIR", str(tmp_path)))

    def thrice(x):
        return 3 * x

    with caplog.at_level("WARNING", logger="geograph"):
        first = _numba.jit(nogil=True)(thrice)
        assert first(4) == 12 and first(5) == 15  # one compilation, one notice
        assert [r.getMessage() for r in caplog.records if NOTICE in r.getMessage()] == [
            f"geograph: {NOTICE} (up to about {_numba.COLD_COMPILE}, each once); cached in {tmp_path}: later processes "
            f"load them in about {_numba.WARM_LOAD}"
        ]
        assert first.stats.cache_misses and not first.stats.cache_hits
        caplog.clear()
        monkeypatch.setattr(_numba, "_announced", threading.Event())  # as a new process would start
        again = _numba.jit(nogil=True)(thrice)  # a new dispatcher of the same function: from the cache
        assert again(4) == 12
        assert not [r for r in caplog.records if NOTICE in r.getMessage()]
        assert again.stats.cache_hits and not again.stats.cache_misses
        stats = _numba.compile_stats()
    assert stats["test_notice_before_a_compilation_not_after_a_cache_load.<locals>.thrice"] == {
        "cache_hits": 1,
        "cache_misses": 1,
    }


def test_notice_without_a_cache_says_every_process_compiles(monkeypatch, caplog, unannounced):
    monkeypatch.setattr(_numba, "_choose", lambda: ("none", None))

    @_numba.jit(nogil=True)
    def twice_more(x):
        return 2 * x + 1

    with caplog.at_level("WARNING", logger="geograph"):
        assert twice_more(1) == 3
    notices = [r.getMessage() for r in caplog.records if NOTICE in r.getMessage()]
    assert len(notices) == 1 and "every process compiles them again (set NUMBA_CACHE_DIR)" in notices[0]
