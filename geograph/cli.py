"""The geograph command: geograph demo, geograph bench <name>, geograph build-graph, geograph update, geograph serve."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence

from geograph.console import UsageError, make_parser, plain_text  # noqa: F401  (re-exported for callers of geograph.cli)

USAGE = """usage: geograph <command> [options]   (geograph --version: the installed version)

commands:
  demo         every method side by side on the shipped corpus (or --data DIR), then a quality table
  bench        benchmarks against the slow references:
               geograph bench {run,gpu,maniscope,ricci,iso,g3,scale,serve,update} [options]
  build-graph  embed a BEIR folder and save a CorpusGraph (k-NN or title mentions) for ISO-RAG, or a G3Graph
  update       apply a changed BEIR folder (added, removed, edited passages) to a saved graph, in place
  embed        embed a BEIR folder or JSONL file into the embedding cache (--ray: a Ray Data actor pool)
  serve        HTTP rerank/retrieve server on LitServe:
               geograph serve --method {maniscope,ricci,iso,g3,dense} --corpus DIR [--config serve.yaml]

run 'geograph <command> --help' for the options of a command."""

BENCH_HELP = {
    "run": "every method and chain on every labelled data set: quality, intervals against dense, speed",
    "gpu": "every kernel and module on CUDA against its CPU result, with timings",
    "maniscope": "batched Maniscope against the per-query scikit-learn + scipy reference",
    "ricci": "RicciFiltration against GraphRicciCurvature 0.6.1 per query",
    "iso": "ISO-RAG against dense on MuSiQue and SciFact, and against per-query networkx PageRank",
    "g3": "blockwise G3 graph build against the dense numpy construction, and G3RAG against dense",
    "scale": "k-NN and G3 graphs and dense retrieval at 200k-1M passages: IVF vs exact, time per stage, peak memory",
    "update": "adding and removing passages in place against a rebuild: time share, exact equality",
    "serve": "closed-loop HTTP load on geograph serve: req/s, p50/p99 per request kind, the encoder's limit, --soak N",
}


@contextlib.contextmanager
def _plain_help():
    """While a subcommand parses its arguments, print its help (from its module docstring) as plain text."""
    original = argparse.ArgumentParser.format_help

    def format_help(self) -> str:
        return plain_text(original(self))

    argparse.ArgumentParser.format_help = format_help
    try:
        yield
    finally:
        argparse.ArgumentParser.format_help = original


def bench_usage() -> str:
    from geograph.bench.__main__ import BENCHES

    lines = ["usage: geograph bench <name> [options]", "", "benchmarks:"]
    lines += [f"  {name:<10} {BENCH_HELP.get(name, '')}".rstrip() for name in BENCHES]
    lines += ["", "run 'geograph bench <name> --help' for the options of a benchmark."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from geograph._version import DISTRIBUTION, version

        print(f"geograph {version()} ({DISTRIBUTION})")
        return 0
    command, rest = argv[0], argv[1:]
    if command == "demo":
        from geograph.commands.demo import main as demo_main

        return demo_main(rest)
    if command == "bench":
        if not rest:
            from geograph.bench.__main__ import BENCHES

            return UsageError(f"name a benchmark: {', '.join(BENCHES)} (see 'geograph bench --help')").exit(
                "geograph bench"
            )
        if rest[0] in ("-h", "--help"):
            print(bench_usage())
            return 0
        from geograph.bench.__main__ import main as bench_main

        with _plain_help():  # the benchmarks' help comes from their module docstrings
            return bench_main(rest)
    if command == "build-graph":
        from geograph.commands.build_graph import main as build_main

        return build_main(rest)
    if command == "update":
        from geograph.commands.update import main as update_main

        return update_main(rest)
    if command == "embed":
        from geograph.commands.embed import main as embed_main

        return embed_main(rest)
    if command == "serve":
        from geograph.serve import main as serve_main

        return serve_main(rest)
    print(f"geograph: error: unknown command {command!r} (run 'geograph --help' for the commands)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
