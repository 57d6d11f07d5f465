"""Every name the documentation cites resolves: dotted ``geograph.*`` names and Sphinx roles
(``:class:``, ``:func:``, ``:meth:``, ...) in every docstring of ``geograph/`` and ``train/``, and
dotted ``geograph.*`` names in ``README.md`` and ``docs/**/*.md``.

A name resolves when importing its longest module prefix and ``getattr`` on the rest succeeds;
the last part may also be an instance attribute of a class (a dataclass field, an annotation,
``self.name = ...`` or a registered buffer). Docstrings are read from the source with ``ast``
(no module is imported to find them); a role with an unqualified target (``:func:`tiled_topk```)
resolves in the namespace of the docstring's module, its enclosing classes, or ``geograph`` /
``geograph.functional``. Not checked: roles on names outside geograph and train (``torch.*``,
the standard library) and on classes a module defines inside a function or a block, cited by
their bare name (the LitServe classes of ``geograph.serve._litserve``, defined where LitServe is installed).
"""

import ast
import importlib
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("geograph", "train")

DOTTED = re.compile(r"(?<![\w./-])(geograph(?:\.[A-Za-z_]\w*)+)")
ROLE = re.compile(r":(?:class|func|meth|attr|mod|exc|data|obj):`~?\.?([A-Za-z_][\w.]*)(?:\(\))?`")


def _has_attribute(owner, attr: str) -> bool:
    """``attr`` of ``owner``, also an instance attribute of a class: a dataclass field, an annotated
    attribute, or one its code assigns (``self.attr = ...``, ``register_buffer("attr", ...)``)."""
    if hasattr(owner, attr):
        return True
    if not inspect.isclass(owner):
        return False
    if attr in getattr(owner, "__dataclass_fields__", {}):
        return True
    for cls in owner.__mro__:
        if attr in getattr(cls, "__annotations__", {}):
            return True
    try:
        source = inspect.getsource(owner)
    except (OSError, TypeError):
        return False
    return re.search(rf"self\.{attr}\s*(:[^=]+)?=|register_buffer\(\s*[\"']{attr}[\"']", source) is not None


def resolve(name: str):
    """The object ``name`` (dotted, absolute) names; raises if it does not resolve."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                continue  # not a module: try a shorter prefix
            raise  # the module exists but needs something missing
        for i, attr in enumerate(parts[cut:], cut):
            if i == len(parts) - 1 and not hasattr(obj, attr) and _has_attribute(obj, attr):
                return None  # an instance attribute
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(name)


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _docstrings(tree: ast.Module):
    """(docstring, enclosing class names) for the module, every class and every function."""

    def walk(node, classes):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(child, clean=False)
                inner = classes + [child.name] if isinstance(child, ast.ClassDef) else classes
                if doc:
                    yield doc, inner
                yield from walk(child, inner)
            else:
                yield from walk(child, classes)

    doc = ast.get_docstring(tree, clean=False)
    if doc:
        yield doc, []
    yield from walk(tree, [])


def cited_names():
    """(where, name, candidates): each citation and the absolute names it may mean."""
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = _module_name(path)
            tree = ast.parse(path.read_text(encoding="utf-8"))
            local = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
            lazy = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
            for doc, classes in _docstrings(tree):
                where = f"{path.relative_to(ROOT)} ({'.'.join(classes) or 'module'})"
                for name in DOTTED.findall(doc):
                    out.append((where, name, (name,)))
                for target in ROLE.findall(doc):
                    head = target.split(".")[0]
                    if head in PACKAGES:
                        out.append((where, target, (target,)))
                        continue
                    if head not in local and "." in target and importlib.util.find_spec(head) is not None:
                        continue  # a name outside geograph (torch, the standard library): not checked
                    if head in lazy and head not in local:
                        continue  # a class the module defines inside a function, on first use
                    scopes = [f"{module}.{'.'.join(classes[:i])}".rstrip(".") for i in range(len(classes), -1, -1)]
                    scopes += ["geograph", "geograph.functional"]
                    out.append((where, target, tuple(f"{s}.{target}" for s in scopes)))
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for path in docs:
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in DOTTED.findall(line):
                out.append((f"{path.relative_to(ROOT)}:{lineno}", name, (name,)))
    return out


def _missing_extra(exc: BaseException | None) -> bool:
    """Whether an import failed because an optional package (not geograph) is not installed."""
    while exc is not None:
        if isinstance(exc, ModuleNotFoundError) and exc.name and exc.name.split(".")[0] != "geograph":
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def unresolved(citations):
    """The citations none of whose candidates resolves (a name behind a missing extra is not checked here)."""
    bad = []
    for where, name, candidates in citations:
        for candidate in candidates:
            try:
                resolve(candidate)
                break
            except ImportError as e:
                if _missing_extra(e):
                    break
            except AttributeError:
                pass
        else:
            bad.append(f"{where}: {name}")
    return bad


CITATIONS = cited_names()


def test_the_scan_finds_the_citations():
    names = {name for _, name, _ in CITATIONS}
    assert len(CITATIONS) > 200
    assert {"geograph.functional.emd", "geograph.functional.transport_bounds", "geograph.BM25Retriever"} <= names


# the developer guide's walkthrough adds an example method: its names exist only once its folder is
# written (tests/test_method_folders.py writes it and resolves them there)
EXAMPLE_METHOD = (
    "geograph.methods.centroid",
    "geograph.functional.centroid_scores",
    "geograph.rerankers.CentroidReranker",
    "geograph.CentroidReranker",
)


def test_every_cited_name_resolves():
    bad = unresolved([c for c in CITATIONS if not c[1].startswith(EXAMPLE_METHOD)])
    assert not bad, "names the documentation cites that do not resolve:\n" + "\n".join(sorted(set(bad)))


def test_a_missing_export_is_caught(monkeypatch):
    """The check itself: a name removed from ``geograph.functional`` is reported."""
    import geograph.functional

    monkeypatch.delattr(geograph.functional, "emd")
    bad = unresolved([c for c in CITATIONS if c[1] == "geograph.functional.emd"])
    assert bad and all(b.endswith("geograph.functional.emd") for b in bad)


@pytest.mark.parametrize(
    "name",
    [
        "geograph.BM25Retriever",
        "geograph.retrievers.BM25Retriever",
        "geograph.functional.emd",
        "geograph.functional.transport_bounds",
        "geograph.functional.clean_edge_index",
        "geograph.functional.tiled_topk",
    ],
)
def test_exports(name):
    resolve(name)


@pytest.mark.integration
def test_import_geograph_does_not_import_optional_packages():
    """BM25Retriever is exported eagerly: its module imports bm25s only when one is built."""
    import subprocess
    import sys

    code = (
        "import sys, geograph; bad = [m for m in ('bm25s', 'ray', 'litserve', 'lightning') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
