"""A method is one folder or one installed plugin: nothing else in the package names it.

Each test builds a method the way ``docs/guide/adding-a-method.md`` says (a copied built-in folder
under another name, or a small distribution with a ``geograph.methods`` entry point) and then, in a
fresh interpreter, ranks with it, finds it in ``geograph serve --help``, in the benchmark's method
list, in the method pages the generator writes and (with a bench command) in ``geograph bench
--help``. Broken plugins are skipped with one warning line each naming their distribution.
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import geograph

pytestmark = [pytest.mark.slow, pytest.mark.integration]

PACKAGE = Path(geograph.__file__).parent

# The consumers, in one interpreter: Ranker on embeddings (no encoder), the server's --help,
# the bench's rows, the page generator, the exports and `geograph bench --help` (a method that
# declares a bench command is listed and runs it). Prints one line per check.
CHECKS = """
import contextlib, io, sys
import torch
import geograph
from geograph import Ranker
from geograph.cli import main as cli
import geograph.rerankers, geograph.retrievers
from geograph.bench.run.methods import METHODS as BENCH
from geograph.commands import method_pages

name, pages = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
docs = torch.nn.functional.normalize(torch.randn(6, 8), dim=-1)
ranked = Ranker(name).rank(docs[0] + 0.1, docs, top_k=3)
print("ranked", len(ranked), all(0.0 <= r.relevance <= 1.0 for r in ranked))
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
    cli(["serve", "--help"])
print("serve-help", name in out.getvalue().split("--method")[1].split("}")[0])
print("bench", name in BENCH)
assert method_pages.main([pages]) == 0
print("page", name in open(f"{pages}/{name}.md").read())
print("methods", ",".join(geograph.registry.names()))
spec = geograph.registry.get(name)
cls, twin = spec.module.__name__, spec.functional.__name__
kinds = getattr(geograph, spec.kind + "s")
exported = getattr(geograph, cls) is getattr(kinds, cls) is spec.module
print("exports", exported, getattr(geograph.functional, twin) is spec.functional)
out = io.StringIO()
with contextlib.redirect_stdout(out):
    cli(["bench", "--help"])
