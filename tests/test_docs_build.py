"""The documentation site builds as ``make docs`` builds it (``sphinx-build -W -n``: warnings,
unresolved cross-references included, are errors), and the built HTML holds:

- internal links: every relative ``href`` / ``src`` points at a file of the build, and every
  ``#fragment`` at an id of the page it names;
- math without network: every page with math loads MathJax from the build itself (no http(s)
  script, the file exists), and no raw TeX is left where MathJax does not look: MathJax
  typesets only the ``math`` containers Sphinx writes (``span.math``, ``div.math``), so outside
  them (and outside code) no text may hold the delimiters ``\\(`` ``\\)`` ``\\[`` ``\\]`` ``$$``, a
  ``$...$`` pair around TeX (a backslash command, ``^``, ``_`` or ``{``), a command with an
  argument or index (``\\frac{``, ``\\sum_``) or a common TeX symbol (``\\alpha``, ``\\le``, ...);
- flags as typed: no en or em dash right before a letter (``--text-cache-size`` turned into
  ``–text-cache-size`` by smart quotes);
- the serving page's endpoints table: every route of the server (those of its OpenAPI document
  and those the document leaves out), its summary, and each request body's required fields.

The site is built once per test module (slow: about a minute and a half)."""

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
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


# --- the checks of the built HTML, each a function of a page's text ------------------------------

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
#: where text is not prose: MathJax skips these, and TeX there is code shown as code
CODE = {"script", "style", "pre", "code", "kbd", "samp", "textarea"}
TEX_SYMBOLS = (
    "alpha beta gamma delta epsilon varepsilon eta theta kappa lambda mu pi rho sigma tau phi omega Delta Sigma sum "
    "prod int frac sqrt cdot times le leq ge geq neq in infty log exp min max arg mathrm mathbf mathcal operatorname"
).split()
RAW_TEX = re.compile(
    r"\\[()\[\]]|\$\$|\$[^$\s][^$]*?[\\^_{][^$]*?\$|\\[A-Za-z]+\s*[{_^]|\\(?:" + "|".join(TEX_SYMBOLS) + r")\b"
)
DASHED_FLAG = re.compile(r"[\u2013\u2014](?=[A-Za-z])")


@dataclass
class Node:
    tag: str
    attrs: dict
    parent: "Node | None" = None
    children: list = field(default_factory=list)  # Nodes and strings

    @property
    def classes(self) -> list[str]:
        return (self.attrs.get("class") or "").split()

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def find(self, tag: str | None = None, cls: str | None = None):
        """The descendants with ``tag`` and class ``cls`` (either may be ``None``), in document order."""
        for c in self.children:
            if isinstance(c, Node):
                if (tag is None or c.tag == tag) and (cls is None or cls in c.classes):
                    yield c
                yield from c.find(tag, cls)


class _Tree(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = self.node = Node("#document", {})

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs), self.node)
        self.node.children.append(node)
        if tag not in VOID:
            self.node = node

    def handle_endtag(self, tag):
        n = self.node
        while n is not None and n.tag != tag:
            n = n.parent
        if n is not None and n.parent is not None:
            self.node = n.parent

    def handle_data(self, data):
        self.node.children.append(data)


def tree(html: str) -> Node:
    parser = _Tree()
    parser.feed(html)
    return parser.root


def prose(node: Node, *, skip_math: bool = True):
    """The text pieces of ``node`` outside code (and outside the math containers)."""
    for c in node.children:
        if isinstance(c, str):
            yield c
        elif c.tag not in CODE and not (skip_math and "math" in c.classes):
            yield from prose(c, skip_math=skip_math)


def raw_tex(html: str) -> list[str]:
    """TeX in the text of a page that MathJax does not typeset (see the module's docstring)."""
    found = []
    for piece in prose(tree(html)):
        found += [piece[max(0, m.start() - 30) : m.end() + 30] for m in RAW_TEX.finditer(piece)]
    return found


