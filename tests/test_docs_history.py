"""The product describes the code as it is: no file of the package, the tests, the docs, the
configs or the notebooks names a tracker issue by number, a development run or step (file names
included), or a default data path outside the repository. History lives in ``CHANGELOG.md`` and git.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("geograph", "tests", "docs", "configs", "notebooks", "train")
TEXT = {".py", ".md", ".rst", ".txt", ".yaml", ".yml", ".toml", ".json", ".ipynb", ".cfg", ".ini", ".tsv", ".log"}
SKIP = {"_build", "__pycache__", ".ipynb_checkpoints"}

# the patterns are spelled in pieces so that this file does not match itself
PATTERNS = {
    "an issue number": re.compile(r"\b" + "is" + r"sues?\s*#?\s*\d+", re.IGNORECASE),
    "a pull request number": re.compile(r"\b" + "P" + r"R\s*#\d+"),
    "a run name": re.compile(r"(-|\b)" + "st" + r"op[-_ ]?\d+\b", re.IGNORECASE),
    "a development session": re.compile(r"\b" + "ses" + r"sion\s+\d+\b|\b" + "he" + r"lper\s+\d+\b", re.IGNORECASE),
    "an anecdote of the development machine": re.compile("was " + "lent|" + "no GPU was " + "len", re.IGNORECASE),
    "a data path outside the repository": re.compile(r"\.\./" + "shared" + r"/|/work/" + "shared"),
}


# a benchmark's JSON records the folder it read on the machine that ran it: a record, not a default
RECORDS = {".json", ".log"}
NOT_IN_RECORDS = {"a data path outside the repository"}


def findings(text: str, suffix: str = ".py") -> list[str]:
    """What ``text`` (of a file ending in ``suffix``) names that it should not, one entry per match."""
    return [
        f"{what}: {m.group(0)!r}"
        for what, pattern in PATTERNS.items()
        if not (suffix in RECORDS and what in NOT_IN_RECORDS)
        for m in pattern.finditer(text)
    ]


def files():
    yield ROOT / "README.md"
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and not SKIP & set(path.parts) and path.suffix in TEXT:
                yield path


def test_no_history_in_the_product():
    bad = []
    for path in files():
        rel = path.relative_to(ROOT)
        bad += [f"{rel} (file name): {f}" for f in findings(str(rel))]
        for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            bad += [f"{rel}:{lineno}: {f}" for f in findings(line, path.suffix)]
    assert not bad, "development history in the product:\n" + "\n".join(bad)


def test_the_scan_covers_the_product():
    scanned = {str(p.relative_to(ROOT)) for p in files()}
    assert {"README.md", "geograph/serve/api.py", "tests/ricci_reference.py", "docs/bench/serve.json"} <= scanned
    assert not any("_build" in Path(s).parts for s in scanned)


@pytest.mark.parametrize(
    "text",
    [
        "the p99 tail of " + "is" + "sue 26",
        "see " + "Is" + "sue #19",
        "docs/bench/serve-" + "st" + "op6.json",
        "scale-" + "st" + "op5.md",
        "measured in " + "ses" + "sion 3",
        "untimed: no GPU was " + "lent",
        "default ../" + "shared" + "/data/scifact",
    ],
)
def test_each_kind_is_found(text):
    assert findings(text)


@pytest.mark.parametrize(
    "text",
    [
        "stop the relaxation once no distance changes (one check every 4 steps)",
        "requests.Session()",
        "ray_session(num_cpus=2)",
        "an issue with the input",
        "early_stop: bool = True",
        "a shared data folder",
    ],
)
def test_ordinary_words_pass(text):
    assert not findings(text)
