"""``python -m geograph.bench <name> [options]`` (also ``geograph bench``).

The benchmarks are each registered method's own command (its spec's ``bench_command``, in the
method's folder or plugin, e.g. ``geograph/methods/maniscope/command.py``), in the registry's order,
then the benchmarks of no one method (:data:`BENCHES`).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import sys
from collections.abc import Callable, Sequence

#: a benchmark's ``main``: its arguments (after its name) -> its exit status
Main = Callable[[Sequence[str]], int]

#: the benchmarks of no one method: their module (its ``main`` parses its own options) and a one-line summary
BENCHES = {
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
    "scale": "k-NN and G3 graphs and dense retrieval at 200k-1M passages: IVF vs exact, time per stage, peak memory",
    "update": "adding and removing passages in place against a rebuild: time share, exact equality",
    "serve": "closed-loop HTTP load on geograph serve: req/s, p50/p99 per request kind, the encoder's limit, --soak N",
    "encoder": "the encoder's backends (torch, onnx, onnx-int8): texts/s at batch 1/32/128, agreement, nDCG@10",
}
log = logging.getLogger("geograph.bench")
_warned: set[str] = set()  # the methods whose command was not listed, warned once per process

SUMMARY = "benchmarks against the slow references: geograph bench <name> [options]"


def benchmarks() -> dict[str, tuple[str, Callable[[], Main]]]:
    """Every benchmark by name: its one-line summary and a function that imports its ``main``.

    First the registered methods that declare a command (built-in folders and installed plugins
    alike, in the registry's order), then :data:`BENCHES`, whose names a method's command cannot take.

    Example:
        >>> list(benchmarks())[:5]
        ['maniscope', 'ricci', 'iso', 'g3', 'run']
    """
    from geograph import registry

    found: dict[str, tuple[str, Callable[[], Main]]] = {}
    for spec in registry.METHODS.values():
        if spec.bench_command is None:
            continue
        if spec.name in BENCHES:  # a built-in benchmark keeps its name
            if spec.name not in _warned:
                _warned.add(spec.name)
                where = spec.module.__module__
                log.warning(
                    "geograph: the bench command of method %r (%s) is not listed: the name is taken", spec.name, where
                )
            continue
        found[spec.name] = (spec.bench_summary, functools.partial(spec.load, spec.bench_command))
    for name, module in BENCHES.items():
        found[name] = (SUMMARIES[name], functools.partial(_main_of, module))
    return found


def _main_of(module: str) -> Main:
    main: Main = importlib.import_module(module).main
    return main


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``bench`` and its benchmarks to the ``geograph`` command's subcommands. Each benchmark
    parses its own options: its subcommand hands it every argument after its name. The list is
    read from the registry only when ``bench`` is parsed or its help printed."""
    commands.add_parser(
        "bench",
        help=SUMMARY,
        description="Benchmarks: each prints ratios against a slow reference measured in the same run, "
        "and writes JSON.",
        epilog="run 'geograph bench <name> --help' for the options of a benchmark.",
        arguments=_add_benchmarks,
    ).set_defaults(func=run)


def _add_benchmarks(p: argparse.ArgumentParser) -> None:
    from geograph.console import Forward

    names = p.add_subparsers(
        title="benchmarks", metavar="<name>", dest="benchmark", required=True, parser_class=Forward
    )
    for name, (summary, _) in benchmarks().items():
        names.add_parser(name, help=summary, add_help=False)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark ``args.benchmark`` with the arguments ``args.argv``; its exit status."""
    status: int = benchmarks()[args.benchmark][1]()(args.argv)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = benchmarks()
    if not argv or argv[0] not in names:
        from geograph.console import UsageError

        what = f"unknown benchmark {argv[0]!r}" if argv else "name a benchmark"
        return UsageError(f"{what}: {', '.join(names)} (see 'geograph bench --help')").exit("geograph bench")
    return run(argparse.Namespace(benchmark=argv[0], argv=argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
