"""Training of ISO-RAG's hyperbolic projection f_theta with Lightning.

``python -m train fit --config configs/iso_poincare.yaml`` (LightningCLI). See
:class:`train.module.PoincareModule` for the losses and :class:`train.data.GraphDataModule` for
the triplets. Needs the ``train`` extra (lightning, jsonargparse).
"""
from train.data import GraphDataModule, TripletDataset, TripletSampler, build_graph, triplet_loader
from train.module import ExportProjection, PoincareModule, radial_target
from train.fit import train_projection

__all__ = ["PoincareModule", "GraphDataModule", "TripletDataset", "TripletSampler", "triplet_loader", "build_graph", "ExportProjection", "radial_target", "train_projection"]
