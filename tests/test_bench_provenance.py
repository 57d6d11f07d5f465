"""Every benchmark's JSON names the commit it ran from and the UTC date, by one helper."""

import re
import subprocess
from pathlib import Path

import pytest

from geograph.bench.common import commit, provenance

ROOT = Path(__file__).resolve().parents[1]


def test_the_commit_is_the_checkouts_head_and_the_date_utc():
    done = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    got = provenance()
    assert got["commit"].removesuffix("-dirty") == done.stdout.strip() == commit().removesuffix("-dirty")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", got["date"])


def test_every_benchmark_uses_the_one_helper():
    sources = [p for p in (ROOT / "geograph").rglob("*.py") if "rev-parse" in p.read_text()]
    assert sources == [ROOT / "geograph" / "bench" / "common.py"]