def dashed_flags(html: str) -> list[str]:
    """Text, code included, where an en or em dash stands right before a letter."""
    text = tree(html).text()
    return [text[max(0, m.start() - 30) : m.end() + 30] for m in DASHED_FLAG.finditer(text)]


def math_problems(site: Path) -> list[str]:
    """Pages whose math would not render offline: math without a MathJax script, a script from
    the network, or one whose file the build does not hold."""
    bad = []
    for page in sorted(site.rglob("*.html")):
        root = tree(page.read_text(encoding="utf-8"))
        has_math = next(root.find(cls="math"), None) is not None
        scripts = [s.attrs.get("src", "") for s in root.find("script")]
        renderers = [s for s in scripts if re.search(r"mathjax|katex", s, re.I)]
        name = page.relative_to(site)
        if has_math and not renderers:
            bad.append(f"{name}: math but no MathJax script")
        for src in renderers:
            url = urlsplit(src)
            if url.scheme or url.netloc:
                bad.append(f"{name}: {src} (from the network)")
            elif not (page.parent / unquote(url.path)).is_file():
                bad.append(f"{name}: {src} (no such file)")
    return bad


def endpoint_rows(html: str) -> list[dict[str, str]]:
    """The rows of the serving page's generated endpoints table, by column name."""
    box = next(tree(html).find(cls="geograph-serve-endpoints"), None)
    assert box is not None, "no endpoints table (the serve-endpoints directive)"
    table = next(box.find("table"))
    head = [" ".join(th.text().split()) for th in table.find("th")]
    rows = []
    for tr in table.find("tr"):
        cells = [" ".join(td.text().split()) for td in tr.find("td")]
        if cells:
            rows.append(dict(zip(head, cells)))
    return rows


def fields(cell: str) -> set[str]:
    return set() if cell.strip() == "-" else {f.strip() for f in cell.split(",")}


def test_the_checks_find_raw_tex_remote_math_and_dashed_flags(tmp_path):
    """Each check on small pages: what it must find, and what it must leave alone."""
    page = (
        '<p>ok <span class="math">\\(x_i \\le \\alpha\\)</span> and <code>$HOME_DIR</code> '
        "cost $5 and $6 or a\\nb</p><pre>\\frac{1}{2}</pre>"
    )
    assert raw_tex(page) == []
    for bad in ("\\(x\\)", "\\[x\\]", "$$x$$", "$x_i$", "\\frac{a}{b}", "\\sum_i", "a \\alpha b", "x \\le y"):
        assert raw_tex(f"<div><p>text {bad} text</p></div>"), bad
    assert set(raw_tex('<div class="math">\\[x\\]</div><p>\\(y\\)</p>')) == {"\\(y\\)"}
    assert dashed_flags("<p>a \u2013 b, <code>--text-cache-size</code></p>") == []
    assert dashed_flags("<p>server flags \u2013text-cache-size=256</p>")
    (tmp_path / "sub").mkdir()
    (tmp_path / "_static" / "mathjax").mkdir(parents=True)
    (tmp_path / "_static" / "mathjax" / "tex-svg.js").write_text("")
    (tmp_path / "ok.html").write_text('<script src="_static/mathjax/tex-svg.js"></script><span class="math">x</span>')
    (tmp_path / "sub" / "cdn.html").write_text(
        '<script src="https://cdn.jsdelivr.net/npm/mathjax@4/tex-mml-chtml.js"></script><span class="math">x</span>'
    )
    (tmp_path / "sub" / "missing.html").write_text('<script src="_static/mathjax/tex-svg.js"></script>')
    (tmp_path / "none.html").write_text('<div class="math">x</div>')
    assert math_problems(tmp_path) == [
        "none.html: math but no MathJax script",
        "sub/cdn.html: https://cdn.jsdelivr.net/npm/mathjax@4/tex-mml-chtml.js (from the network)",
        "sub/missing.html: _static/mathjax/tex-svg.js (no such file)",
    ]


