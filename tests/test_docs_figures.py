"""The README's measured figures are the benchmark files' figures: every interval and every
speed-up the README's results table quotes appears in the table the site generates from
``docs/bench`` for that method (``docs/_ext/geograph_docs.py``)."""

import json
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


#: "same top-k as the reference on all N queries it ran (of M)" in a README row
PARITY = re.compile(r"same top-k as the reference on all (\d+) queries it ran \(of (\d+)\)")


def parity_claims(row: str) -> list[tuple[int, int]]:
    return [(int(n), int(m)) for n, m in PARITY.findall(row)]


@pytest.mark.parametrize("label", ["Maniscope", "Ricci-Filtration"])
def test_readme_parity_counts_are_the_benchmark_files(label):
    """The README's count of queries compared with the reference is SciFact's in results.json, and
    the top-k was the reference's on every one of them."""
    results = json.loads((ROOT / "docs" / "bench" / "results.json").read_text(encoding="utf-8"))
    scifact = results["datasets"]["scifact"]
    speed = scifact["methods"][LABELS[label]]["speed"]
    claims = parity_claims(ROWS[label])
    assert claims == [(speed["reference_queries"], scifact["queries_reported"])], (ROWS[label], speed)
    assert speed["reference_top_k_identical"] == 1.0


def test_a_changed_parity_count_is_caught():
    assert parity_claims("x; same top-k as the reference on all 300 queries it ran (of 300) |") == [(300, 300)]
    assert parity_claims("the reference's top-k on every query compared") == []
