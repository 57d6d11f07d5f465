"""Write ``docs/methods/<name>.md`` for every registered method, from its registry entry.

A page is generated, never edited by hand: title and kind, the module and its functional twin,
the paper, ``about`` (what it does, its formula), an example, where it is served and benched,
and the parameters with their defaults (read from the constructor) and accepted values.

Usage: ``python -m geograph.commands.method_pages [DOCS_DIR]`` (default ``docs/methods``);
``--check`` exits 1 naming the pages that are missing or stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from geograph.registry import METHODS, MethodSpec


def page(spec: MethodSpec) -> str:
    """The Markdown page of ``spec``."""
    cls = f"{spec.module.__module__.rsplit('.', 1)[0]}.{spec.module.__name__}"
    twin = f", functional twin `{spec.functional.__module__}.{spec.functional.__name__}`" if spec.functional else ""
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
    lines += ["", "## Parameters", "", "| name | default | accepts | what it does |", "|---|---|---|---|"]
    defaults = spec.defaults()
    for p in spec.build_params + spec.params:
        d = list(defaults[p.name]) if isinstance(defaults[p.name], tuple) else defaults[p.name]
        build = " (corpus structure)" if p in spec.build_params else ""
        lines.append(f"| `{p.name}` | `{json.dumps(d)}` | {p.describe()} | {p.doc}{build} |")
    lines += ["", "<!-- generated from geograph/registry.py by python -m geograph.commands.method_pages -->", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    args = [a for a in args if a != "--check"]
    out = Path(args[0] if args else "docs/methods")
    stale = []
    for name, spec in METHODS.items():
        path, text = out / f"{name}.md", page(spec)
        if check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
            continue
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if stale:
        print(f"method pages missing or stale: {', '.join(stale)} (run python -m geograph.commands.method_pages)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