def test_endpoint_rows_reads_the_generated_table():
    html = (
        '<div class="geograph-serve-endpoints"><table><thead><tr><th>route</th><th>required fields</th></tr>'
        "</thead><tbody><tr><td>POST <code>/x</code></td><td><code>a</code>, <code>b</code></td></tr></tbody>"
        "</table></div>"
    )
    assert endpoint_rows(html) == [{"route": "POST /x", "required fields": "a, b"}]
    assert fields("a, b") == {"a", "b"} and fields("-") == set()


# --- the site, built once -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    for module in ("sphinx", "myst_parser", "furo"):
        require(module, "the docs extra: pip install 'geograph-rag[docs]'")
    out = tmp_path_factory.mktemp("docs") / "html"
    path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)]))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-n", "-q", "docs", str(out)]
    return out, subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)


@pytest.mark.slow
def test_make_docs_builds_without_warnings(site):
    out, result = site
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


def _pages(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): p.read_text(encoding="utf-8") for p in sorted(out.rglob("*.html"))}


@pytest.mark.slow
def test_math_renders_without_network(site):
    out, result = site
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    pages = _pages(out)
    with_math = [name for name, html in pages.items() if 'class="math' in html]
    assert "methods/maniscope.html" in with_math and "api/functional.html" in with_math
    bad = math_problems(out)
    assert not bad, "math that needs the network:\n" + "\n".join(bad)
    raw = {name: found for name, html in pages.items() if (found := raw_tex(html))}
    assert not raw, f"raw TeX outside the math containers: {raw}"


#: Typesets each formula of stdin (JSON ``[[tex, display], ...]``) with the MathJax of the build
#: (its folder: argv[2]) in Node, as the page would, and prints the ones MathJax marks as errors.
#: ``test_typeset_finds_broken_formulas`` runs it on broken formulas.
TYPESET = r"""
const MJ = require(require("path").resolve(process.argv[2], "node-main.js"));
const formulas = JSON.parse(require("fs").readFileSync(0, "utf8"));
MJ.init({loader: {load: ["input/tex", "output/svg"]}}).then((M) => {
  const bad = [];
  for (const [tex, display] of formulas) {
    const html = M.startup.adaptor.outerHTML(M.tex2svg(tex, {display}));
    // a TeX error (merror), or an undefined command shown in red (the noundefined extension)
    if (!html.includes("<svg") || /data-mjx-error|merror|fill="red"/.test(html)) bad.push(tex);
  }
  console.log(JSON.stringify({typeset: formulas.length, bad}));
}).catch((e) => { console.error(e); process.exit(1); });
"""


def formulas(html: str) -> list[tuple[str, bool]]:
    """The TeX of each math container of a page (delimiters removed) and whether it is displayed."""
    out = []
    for node in tree(html).find(cls="math"):
        tex = "".join(c for c in node.children if isinstance(c, str)).strip()
        for left, right in ((r"\(", r"\)"), (r"\[", r"\]")):
            if tex.startswith(left) and tex.endswith(right):
                tex = tex[len(left) : -len(right)]
        out.append((tex.strip(), node.tag == "div"))
    return out


