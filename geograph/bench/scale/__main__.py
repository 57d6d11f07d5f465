"""``python -m geograph.bench.scale``: the same as ``geograph bench scale``."""

from geograph.bench.scale.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
