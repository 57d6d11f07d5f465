"""``geograph bench run``: the command line."""

from __future__ import annotations

from collections.abc import Sequence

from geograph.bench.run.config import DEFAULT_CONFIG, load_config
from geograph.bench.run.protocol import run
from geograph.bench.run.tables import print_table, write
from geograph.console import UsageError, add_encoder_options, encoder_options, make_parser


def main(argv: Sequence[str] | None = None) -> int:
    from geograph.bench import run as package

    p = make_parser("geograph bench run", package.__doc__)
    p.add_argument(
        "--config",
        default=str(DEFAULT_CONFIG),
        help="bench YAML, or a shipped config: bench/default (the default), bench/smoke",
    )
    p.add_argument("--data", nargs="*", default=[], help="more BEIR-format folders with qrels")
    p.add_argument("--out", help="output folder (default: the config's out)")
    p.add_argument("--cache", help="embedding cache directory")
    p.add_argument("--no-progress", action="store_true")
    add_encoder_options(p)
    args = p.parse_args(argv)
    try:
        options = encoder_options(args)
    except UsageError as e:
        return e.exit(p.prog)
    cfg = load_config(args.config)
    cfg["datasets"] += [{"path": d, "primary": cfg["metrics"][0]} for d in args.data]
    if args.out:
        cfg["out"] = args.out
    results = run(cfg, progress=not args.no_progress, cache=args.cache, encoder=options)
    print_table(results)
    paths = write(results, cfg["out"])
    print("wrote " + ", ".join(str(v) for v in paths.values()))
    return 0
