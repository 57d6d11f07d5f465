"""The commit-msg hook (.ci/commit_subject.py, run by pre-commit) keeps commit subjects at 72 characters."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "commit_subject.py"


def run(tmp_path, message):
    f = tmp_path / "COMMIT_EDITMSG"
    f.write_text(message, encoding="utf-8")
    return subprocess.run([sys.executable, str(SCRIPT), str(f)], capture_output=True, text=True)


@pytest.mark.parametrize(
    "message",
    ["x" * 72, "Move the k-NN engine to its own package\n\n" + "a long body line " * 20, "# comment\nShort subject\n"],
)
def test_accepts(tmp_path, message):
    out = run(tmp_path, message)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""


@pytest.mark.parametrize(("message", "words"), [("x" * 73, "73 characters"), ("\n\nbody only", "empty"), ("", "empty")])
def test_rejects_in_one_line(tmp_path, message, words):
    out = run(tmp_path, message)
    assert out.returncode == 1
    assert words in out.stderr and out.stderr.count("\n") == 1


def test_pre_commit_runs_it_at_commit_msg():
    config = (SCRIPT.parents[1] / ".pre-commit-config.yaml").read_text()
    assert ".ci/commit_subject.py" in config and "commit-msg" in config
