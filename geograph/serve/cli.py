"""The ``geograph serve`` command: parse the configuration, serve, exit with a status.

Its flags are generated from :class:`~geograph.serve.config.ServeConfig` when the command is
first parsed (:func:`~geograph.serve.config.add_arguments`), so that the other commands import
neither pydantic nor the server, and without the serve extra the command says which extra it
needs.

After a clean stop the command leaves with ``os._exit``: every process it started is gone by
then, and the interpreter's native teardown (torch and tokenizer thread pools) otherwise adds
about six seconds before a process manager sees the exit.

Configuration and startup errors print one line (``geograph serve: <key>: <problem>``) to
stderr and exit with status 2 (configuration) or 1 (startup), without a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from geograph.console import make_parser

PROG = "geograph serve"
SUMMARY = "HTTP rerank / retrieve server on LitServe (--method, --corpus; settings also from GEOGRAPH_* variables)"
DESCRIPTION = """\
An HTTP reranking and retrieval server on LitServe with dynamic batching, for one method over
one corpus: a BEIR-format folder (corpus.jsonl) or a shipped corpus by name (--corpus demo),
embedded once through the on-disk cache.

  geograph serve --method maniscope --corpus demo
  geograph serve --config serve --param alpha=0.5      (serve: the shipped serve.yaml)

Endpoints: POST /retrieve (every method); POST /rerank, /v2/rerank (Cohere v2) and /v1/rerank
(Cohere v1, Jina) for the rerankers; GET /health, /metrics, /info, /docs; POST /admin/reload
with an API key. SIGTERM or SIGINT stops every process the server started (status 0)."""


def _arguments(p: argparse.ArgumentParser) -> None:
    try:
        from geograph.serve.config import add_arguments
    except ImportError:  # pragma: no cover - exercised only without the serve extra
        p.exit(1, f"{PROG}: needs the serve extra: pip install 'geograph-rag[serve]'\n")
    add_arguments(p)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``serve`` to the ``geograph`` command's subcommands (its flags added when first parsed)."""
    p = commands.add_parser("serve", help=SUMMARY, description=DESCRIPTION, arguments=_arguments)
    p.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``geograph serve`` with ``argv`` (the arguments after ``serve``); the exit status."""
    return run(make_parser(PROG, DESCRIPTION, arguments=_arguments).parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Serve the configuration of the parsed flags, the ``GEOGRAPH_*`` variables and the config
    file; the exit status (a clean stop leaves through ``os._exit``)."""
    from geograph.serve.config import ConfigError, config_from_args
    from geograph.serve.server import StartupError
    from geograph.serve.server import run as serve

    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    try:
        code = serve(cfg)
    except StartupError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
