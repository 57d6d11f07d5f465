"""``python -m geograph.bench <name> [options]`` (also ``geograph bench``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

BENCHES = {
    "maniscope": "geograph.bench.maniscope",
    "ricci": "geograph.bench.ricci",
    "iso": "geograph.bench.iso",
    "g3": "geograph.bench.g3",
    "run": "geograph.bench.run",
    "gpu": "geograph.bench.gpu",
    "scale": "geograph.bench.scale",
    "serve": "geograph.bench.serve",
    "update": "geograph.bench.update",
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in BENCHES:
        from geograph.console import UsageError

        what = f"unknown benchmark {argv[0]!r}" if argv else "name a benchmark"
        return UsageError(f"{what}: {', '.join(BENCHES)} (see 'geograph bench --help')").exit("geograph bench")
    import importlib

    return importlib.import_module(BENCHES[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
