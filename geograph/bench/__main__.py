"""``python -m geograph.bench <name> [options]`` (also ``geograph bench``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

#: every benchmark: its module (which parses its own options) and a one-line summary
BENCHES = {
    "maniscope": "geograph.bench.maniscope",
    "ricci": "geograph.bench.ricci",
    "iso": "geograph.bench.iso",
    "g3": "geograph.bench.g3",
    "run": "geograph.bench.run",
    "gpu": "geograph.bench.gpu",
    "scale": "geograph.bench.scale",
    "serve": "geograph.bench.serve",
    "encoder": "geograph.bench.encoder",
    "update": "geograph.bench.update",
}
SUMMARIES = {
    "run": "every method and chain on every labelled data set: quality, intervals against dense, speed",
    "gpu": "every kernel and module on CUDA against its CPU result, with timings",
    "maniscope": "batched Maniscope against the per-query scikit-learn + scipy reference",
    "ricci": "RicciFiltration against GraphRicciCurvature 0.6.1 per query",
    "iso": "ISO-RAG against dense on MuSiQue and SciFact, and against per-query networkx PageRank",
    "g3": "blockwise G3 graph build against the dense numpy construction, and G3RAG against dense",
    "scale": "k-NN and G3 graphs and dense retrieval at 200k-1M passages: IVF vs exact, time per stage, peak memory",
    "update": "adding and removing passages in place against a rebuild: time share, exact equality",
    "serve": "closed-loop HTTP load on geograph serve: req/s, p50/p99 per request kind, the encoder's limit, --soak N",
    "encoder": "the encoder's backends (torch, onnx, onnx-int8): texts/s at batch 1/32/128, agreement, nDCG@10",
}
SUMMARY = "benchmarks against the slow references: geograph bench <name> [options]"


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``bench`` and its benchmarks to the ``geograph`` command's subcommands. Each benchmark
    parses its own options: its subcommand hands it every argument after its name."""
    from geograph.console import Forward

    p = commands.add_parser(
        "bench",
        help=SUMMARY,
        description="Benchmarks: each prints ratios against a slow reference measured in the same run, "
        "and writes JSON.",
        epilog="run 'geograph bench <name> --help' for the options of a benchmark.",
    )
    names = p.add_subparsers(
        title="benchmarks", metavar="<name>", dest="benchmark", required=True, parser_class=Forward
    )
    for name in BENCHES:
        names.add_parser(name, help=SUMMARIES[name], add_help=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark ``args.benchmark`` with the arguments ``args.argv``; its exit status."""
    import importlib

    status: int = importlib.import_module(BENCHES[args.benchmark]).main(args.argv)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in BENCHES:
        from geograph.console import UsageError

        what = f"unknown benchmark {argv[0]!r}" if argv else "name a benchmark"
        return UsageError(f"{what}: {', '.join(BENCHES)} (see 'geograph bench --help')").exit("geograph bench")
    return run(argparse.Namespace(benchmark=argv[0], argv=argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
