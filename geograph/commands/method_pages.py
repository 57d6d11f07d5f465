"""Write ``docs/methods/<name>.md`` for every registered method that has no page yet.

The first page of a method is made from its registry entry: title and kind, the module and its
functional twin, the paper, ``about`` (what it does, its formula), an example, where it is served
and benched, and its parameter table as the site's ``{method-params}`` directive, which the
documentation build fills from the registry (defaults read from the constructor, accepted
values), so the table never goes stale. A page that exists is never overwritten: it can be
extended by hand (results, parity figures, when the method helps).

Usage: ``python -m geograph.commands.method_pages [DOCS_DIR]`` (default ``docs/methods``);
``--check`` exits 1 naming the pages that are missing or lack the parameter directive.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from geograph.registry import METHODS, MethodSpec


def page(spec: MethodSpec) -> str:
    """The Markdown page of ``spec``."""
    cls = f"geograph.{spec.kind}s.{spec.module.__name__}"  # every registered module is exported there
    twin = ""
    if spec.functional is not None:
        home = "geograph.functional" if spec.functional in spec.exports else spec.functional.__module__
        twin = f", functional twin `{home}.{spec.functional.__name__}`"
    lines = [f"# {spec.label} (`{spec.name}`)", "", f"A {spec.kind}: `{cls}`{twin}.", ""]
    lines.append(f"Paper: {spec.paper}." if spec.paper else "Paper: none (a baseline).")
    if spec.about:
        lines += ["", spec.about]
    if spec.example:
        lines += ["", "```python", "import geograph", "", spec.example, "```"]
    routes = "`/retrieve`, `/rerank`, `/v1/rerank`, `/v2/rerank`" if spec.is_reranker else "`/retrieve`"
    lines += ["", f"Served by `geograph serve --method {spec.name}` ({routes})."]
    if spec.reference:
        lines.append(f"Benchmarked against {spec.reference_name} (`{spec.reference}`).")
    lines += ["", "## Parameters", "", directive(spec.name), ""]
    return "\n".join(lines)


def directive(name: str) -> str:
    """The site directive that writes ``name``'s parameter table from the registry."""
    return f"```{{method-params}} {name}\n```"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m geograph.commands.method_pages",
        description="Write docs/methods/<name>.md for every registered method that has no page yet "
        "(an existing page is never overwritten).",
    )
    parser.add_argument("docs_dir", nargs="?", default="docs/methods", help="where the pages go (docs/methods)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 naming the missing pages or those without their table",
    )
    args = parser.parse_args(argv)
    check = bool(args.check)
    out = Path(args.docs_dir)
    stale = []
    for name, spec in METHODS.items():
        path = out / f"{name}.md"
        if check:
            if not path.is_file() or directive(name) not in path.read_text():
                stale.append(str(path))
            continue
        if not path.is_file():
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(page(spec))
    if stale:
        print(
            f"method pages missing or without their parameter table: {', '.join(stale)} "
            "(run python -m geograph.commands.method_pages)"
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
