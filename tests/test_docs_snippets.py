"""Every Python block of ``README.md`` and ``docs/**/*.md`` runs.

The blocks of one page run in order in one namespace, as a reader would type them at a Python
prompt, in a temporary working directory. A block of ``>>>`` lines is a doctest: the outputs it
shows are checked (``ELLIPSIS``, ``NORMALIZE_WHITESPACE``). A block preceded by an HTML comment
``<!-- snippet: cluster -->``, ``<!-- snippet: gpu -->`` or ``<!-- snippet: network -->`` needs
what the suite does not have (a Ray cluster, a GPU, a running server or the network) and is only
compiled; so is a block marked ``<!-- snippet: file ... -->``, the content of a file of a new
method (the developer guide's walkthrough), which imports modules that do not exist here.
``<!-- snippet: slow -->`` marks a page whose blocks take more than a few seconds (a
page that loads the text encoder is slow too).
"""

from __future__ import annotations

import doctest
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import MISSING

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)[^\n]*$")
MARKER = re.compile(r"^<!--\s*snippet:\s*([\w-]+)\b[^>]*-->$")
COMPILE_ONLY = {"cluster", "gpu", "network", "file"}
MARKERS = COMPILE_ONLY | {"slow"}
PYTHON = {"python", "py", "pycon"}


@dataclass(frozen=True)
class Block:
    path: str
    line: int
    code: str
    marker: str | None

    @property
    def doctest(self) -> bool:
        return self.code.lstrip().startswith(">>>")


def blocks(text: str, path: str = "<text>") -> list[Block]:
    """The Python blocks of a Markdown text, each with the marker comment right above it."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i].strip())
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        if lang not in PYTHON:
            continue
        above = next((line.strip() for line in reversed(lines[:start]) if line.strip()), "")
        marker = MARKER.match(above)
        if marker and marker.group(1) not in MARKERS:
            raise ValueError(f"{path}:{start}: unknown snippet marker {marker.group(1)!r} (known: {sorted(MARKERS)})")
        out.append(Block(path, start + 1, "\n".join(body) + "\n", marker.group(1) if marker else None))
    return out


def run_page(page: list[Block]) -> None:
    """Compile every block, run the runnable ones in order in one namespace; raise on the first failure."""
    namespace: dict = {"__name__": "__docs__"}
    for b in page:
        source = b.code
        if b.doctest:
            source = "".join(e.source for e in doctest.DocTestParser().get_examples(b.code))
        compile(source, f"{b.path}:{b.line}", "exec")
        if b.marker in COMPILE_ONLY:
            continue
        if b.doctest:
            test = doctest.DocTestParser().get_doctest(b.code, namespace, f"{b.path}:{b.line}", b.path, b.line)
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
            report: list[str] = []
            runner.run(test, out=report.append, clear_globs=False)
            assert runner.failures == 0, f"{b.path}:{b.line}: doctest output differs\n" + "".join(report)
        else:
            try:
                exec(compile(b.code, f"{b.path}:{b.line}", "exec"), namespace)
            except ImportError as e:
                if "pip install 'geograph-rag[" not in str(e):  # not a missing extra: a broken import
                    raise AssertionError(f"{b.path}:{b.line}: the block raised {type(e).__name__}: {e}") from e
                pytest.skip(f"{MISSING} an extra for {b.path}:{b.line}: {e}")  # fails under CI=true
            except Exception as e:
                raise AssertionError(f"{b.path}:{b.line}: the block raised {type(e).__name__}: {e}") from e


def pages() -> dict[str, list[Block]]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    files = [f for f in files if "_build" not in f.parts and f.parent.name != "bench"]
    found = {}
    for f in files:
        rel = str(f.relative_to(ROOT))
        page = blocks(f.read_text(encoding="utf-8"), rel)
        if page:
            found[rel] = page
    return found


PAGES = pages()


def _params():
    for rel, page in PAGES.items():
        slow = any(b.marker == "slow" for b in page) or any("Encoder(" in b.code for b in page)
        yield pytest.param(rel, marks=[pytest.mark.slow] if slow else [], id=rel)


@pytest.mark.parametrize("rel", list(_params()))
def test_page_snippets_run(rel, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HAYSTACK_TELEMETRY_ENABLED", "False")
    run_page(PAGES[rel])


def test_the_scan_finds_the_snippets():
    assert "README.md" in PAGES
    assert {"docs/getting-started.md", "docs/methods/maniscope.md", "docs/integrations.md"} <= set(PAGES)
    assert sum(len(p) for p in PAGES.values()) >= 15
    assert any(b.marker in COMPILE_ONLY for p in PAGES.values() for b in p)
    assert any(b.doctest for p in PAGES.values() for b in p)


PAGE = """
Text.

```python
x = 1 + 1
```

<!-- snippet: cluster -->
```python
import ray_that_does_not_exist
```

```python
>>> x * 2
4
```
"""


def test_blocks_markers_and_doctests():
    found = blocks(PAGE)
    assert [b.marker for b in found] == [None, "cluster", None]
    assert [b.doctest for b in found] == [False, False, True]
    run_page(found)  # the cluster block is only compiled


@pytest.mark.parametrize(
    "bad, message",
    [
        ("```python\nx = 1 +\n```\n", "invalid syntax"),
        ("```python\nraise RuntimeError('boom')\n```\n", "boom"),
        ("```python\n>>> 1 + 1\n3\n```\n", "doctest output differs"),
        ("<!-- snippet: network -->\n```python\nx = (\n```\n", "never closed"),
    ],
)
def test_a_broken_snippet_fails(bad, message):
    with pytest.raises((AssertionError, SyntaxError), match=re.escape(message) if " " in message else message):
        run_page(blocks(bad))


def test_unknown_marker_is_an_error():
    with pytest.raises(ValueError, match="unknown snippet marker"):
        blocks("<!-- snippet: sometimes -->\n```python\npass\n```\n")
