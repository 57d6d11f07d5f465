"""What the docs say about the package is what the package declares: the Python version
(``requires-python``), the extras (``[project.optional-dependencies]``) and the methods
``geograph serve --method`` takes (:mod:`geograph.registry`). Each is read from its source, so
a new extra or method fails here until the pages name it."""

import re
import tomllib
from pathlib import Path

import pytest

from geograph import registry

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
#: the pages a new user installs from
INSTALL_PAGES = ("README.md", "docs/getting-started.md", "docs/guide/install.md")
PYTHON = re.compile(r"\bPython (\d+\.\d+)\b")
NAME = re.compile(r"`([a-z][a-z0-9-]*)`")


def _text(rel: str) -> str:
    return (ROOT / rel).read_text(encoding="utf-8")


def python_floor() -> str:
    """The lowest Python of ``requires-python`` (``>=3.11`` -> ``3.11``)."""
    m = re.fullmatch(r">=\s*(\d+\.\d+)(?:\.0)?", PYPROJECT["requires-python"].strip())
    assert m, f"requires-python {PYPROJECT['requires-python']!r}: expected '>=X.Y'"
    return m.group(1)


def python_versions(text: str) -> list[str]:
    """Every ``Python X.Y`` a page names."""
    return PYTHON.findall(text)


def extras_tables(text: str) -> list[set[str]]:
    """The extras of each Markdown table whose first column is headed ``extra``: the backquoted
    names of that column (a cell may name several, ``` `langchain`, `llamaindex` ```)."""
    tables, current = [], None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else None
        if cells is None:
            current = None
            continue
        if current is None:
            if cells[0] == "extra":
                current = set()
                tables.append(current)
            continue
        if set(cells[0]) <= set("-: "):
            continue  # the header's rule
        current.update(NAME.findall(cells[0]))
    return tables


def serve_method_lists(text: str) -> list[list[str]]:
    """The choices of every ``geograph serve --method {a,b,...}``."""
    return [m.split(",") for m in re.findall(r"geograph serve --method \{([a-z0-9_,]+)\}", text)]


def serving_methods(text: str) -> tuple[list[str], list[str]]:
    """The rerankers and retrievers of the serving page's ``--method is one of`` sentence."""
    text = " ".join(text.split())
    m = re.search(r"`--method` is one of .*?the rerankers (.*?) \(.*?the retrievers (.*?) \(", text)
    assert m, "docs/serving.md: no sentence '`--method` is one of ... the rerankers ... the retrievers ...'"
    return NAME.findall(m.group(1)), NAME.findall(m.group(2))


@pytest.mark.parametrize("rel", INSTALL_PAGES)
def test_the_python_version_is_requires_python(rel):
    found = python_versions(_text(rel))
    assert found, f"{rel} names no Python version"
    assert set(found) == {python_floor()}, f"{rel} names Python {found}; pyproject requires {python_floor()}+"


@pytest.mark.parametrize("rel", INSTALL_PAGES)
def test_the_extras_tables_name_every_extra(rel):
    tables = extras_tables(_text(rel))
    assert tables, f"{rel} has no table of extras (first column 'extra')"
    declared = set(PYPROJECT["optional-dependencies"])
    for found in tables:
        assert found == declared, (
            f"{rel}: extras table differs from pyproject.toml: "
            f"missing {sorted(declared - found)}, unknown {sorted(found - declared)}"
        )


def test_the_serve_method_choices_are_the_registered_methods():
    rerankers, retrievers = serving_methods(_text("docs/serving.md"))
    assert rerankers == list(registry.RERANKERS) and retrievers == list(registry.RETRIEVERS), (
        f"docs/serving.md lists rerankers {rerankers}, retrievers {retrievers}; "
        f"registered: {registry.RERANKERS}, {registry.RETRIEVERS}"
    )
    pages = ["README.md", *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").rglob("*.md")))]
    for rel in (p for p in pages if "_build" not in p):
        for choices in serve_method_lists(_text(rel)):
            assert choices == list(registry.names()), f"{rel}: serve --method {choices}, registered {registry.names()}"
    for rel in ("README.md", "docs/serving.md", "docs/getting-started.md"):
        for name in re.findall(r"geograph serve --method ([a-z0-9_]+)", _text(rel)):
            assert name in registry.names(), f"{rel}: geograph serve --method {name}: not a registered method"


# --- the readers, on small pages: each difference is found ------------------------------------


def test_the_readers_find_a_wrong_version_extra_and_method():
    assert python_versions("needs Python 3.10 or newer; Python 3.11 is tested") == ["3.10", "3.11"]
    page = "| extra | for |\n|---|---|\n| `text` | x |\n| `langchain`, `haystack` | y |\n\n| other |\n|---|\n| `z` |\n"
    assert extras_tables(page) == [{"text", "langchain", "haystack"}]
    assert serve_method_lists("`geograph serve --method {maniscope,iso} --corpus DIR`") == [["maniscope", "iso"]]
    sentence = "`--method` is one of the registered methods: the rerankers `a` and `b` (x) and\nthe retrievers `c` (y)."
    assert serving_methods(sentence) == (["a", "b"], ["c"])
