"""Training of ISO-RAG's hyperbolic projection f_theta with Lightning.

``python -m geograph.train fit --config iso_poincare`` (LightningCLI, the shipped config; from the
repository root ``python -m train fit ...`` is the same command: the top-level ``train/`` folder
of the source tree forwards here and is not installed). See
:class:`geograph.train.module.PoincareModule` for the losses and
:class:`geograph.train.data.GraphDataModule` for the triplets. Needs the ``train`` extra
(lightning, jsonargparse).
"""

from geograph.train.data import GraphDataModule, TripletDataset, TripletSampler, build_graph, triplet_loader
from geograph.train.fit import train_projection
from geograph.train.module import ExportProjection, PoincareModule, radial_target

__all__ = [
    "PoincareModule",
    "GraphDataModule",
    "TripletDataset",
    "TripletSampler",
    "triplet_loader",
    "build_graph",
    "ExportProjection",
    "radial_target",
    "train_projection",
]
