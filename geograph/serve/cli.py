"""The ``geograph serve`` command: parse the configuration, serve, exit with a status.

After a clean stop the command leaves with ``os._exit``: every process it started is gone by
then, and the interpreter's native teardown (torch and tokenizer thread pools) otherwise adds
about six seconds before a process manager sees the exit.

Configuration and startup errors print one line (``geograph serve: <key>: <problem>``) to
stderr and exit with status 2 (configuration) or 1 (startup), without a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``geograph serve`` with ``argv``; the exit status."""
    try:
        from geograph.serve.config import ConfigError, load_config
    except ImportError:  # pragma: no cover - exercised only without the serve extra
        print("geograph serve: needs the serve extra: pip install 'geograph-rag[serve]'", file=sys.stderr)
        return 1
    from geograph.serve.server import StartupError, run

    try:
        cfg = load_config(argv)
    except ConfigError as e:
        print(f"geograph serve: {e}", file=sys.stderr)
        return 2
    try:
        code = run(cfg)
    except StartupError as e:
        print(f"geograph serve: {e}", file=sys.stderr)
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
