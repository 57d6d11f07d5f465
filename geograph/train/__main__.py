"""``python -m geograph.train fit --config configs/iso_poincare.yaml`` (``python -m train fit ...``
from the repository root): LightningCLI for f_theta."""

import sys

from lightning.pytorch.cli import LightningCLI

from geograph.train.data import DataConfigError, GraphDataModule
from geograph.train.module import PoincareModule


class ProjectionCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.dim", "model.in_dim", apply_on="instantiate")

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except DataConfigError as e:  # a user mistake: one line, exit 2, no traceback
            print(f"python -m train: error: {e}", file=sys.stderr)
            sys.exit(2)


def main(args=None) -> None:
    ProjectionCLI(PoincareModule, GraphDataModule, save_config_kwargs={"overwrite": True}, args=args)


if __name__ == "__main__":
    main()