listed = [line.split()[0] for line in out.getvalue().splitlines() if line[:4] == "    " and line[4:5].isalpha()]
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    status = cli(["bench", name, "--help"])
print("bench-command", name in listed, status)
"""

EXPECTED = ["ranked 3 True", "serve-help True", "bench True", "page True"]


def run_checks(name: str, tmp: Path, pythonpath: list[Path]) -> tuple[list[str], str]:
    """Run :data:`CHECKS` for method ``name`` with ``pythonpath`` first; (stdout lines, stderr)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath)}
    proc = subprocess.run(
        [sys.executable, "-c", CHECKS, name, str(tmp / "pages")],
        env=env,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines(), proc.stderr


def test_a_copied_folder_is_a_new_method(tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(PACKAGE, tree / "geograph", ignore=shutil.ignore_patterns("__pycache__"))
    methods = tree / "geograph" / "methods"
    shutil.copytree(methods / "maniscope", methods / "geodesic")
    spec = methods / "geodesic" / "spec.py"
    text = spec.read_text()
    assert 'name="maniscope"' in text and 'label="Maniscope"' in text
    spec.write_text(
        text.replace('name="maniscope"', 'name="geodesic"').replace('label="Maniscope"', 'label="Geodesic"')
    )

    lines, _ = run_checks("geodesic", tmp_path, [tree])
    assert lines[:4] == EXPECTED
    assert set(lines[4].split(" ")[1].split(",")) == {"geodesic", "maniscope", "ricci", "iso", "g3", "dense"}
    assert lines[6] == "bench-command True 0"  # the copied folder's command.py, named by its spec
    page = (tmp_path / "pages" / "geodesic.md").read_text()
    assert page.startswith("# Geodesic (`geodesic`)") and "{method-params} geodesic" in page


def write_plugin(root: Path, dist: str, module: str, body: str, entry: str) -> Path:
    """A distribution ``dist`` with one module and one ``geograph.methods`` entry point."""
    src = root / dist
    (src / module).mkdir(parents=True)
    (src / module / "__init__.py").write_text(textwrap.dedent(body))
    (src / "pyproject.toml").write_text(
        textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{dist}"
        version = "0.1"

        [project.entry-points."geograph.methods"]
        {entry}

        [tool.setuptools]
        packages = ["{module}"]
        """)
    )
    return src


# a plugin reusing a built-in Module under a new name (the registry is read while it loads)
GOOD = """
from dataclasses import replace

from geograph.registry import get
from geograph.rerankers import Maniscope

SPEC = replace(get("maniscope"), name="wide_maniscope", label="Wide Maniscope", module=Maniscope, order=99)
"""


def install(sources: list[Path], target: Path) -> None:
    """``pip install --no-deps --no-build-isolation --target`` every source (as a user would)."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target)]
    proc = subprocess.run([*cmd, *map(str, sources)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_an_installed_plugin_is_a_method_and_broken_ones_warn_once(tmp_path):
    good = write_plugin(tmp_path / "src", "geo-wide", "geo_wide", GOOD, 'wide = "geo_wide:SPEC"')
    broken = [
        write_plugin(
            tmp_path / "src", "geo-missing", "geo_missing", "import no_such_module\n", 'm = "geo_missing:SPEC"'
        ),
        write_plugin(tmp_path / "src", "geo-wrong", "geo_wrong", "SPEC = 42\n", 'w = "geo_wrong:SPEC"'),
        write_plugin(
            tmp_path / "src",
            "geo-taken",
            "geo_taken",
            "from geograph.methods.ricci.spec import SPEC\n",
            'ricci_again = "geo_taken:SPEC"',
        ),
    ]
    target = tmp_path / "site"
    install([good, *broken], target)

    lines, stderr = run_checks("wide_maniscope", tmp_path, [PACKAGE.parent, target])
    assert lines[:4] == EXPECTED
    assert lines[4] == "methods maniscope,ricci,iso,g3,dense,wide_maniscope"
    assert lines[5] == "exports True True"
    assert lines[6] == "bench-command True 0"  # Maniscope's command, relative to the module's package
    warnings = [line for line in stderr.splitlines() if "method plugin" in line]
    assert len(warnings) == 3, stderr
    reasons = {"geo-missing": "ModuleNotFoundError", "geo-wrong": "names a int", "geo-taken": "'ricci' is taken"}
    for dist, reason in reasons.items():
        (line,) = [w for w in warnings if f"distribution {dist}:" in w]
        assert reason in line
    page = (tmp_path / "pages" / "wide_maniscope.md").read_text()
    assert "`geograph.rerankers.Maniscope`" in page and "`geograph.functional.maniscope_scores`" in page


GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide" / "adding-a-method.md"
FILE_BLOCK = re.compile(r"<!-- snippet: file (\S+) [^>]*-->\n```python\n(.*?)```", re.S)


def test_the_guides_example_is_one_folder_and_one_test_file(tmp_path):
    """The walkthrough's files, written where it says into a copy of the package, make a method."""
    files = dict(FILE_BLOCK.findall(GUIDE.read_text()))
    folder = {f"geograph/methods/centroid/{f}.py" for f in ("__init__", "functional", "module", "spec")}
    assert set(files) == folder | {"tests/test_centroid.py"}  # one folder and one test file
    tree = tmp_path / "tree"
    shutil.copytree(PACKAGE, tree / "geograph", ignore=shutil.ignore_patterns("__pycache__"))
    for rel, code in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(code)

    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--doctest-modules"]
    proc = subprocess.run(
        [*cmd, "geograph/methods/centroid", "tests/test_centroid.py"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines, _ = run_checks("centroid", tmp_path, [tree])
    assert lines[:4] == EXPECTED
    assert lines[4] == "methods maniscope,ricci,iso,g3,dense,centroid"
    assert lines[5] == "exports True True"  # geograph.CentroidReranker, geograph.functional.centroid_scores
    assert lines[6] == "bench-command False 2"  # it declares no benchmark of its own
    page = (tmp_path / "pages" / "centroid.md").read_text()
    assert "`geograph.rerankers.CentroidReranker`" in page and "`geograph.functional.centroid_scores`" in page
