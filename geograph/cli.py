"""The ``geograph`` command: one :mod:`argparse` parser with a subcommand per command module.

Each command module adds its subcommand, arguments and handler (``register(commands)``, the
handler set with ``set_defaults(func=...)``): :mod:`geograph.commands.demo`,
:mod:`geograph.bench.__main__` (``geograph bench <name>``, each benchmark parsing its own
options), :mod:`geograph.commands.build_graph`, :mod:`geograph.commands.update`,
:mod:`geograph.commands.embed` and :mod:`geograph.serve.cli` (whose flags, generated from its
configuration model, are added only when ``serve`` is parsed). Importing this module imports no
command; a command imports what it runs only when it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from geograph.console import UsageError, make_parser, plain_text  # noqa: F401  (re-exported for callers of geograph.cli)

DESCRIPTION = """\
geograph: rerank and retrieve passages for RAG by the geometry of their embedding graphs.
The demo corpus ships with the package: 'geograph demo', 'geograph serve --corpus demo'."""


def build_parser() -> argparse.ArgumentParser:
    """The ``geograph`` parser: ``--version`` and a subcommand per command module."""
    from geograph._version import DISTRIBUTION, version
    from geograph.bench import __main__ as bench
    from geograph.commands import build_graph, demo, embed, update
    from geograph.serve import cli as serve

    parser = make_parser(
        "geograph", DESCRIPTION, epilog="run 'geograph <command> --help' for the options of a command."
    )
    parser.add_argument("-V", "--version", action="version", version=f"geograph {version()} ({DISTRIBUTION})")
    commands = parser.add_subparsers(title="commands", metavar="<command>", dest="command", required=True)
    for module in (demo, bench, build_graph, update, embed, serve):
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``geograph`` with ``argv`` (default: the process's arguments); the exit status.

    ``--help``, ``--version`` and mistakes in the arguments end in an exit status as well
    (0 and 2), so that a caller gets a status in every case.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv:
        parser.print_help()
        return 2
    try:
        args = parser.parse_args(argv)
        return int(args.func(args))
    except SystemExit as e:
        return _status(e)
    except ImportError as e:
        from geograph.data.backends import OnnxUnavailable

        if not isinstance(e, OnnxUnavailable):
            raise
        # --encoder-backend onnx without the extra: one line, as a mistake in the arguments (the
        # command is argv[0]: geograph's own options all exit while parsing)
        print(f"geograph {argv[0]}: error: --encoder-backend: {e}", file=sys.stderr)
        return 2


def _status(e: SystemExit) -> int:
    """The exit status ``sys.exit`` would give (a message instead of a number: printed, status 1)."""
    if e.code is None or isinstance(e.code, int):
        return e.code or 0
    print(e.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
