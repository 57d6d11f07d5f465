"""The README's measured figures are the benchmark files' figures: every interval and every
speed-up the README's results table quotes appears in the table the site generates from
``docs/bench`` for that method (``docs/_ext/geograph_docs.py``)."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import geograph_docs  # noqa: E402

FIGURE = re.compile(r"[+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]|\d+\.\dx|\b\d+ s\b|\b0\.\d{4}\b")
LABELS = {"Maniscope": "Maniscope", "Ricci-Filtration": "Ricci-Filtration", "ISO-RAG": "ISO-RAG", "G3RAG": "G3RAG"}


def readme_rows() -> dict[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## What we measured") :]
    section = section[: section.index("\n## ", 5)]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| \[([^\]]+)\]\(docs/methods/", line)
        if m:
            rows[m.group(1)] = line
    return rows


def generated(label: str) -> str:
    scale = geograph_docs.bench_scale("scale-recall-target.json")
    if label == "dense":
        return geograph_docs.bench_method("dense") + scale
    return geograph_docs.bench_method(LABELS[label]) + scale


ROWS = readme_rows()


def test_the_readme_has_a_row_per_method():
    assert set(ROWS) == {"Maniscope", "Ricci-Filtration", "ISO-RAG", "G3RAG", "dense"}


@pytest.mark.parametrize("label", sorted(ROWS))
def test_readme_figures_come_from_the_benchmark_files(label):
    table = generated(label)
    figures = FIGURE.findall(ROWS[label])
    assert figures, f"no figure found in the README row of {label}"
    missing = [f for f in figures if f.removesuffix(" s") not in table]
    assert not missing, f"README figures of {label} not in the generated tables: {missing}"


def test_a_changed_figure_is_caught():
    row = ROWS["Maniscope"].replace("19.9x", "29.9x")
    assert "29.9x" in FIGURE.findall(row) and "29.9x" not in generated("Maniscope")
