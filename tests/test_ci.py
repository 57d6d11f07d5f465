"""Under CI=true a test whose needed package is missing fails; locally it skips (tests/conftest.py)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import pytest
from conftest import require

def test_importorskip_missing():
    pytest.importorskip("geograph_no_such_package")

def test_require_missing():
    require("geograph_no_such_package")

def test_require_present():
    assert require("json").dumps(1) == "1"
"""


@pytest.mark.integration
def test_missing_package_fails_under_ci(tmp_path):
    """One pytest run in a subprocess (the local behaviour, a skip, is what every other test shows)."""
    ci, failed, skipped = "true", 2, 0
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {**os.environ, "CI": ci}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_probe.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    tail = res.stdout.strip().splitlines()[-1]
    assert ("1 passed" in tail) and (f"{failed} failed" in tail if failed else "failed" not in tail), res.stdout
    assert f"{skipped} skipped" in tail if skipped else "skipped" not in tail, res.stdout
    assert (res.returncode != 0) == bool(failed)
