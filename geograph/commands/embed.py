"""geograph embed: embed the passages of a BEIR folder (or a JSONL file) into the embedding cache."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from geograph.commands import checked_encoder_options
from geograph.console import (
    UsageError,
    add_command,
    add_encoder_options,
    add_ray_options,
    check_ray_options,
    command_parser,
)
from geograph.data import corpus_path

if TYPE_CHECKING:
    from geograph.data import EmbeddingCache

PROG = "geograph embed"
SUMMARY = "embed a corpus (BEIR folder or JSONL file) into the embedding cache (--ray: a Ray Data actor pool)"

DESCRIPTION = """\
Embed every passage (title + " " + text) of a BEIR-format folder (only corpus.jsonl is read) or
of a JSONL file of BEIR corpus records with --encoder (default: the offline all-MiniLM-L6-v2;
--passage-prefix prepended) into the embedding cache (--cache, default
$GEOGRAPH_CACHE or ~/.cache/geograph); passages already cached are skipped. The commands that
read the cache (demo --data, build-graph, bench) then find them.

--ray runs the encoders as a Ray Data actor pool (--concurrency actors, --num-gpus each, one cache
shard per --rows-per-shard passages): alone it starts a local Ray; --ray auto or
--ray ray://HOST:PORT joins a cluster, whose nodes must all read --data and write --cache
(shared storage)."""


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``geograph embed`` on its own (:func:`register` adds it to ``geograph``)."""
    return command_parser(PROG, DESCRIPTION, add_arguments)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``embed`` to the ``geograph`` command's subcommands."""
    add_command(commands, "embed", SUMMARY, DESCRIPTION, add_arguments, run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        required=True,
        type=corpus_path,
        metavar="PATH",
        help="BEIR-format folder, a JSONL file of passages, or a shipped corpus by name (demo)",
    )
    p.add_argument(
        "--cache", metavar="DIR", help="embedding cache folder (default: $GEOGRAPH_CACHE or ~/.cache/geograph)"
    )
    add_encoder_options(p)
    add_ray_options(p)
    p.add_argument(
        "--rows-per-shard", type=int, default=1024, help="passages per cache shard with --ray (default: 1024)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``geograph embed`` with ``argv``; the exit status."""
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Embed the passages the parsed arguments name; the exit status."""
    from geograph.data import BEIRError, Encoder, load_corpus

    try:
        check_ray_options(args)
        options = checked_encoder_options(args)
        if args.ray is not None and (args.passage_prefix or args.query_prefix):
            raise UsageError("--passage-prefix and --query-prefix are not supported with --ray")
        if args.ray is not None and options["backend"] != "torch":
            raise UsageError(
                f"--encoder-backend {options['backend']} is not supported with --ray (its actors run torch)"
            )
        if args.rows_per_shard < 1:
            raise UsageError(f"--rows-per-shard must be at least 1, got {args.rows_per_shard}")
        if not Path(args.data).exists():
            raise UsageError(f"--data: {args.data}: no such file or folder")
        try:
            passages = load_corpus(args.data).passages()
        except BEIRError as e:
            raise UsageError(f"--data: {e}") from None
    except UsageError as e:
        return e.exit(PROG)
    t0 = time.perf_counter()
    if args.ray is not None:
        try:
            from geograph.distributed import embed_corpus
        except ImportError as e:
            return UsageError(f"--ray: {e}").exit(PROG)
        try:
            report = embed_corpus(
                args.data,
                cache=args.cache,
                model=options["model"],
                address=args.ray,
                concurrency=args.concurrency,
                num_gpus=args.num_gpus,
                batch_size=args.batch_size,
                rows_per_shard=args.rows_per_shard,
            )
        except ConnectionError as e:
            return UsageError(f"--ray {args.ray}: cannot connect ({str(e).splitlines()[0]})").exit(PROG)
        except RuntimeError as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return 1
        print(
            f"{report.passages} passages: {report.cached} already cached, {report.encoded} encoded on Ray by "
            f"{args.concurrency} actors into {report.shards} shards of {report.cache} ({report.seconds:.1f} s)"
        )
        return 0
    encoder = Encoder(cache=args.cache, batch_size=args.batch_size, **options)
    passages = [encoder.passage_prefix + p for p in passages]
    cache = cast("EmbeddingCache", encoder.cache)  # a cache folder (or the default one): an EmbeddingCache
    _, missing = cache.get(passages)
    encoder.encode(passages)
    print(
        f"{len(passages)} passages: {len(passages) - len(missing)} already cached, {len(missing)} encoded into "
        f"{cache.path} ({time.perf_counter() - t0:.1f} s)"
    )
    return 0
