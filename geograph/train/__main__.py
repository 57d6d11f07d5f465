"""``python -m geograph.train fit --config iso_poincare`` (the shipped config, from any directory; or
a YAML file): LightningCLI for f_theta. ``python -m train fit ...`` from the repository root is the same."""

import sys
from collections.abc import Sequence

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from geograph import configs
from geograph.train.data import DataConfigError, GraphDataModule
from geograph.train.module import PoincareModule


class ProjectionCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.dim", "model.in_dim", apply_on="instantiate")

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except DataConfigError as e:  # a user mistake: one line, exit 2, no traceback
            print(f"python -m train: error: {e}", file=sys.stderr)
            sys.exit(2)


def shipped_configs(argv: Sequence[str]) -> list[str]:
    """``argv`` with each ``--config`` / ``-c`` value that is not a file but names a shipped config
    (:func:`geograph.configs.resolve`) replaced by that config's path; other values are left to
    LightningCLI (which also takes inline YAML there)."""

    def resolve(value: str) -> str:
        try:
            return str(configs.resolve(value))
        except ValueError:
            return value

    out = list(argv)
    for i, arg in enumerate(out):
        if arg in ("--config", "-c") and i + 1 < len(out):
            out[i + 1] = resolve(out[i + 1])
        elif arg.startswith("--config="):
            out[i] = "--config=" + resolve(arg[len("--config=") :])
    return out


def main(args: Sequence[str] | None = None) -> None:
    args = shipped_configs(sys.argv[1:] if args is None else args)
    ProjectionCLI(PoincareModule, GraphDataModule, save_config_kwargs={"overwrite": True}, args=args)


if __name__ == "__main__":
    main()
