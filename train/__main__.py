"""``python -m train fit --config configs/iso_poincare.yaml``: LightningCLI for f_theta."""
from lightning.pytorch.cli import LightningCLI

from train.data import GraphDataModule
from train.module import PoincareModule


class ProjectionCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.dim", "model.in_dim", apply_on="instantiate")


def main(args=None) -> None:
    ProjectionCLI(PoincareModule, GraphDataModule, save_config_kwargs={"overwrite": True}, args=args)


if __name__ == "__main__":
    main()
