"""Terminal text shared by the commands (demo, bench, build-graph, serve, cli): one-line usage
errors, argument parsers whose help is plain text (and subcommands that add their arguments
when first needed or forward them to a command of their own), and plain-text tables.

It imports nothing from geograph, so every application can use it without importing another.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn


class UsageError(Exception):
    """A mistake in a command's arguments: reported as one line on stderr with exit code 2."""

    def exit(self, prog: str) -> int:
        print(f"{prog}: error: {self}", file=sys.stderr)
        return 2


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's layout, with a subcommand's name measured at the indentation it is printed at
    (argparse counts it two columns short, and a long name then pushes its help to a new line)."""

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if action.help is not argparse.SUPPRESS and isinstance(action, argparse._SubParsersAction):
            longest = max((len(name) for name in action.choices), default=0)
            self._action_max_length = max(self._action_max_length, longest + self._current_indent + 2)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose mistakes are one line and whose help is plain text.

    ``arguments``: a function that adds the parser's arguments the first time it parses or
    prints its help (a subcommand whose options need imports that the other commands should
    not pay for, or an extra that may be missing).
    """

    def __init__(
        self, *args: Any, arguments: Callable[[argparse.ArgumentParser], None] | None = None, **kwargs: Any
    ) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)
        self._arguments = arguments

    def _add_arguments(self) -> None:
        if self._arguments is not None:
            add, self._arguments = self._arguments, None
            add(self)

    def parse_known_args(  # type: ignore[override]  # one signature for typeshed's three overloads
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._add_arguments()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._add_arguments()
        return super().format_usage()

    def format_help(self) -> str:  # descriptions come from docstrings: no reST markup on a terminal
        self._add_arguments()
        return plain_text(super().format_help())

    def error(self, message: str) -> NoReturn:  # one line instead of argparse's usage block
        print(f"{self.prog}: error: {message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(2)


class Forward(_Parser):
    """A subcommand that hands every argument after its name, unparsed, to a command with its
    own parser (``geograph bench <name>``): the namespace gets them as ``argv``."""

    def parse_known_args(  # type: ignore[override]  # one signature for typeshed's three overloads
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        namespace = argparse.Namespace() if namespace is None else namespace
        namespace.argv = list(sys.argv[1:] if args is None else args)
        return namespace, []


def make_parser(prog: str | None, description: str | None, **kwargs: Any) -> argparse.ArgumentParser:
    """An argument parser whose mistakes print one line and exit 2, and whose help is plain text
    (``kwargs``: more :class:`argparse.ArgumentParser` options, e.g. ``argument_default``; and
    ``arguments``, a function that adds the arguments when they are first needed)."""
    return _Parser(prog=prog, description=description, **kwargs)


def command_parser(
    prog: str, description: str, add_arguments: Callable[[argparse.ArgumentParser], None]
) -> argparse.ArgumentParser:
    """A command's parser on its own (``python -m`` on its module, tests): :func:`make_parser`
    with the command's arguments."""
    p = make_parser(prog, description)
    add_arguments(p)
    return p


def add_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    description: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
) -> None:
    """Add the command ``name`` (its one-line ``summary`` in ``geograph --help``, its arguments and
    its handler ``run``) to the ``geograph`` command's subcommands."""
    p = commands.add_parser(name, help=summary, description=description)
    add_arguments(p)
    p.set_defaults(func=run)


def add_ray_options(parser: argparse.ArgumentParser, *, embed: bool = True) -> None:
    """``--ray [ADDRESS]`` and, with ``embed``, the encoder actor pool's options (the ``ray`` extra)."""
    g = parser.add_argument_group("Ray (pip install 'geograph-rag[ray]')")
    g.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="run on Ray: alone, a local Ray on this machine; 'auto' or ray://HOST:PORT joins a cluster",
    )
    if embed:
        g.add_argument("--concurrency", type=int, default=2, help="encoder actors with --ray (default: 2)")
        g.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per encoder actor with --ray (default: 0)")
        g.add_argument("--batch-size", type=int, default=64, help="texts per forward pass (default: 64)")


#: the encoder runtimes ``--encoder-backend`` takes (:data:`geograph.data.backends.BACKENDS`, which
#: this layer cannot import; a test checks that they are the same)
ENCODER_BACKENDS = ("torch", "onnx", "onnx-int8")


def add_encoder_options(parser: argparse.ArgumentParser) -> None:
    """``--encoder``, ``--query-prefix``, ``--passage-prefix``, ``--encoder-backend``: the model that embeds
    and its runtime, recorded in saved artefacts."""
    g = parser.add_argument_group("encoder")
    g.add_argument(
        "--encoder",
        metavar="MODEL",
        help="a local sentence-transformers folder, or a hub id (ORG/NAME) fetched when online or read from "
        "the local Hugging Face cache (default: the offline all-MiniLM-L6-v2)",
    )
    g.add_argument("--query-prefix", default="", metavar="TEXT", help="prepended to queries (e.g. 'query: ')")
    g.add_argument("--passage-prefix", default="", metavar="TEXT", help="prepended to passages (e.g. 'passage: ')")
    g.add_argument(
        "--encoder-backend",
        default="torch",
        choices=ENCODER_BACKENDS,
        help="the encoder's runtime: torch, onnx (ONNX Runtime, exported locally on first use) or onnx-int8 "
        "(that export, dynamically quantised); the onnx ones need the 'onnx' extra (default: torch)",
    )


def encoder_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :class:`geograph.data.Encoder` that :func:`add_encoder_options` gave;
    a path-like ``--encoder`` that does not exist is a one-line :class:`UsageError`."""
    model = getattr(args, "encoder", None)
    if model is not None:
        looks_local = model.startswith((".", "/", "~")) or model.count("/") != 1
        if looks_local and not Path(model).expanduser().is_dir():
            raise UsageError(f"--encoder: {model}: no such model folder")
        model = str(Path(model).expanduser()) if looks_local else model
    return {
        "model": model,
        "query_prefix": args.query_prefix,
        "passage_prefix": args.passage_prefix,
        "backend": getattr(args, "encoder_backend", "torch"),
    }


def check_ray_options(args: argparse.Namespace) -> None:
    """One line naming the option when an actor-pool option makes no sense (or is given without --ray)."""
    if getattr(args, "concurrency", None) is None:
        return
    if args.ray is None and (args.concurrency != 2 or args.num_gpus != 0):
        raise UsageError("--concurrency and --num-gpus apply to --ray")
    if args.concurrency < 1:
        raise UsageError(f"--concurrency must be at least 1, got {args.concurrency}")
    if not args.num_gpus >= 0:
        raise UsageError(f"--num-gpus must be at least 0, got {args.num_gpus}")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {args.batch_size}")


_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|obj|exc|ref):`~?([^`<]*?)(?:\s*<[^>]*>)?`")


def plain_text(text: str) -> str:
    r"""Help text without reStructuredText markup: roles, literals, emphasis, directives and literal-block markers.

    Example:
        >>> plain_text("``geograph bench``: see :func:`~geograph.bench.common.tuning_split` and **this**.")
        'geograph bench: see tuning_split and this.'
        >>> plain_text("Run it::\n\n    geograph demo\n\n::\n\n    geograph serve")
        'Run it:\n\n    geograph demo\n\n    geograph serve'
    """

    def role(m: re.Match[str]) -> str:
        target: str = m.group(1).strip()
        return target.rsplit(".", 1)[-1] if m.group(0).find("`~") >= 0 else target

    text = _ROLE.sub(role, text)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    text = re.sub(r"(?<![\w`])`([^`\n]+)`_?(?![\w`])", r"\1", text)
    text = re.sub(r"\*\*([^*\n]+)\*\*", r"\1", text)
    text = re.sub(r"^(\s*)\.\. \w+::\s*", r"\1", text, flags=re.M)
    text = re.sub(r"^[ \t]*::[ \t]*\n\n?", "", text, flags=re.M)  # a literal block's lone marker
    text = re.sub(r"(\S)::$", r"\1:", text, flags=re.M)  # "Example::" -> "Example:"
    return text


def format_table(
    rows: dict[str, dict[str, float]], columns: Sequence[str], formats: dict[str, str] | None = None
) -> str:
    """A plain-text table, one row per method: the name, then each column right-aligned in 12
    characters, or its name's length plus 2 if longer (``formats[column]``, default ``"12.3f"``).

    Example:
        >>> print(format_table({"dense": {"nDCG@10": 0.5}}, ["nDCG@10"]))
        method      nDCG@10
        -------------------
        dense         0.500
    """
    formats = formats or {}
    width = max(len(r) for r in rows) + 2
    cw = {c: max(12, len(c) + 2) for c in columns}  # names never run into each other
    head = "method".ljust(width) + "".join(c.rjust(cw[c]) for c in columns)
    lines = [head, "-" * len(head)]
    for name, vals in rows.items():
        lines.append(
            name.ljust(width) + "".join(format(vals[c], formats.get(c, "12.3f")).rjust(cw[c]) for c in columns)
        )
    return "\n".join(lines)