def typeset(mathjax: Path, found: list[tuple[str, bool]], tmp: Path) -> dict:
    """:data:`TYPESET` run by Node over ``found`` with the MathJax folder ``mathjax``:
    ``{"typeset": count, "bad": [tex, ...]}`` (skips the test where Node is missing)."""
    import json
    import shutil

    node = shutil.which("node")
    if node is None:
        pytest.skip("no node on this machine: the bundled MathJax is run in Node")
    script = tmp / "typeset.js"
    script.write_text(TYPESET)
    run = subprocess.run(
        [node, str(script), str(mathjax)], input=json.dumps(found), capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_typeset_finds_broken_formulas(tmp_path):
    """The MathJax the docs bundle (sphinx-mathjax-offline's copy), on a good formula, a TeX error
    and an undefined command."""
    import importlib.util

    require("sphinx", "the docs extra: pip install 'geograph-rag[docs]'")
    spec = importlib.util.find_spec("sphinx-mathjax-offline")
    if spec is None or spec.origin is None:
        pytest.fail("sphinx-mathjax-offline is missing: pip install 'geograph-rag[docs]'")
    mathjax = Path(spec.origin).parent / "static" / "mathjax"
    found = [(r"\sum_i \frac{x_i}{2}", True), (r"\frac{a}{", False), (r"a \notacommand x", False)]
    report = typeset(mathjax, found, tmp_path)
    assert report == {"typeset": 3, "bad": [r"\frac{a}{", r"a \notacommand x"]}


@pytest.mark.slow
def test_the_bundled_mathjax_typesets_every_formula(site, tmp_path):
    """The MathJax copied into the build (no network) turns every formula of the site into SVG
    without a TeX error (run in Node: the browser's work without the browser)."""
    out, result = site
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    found = [f for p in sorted(out.rglob("*.html")) for f in formulas(p.read_text(encoding="utf-8"))]
    assert len(found) >= 50, f"only {len(found)} formulas found on the site"
    report = typeset(out / "_static" / "mathjax", found, tmp_path)
    assert report["typeset"] == len(found) and not report["bad"], report["bad"][:10]


@pytest.mark.slow
def test_flags_keep_their_two_dashes(site):
    out, result = site
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    pages = _pages(out)
    assert "--text-cache-size" in pages["serving.html"] and "--max-candidates" in pages["serving.html"]
    bad = {name: found for name, html in pages.items() if (found := dashed_flags(html))}
    assert not bad, f"a dash turned into an en or em dash before a word: {bad}"


@pytest.mark.slow
def test_the_endpoints_table_has_every_route(site):
    """Every route of a reranker's server with an API key (the most routes), each body's required
    fields as its OpenAPI document says, and a real summary (not FastAPI's name of a function)."""
    require("litserve", "the serve extra: pip install 'geograph-rag[serve]'")
    import shutil

    from geograph.data import DEMO_PATH
    from geograph.serve.config import ServeConfig
    from geograph.serve.server import build_server

    out, result = site
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    server = build_server(ServeConfig(method="maniscope", corpus=str(DEMO_PATH), api_key="test"))
    shutil.rmtree(server.reload_directory, ignore_errors=True)
    spec = server.app.openapi()
    html = (out / "serving.html").read_text(encoding="utf-8")
    rows = endpoint_rows(html)
    routes = {r["route"].split()[-1]: r for r in rows}
    every = {r.path for r in server.app.router.routes}
    assert set(spec["paths"]) <= every and {"/metrics", "/admin/reload", "/docs"} <= every
    assert every <= set(routes), f"routes missing from the table: {sorted(every - set(routes))}"
    assert "Endpoint Handler" not in html
    for path, ops in spec["paths"].items():
        for verb, op in ops.items():
            mine = [r for r in rows if r["route"] == f"{verb.upper()} {path}"]
            assert mine and all(r["summary"] == op["summary"] for r in mine), (path, op.get("summary"), mine)
            schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if schema is None:
                continue
            refs = [s["$ref"] for s in schema.get("oneOf", schema.get("anyOf", [schema]))]
            for ref in refs:
                name = ref.rsplit("/", 1)[-1]
                body = spec["components"]["schemas"][name]
                row = next((r for r in mine if r["request body"] == name), None)
                assert row is not None, f"{verb.upper()} {path}: no row for the body {name}"
                assert fields(row["required fields"]) == set(body.get("required", ())), (path, name, row)
                listed = fields(row["required fields"]) | fields(row["optional fields"])
                assert listed == set(body.get("properties", {})), (path, name, row)
    assert all(r["summary"] and r["served by"] for r in rows), rows
