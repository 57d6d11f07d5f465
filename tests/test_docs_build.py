"""The documentation site builds as ``make docs`` builds it (``sphinx-build -W -n``: warnings,
unresolved cross-references included, are errors), and its internal links hold: every relative
``href`` / ``src`` of the built HTML points at a file of the build, and every ``#fragment`` at an
id of the page it names."""

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from conftest import require

ROOT = Path(__file__).resolve().parents[1]


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if key == "id" and value:
                self.ids.add(value)
            if key in ("href", "src") and value and tag in ("a", "img", "link", "script"):
                self.links.append(value)


def _parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def broken_links(site: Path) -> list[str]:
    """Relative links of the HTML files under ``site`` whose file or fragment does not exist."""
    pages = {p: _parse(p) for p in site.rglob("*.html")}
    bad = []
    for page, parsed in pages.items():
        for link in parsed.links:
            url = urlsplit(link)
            if url.scheme or url.netloc or link.startswith(("mailto:", "javascript:", "data:")):
                continue  # external: not checked here (the build reaches no network)
            target = (page.parent / unquote(url.path)).resolve() if url.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                bad.append(f"{page.relative_to(site)}: {link} (no such file)")
            elif url.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(url.fragment) not in ids:
                    bad.append(f"{page.relative_to(site)}: {link} (no such anchor)")
    return bad


def test_broken_links_are_found(tmp_path):
    """The check itself, on a small site: a missing file and a missing anchor are reported."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "index.html").write_text(
        '<a href="sub/page.html#here">ok</a><a href="sub/page.html#gone">anchor</a>'
        '<a href="missing.html">file</a><a href="https://example.org/x">external</a><img src="sub/">'
    )
    (tmp_path / "sub" / "page.html").write_text('<h1 id="here">x</h1><a href="../index.html">up</a>')
    (tmp_path / "sub" / "index.html").write_text("")
    assert sorted(broken_links(tmp_path)) == [
        "index.html: missing.html (no such file)",
        "index.html: sub/page.html#gone (no such anchor)",
    ]


@pytest.mark.slow
def test_make_docs_builds_without_warnings(tmp_path):
    for module in ("sphinx", "myst_parser", "furo"):
        require(module, "the docs extra: pip install 'geograph-rag[docs]'")
    out = tmp_path / "html"
    path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)]))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-n", "-q", "docs", str(out)]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    log = result.stdout + result.stderr
    assert result.returncode == 0 and "WARNING" not in log, log[-6000:]
    assert (out / "index.html").is_file() and (out / "api" / "functional.html").is_file()
    bad = broken_links(out)
    assert not bad, "broken internal links:\n" + "\n".join(bad)
    # generated from the code and the benchmark files, not written by hand
    serving = (out / "serving.html").read_text(encoding="utf-8")
    assert "--max-batch-texts" in serving and "/v2/rerank" in serving
    bench = (out / "benchmarks.html").read_text(encoding="utf-8")
    assert re.search(r"Ricci-Filtration -&gt; Maniscope|Ricci-Filtration -> Maniscope", bench)
