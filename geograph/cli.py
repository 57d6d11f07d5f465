"""The ``geograph`` command: ``geograph demo``, ``geograph bench <name>``, ``geograph build-graph``, ``geograph serve``."""
from __future__ import annotations

import sys
from typing import Optional, Sequence

USAGE = """usage: geograph <command> [options]

commands:
  demo         dense top-5 next to Maniscope's on the shipped corpus (or --data DIR), with a quality table
  bench        benchmarks against the slow references: geograph bench {run,gpu,maniscope,ricci,iso,g3} [options]
  build-graph  embed a BEIR folder and save a CorpusGraph (k-NN or title mentions) for ISO-RAG
  serve        HTTP rerank/retrieve server on LitServe: geograph serve --method {maniscope,ricci,iso,g3} --corpus DIR

run 'geograph <command> --help' for the options of a command."""


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "demo":
        from geograph.demo import main as demo_main

        return demo_main(rest)
    if command == "bench":
        from geograph.bench.__main__ import main as bench_main

        return bench_main(rest)
    if command == "build-graph":
        from geograph.build_graph import main as build_main

        return build_main(rest)
    if command == "serve":
        from geograph.serve import main as serve_main

        return serve_main(rest)
    print(f"geograph: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
