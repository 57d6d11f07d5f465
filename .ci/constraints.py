"""Write pip constraints from pyproject.toml's dependencies.

``python .ci/constraints.py tested [PYTHON]``: ``constraints.txt``, every package named in pyproject.toml
(the core and every extra) at the version installed in PYTHON's environment (default: this one), i.e.
the versions tested together.

``python .ci/constraints.py min OUT``: OUT gets the core's floors as ``==`` pins (torch left out: make pins
it), the lowest allowed versions that ``make test-min`` installs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements() -> tuple[list[str], list[str]]:
    """(core requirements, every extra's requirements), as written in pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [r for reqs in project["optional-dependencies"].values() for r in reqs]
    return project["dependencies"], extras


def floors(core: list[str]) -> list[str]:
    out = []
    for req in core:
        name = NAME.match(req).group(1)
        floor = re.search(r">=\s*([0-9][^,;\s]*)", req)
        if floor is None:
            raise SystemExit(f"pyproject.toml: core dependency {req!r} has no >= floor")
        if normalise(name) != "torch":
            out.append(f"{name}=={floor.group(1)}")
    return out


def tested(python: str, core: list[str], extras: list[str]) -> list[str]:
    script = (
        "import importlib.metadata as m, json; "
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    )
    installed = {normalise(k): v for k, v in json.loads(subprocess.check_output([python, "-c", script])).items()}
    names = sorted({normalise(NAME.match(r).group(1)) for r in core + extras})
    # a package not installed there is left unpinned (a comment says so)
    return [f"{n}=={installed[n].split('+')[0]}" if n in installed else f"# {n}: not installed" for n in names]


def main(argv: list[str]) -> int:
    core, extras = requirements()
    if argv[:1] == ["min"] and len(argv) == 2:
        Path(argv[1]).write_text("\n".join(floors(core)) + "\n")
        return 0
    if argv[:1] == ["tested"] and len(argv) <= 2:
        head = "# The versions tested together (python .ci/constraints.py tested); make installs with -c.\n"
        pins = tested(argv[1] if len(argv) == 2 else sys.executable, core, extras)
        (ROOT / "constraints.txt").write_text(head + "\n".join(pins) + "\n")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
