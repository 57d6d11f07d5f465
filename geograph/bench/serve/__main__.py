"""``python -m geograph.bench.serve``: the same as ``geograph bench serve``."""

import sys

from geograph.bench.serve.cli import main

if __name__ == "__main__":
    sys.exit(main())
