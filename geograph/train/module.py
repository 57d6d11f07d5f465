r"""LightningModule that fits :class:`geograph.PoincareProjection` (f_theta) on a passage graph.

Loss per batch of triplets ``(u, v, w)`` (``v`` a graph neighbour of ``u``, ``w`` not), with
``z = f_theta(h)`` in the Poincare ball and ``d`` the Poincare distance (geoopt):

.. math:: \mathcal{L}_{tri} = \frac{1}{B} \sum \max\big(0,\ d(z_u, z_v) - d(z_u, z_w) + \mathrm{margin}\big)

.. math:: \mathcal{L}_{rad} = \frac{1}{|U|} \sum_{x \in U} \big(\lVert z_x \rVert \sqrt{c} - r^*(\deg x)\big)^2,
          \qquad r^*(k) = r_{max} - (r_{max} - r_{min}) \frac{\log(1 + k)}{\log(1 + k_{max})}

over the nodes ``U`` of the batch: hubs (``k = k_max``) are pulled to radius ``r_min`` near
the origin, leaves to ``r_max`` near the rim. Total: ``L_tri + radial_weight * L_rad``.
These are our forms (the paper's appendix with its exact ones is not available).
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, cast

import lightning as L
import torch
from torch import Tensor

from geograph.projection import PoincareProjection

if TYPE_CHECKING:
    from lightning.fabric.utilities.data import AttributeDict

    from geograph.graphs.corpus_graph import CorpusGraph


def radial_target(degree: Tensor, max_degree: int, r_min: float = 0.1, r_max: float = 0.9) -> Tensor:
    """``r*(k)``: target radius (in units of ``1/sqrt(c)``), decreasing in log-degree."""
    scale = math.log1p(max(int(max_degree), 1))
    return r_max - (r_max - r_min) * torch.log1p(degree.float()) / scale


class PoincareModule(L.LightningModule):
    """Fits f_theta with the triplet and radial losses of the module docstring.

    Args:
        in_dim: embedding size (linked from the data module by the CLI).
        out_dim, hidden, c: of :class:`~geograph.PoincareProjection`.
        margin: triplet margin (Poincare distance).
        radial_weight: weight of the radial regulariser.
        r_min, r_max: target radii of the largest hub and of degree-0 nodes.
        lr, weight_decay: AdamW. (Euclidean parameters: the MLP lives in R^n and only its
            output is mapped into the ball, so no Riemannian optimiser is needed.)
    """

    def __init__(
        self,
        in_dim: int = 384,
        out_dim: int = 32,
        hidden: int = 256,
        c: float = 1.0,
        margin: float = 1.0,
        radial_weight: float = 10.0,
        r_min: float = 0.1,
        r_max: float = 0.9,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.projection = PoincareProjection(in_dim, out_dim, hidden=hidden, c=c)
        # The corpus is data, not state: plain attributes (not buffers), so that DDP does not
        # broadcast a (V, D) tensor on every step and checkpoints hold only f_theta.
        self.embeddings = torch.empty(0, in_dim)
        self.degree = torch.empty(0, dtype=torch.long)
        self.max_degree = 0

    def attach(self, graph: CorpusGraph) -> None:
        """Take the node embeddings and degrees of ``graph`` (done by :meth:`setup` from the data module)."""
        self.embeddings = graph.embeddings.float().to(self.device)
        self.degree = graph.degree().to(self.device)
        self.max_degree = int(self.degree.max()) if self.degree.numel() else 0  # once, not per step

    def setup(self, stage: str | None = None) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is not None and self.embeddings.numel() == 0:
            self.attach(dm.graph)

    def losses(self, triplets: Tensor) -> dict[str, Tensor]:
        if self.embeddings.numel() == 0:
            raise RuntimeError("no graph attached: call attach(graph) or train through GraphDataModule")
        if self.embeddings.device != triplets.device:  # once, after the trainer moved the model
            self.embeddings, self.degree = self.embeddings.to(triplets.device), self.degree.to(triplets.device)
        nodes, inverse = torch.unique(triplets.long().reshape(-1), return_inverse=True)
        z = self.projection(self.embeddings[nodes])
        zu, zv, zw = (z[inverse.view(-1, 3)[:, i]] for i in range(3))
        d_pos = self.projection.distance(zu, zv)
        d_neg = self.projection.distance(zu, zw)
        hp = cast("AttributeDict", self.hparams)  # what save_hyperparameters() stores
        triplet = torch.relu(d_pos - d_neg + hp.margin).mean()
        target = radial_target(self.degree[nodes], self.max_degree, hp.r_min, hp.r_max)
        radius = z.norm(dim=-1) * math.sqrt(hp.c)
        radial = ((radius - target.to(radius.dtype)) ** 2).mean()
        return {
            "loss": triplet + hp.radial_weight * radial,
            "triplet": triplet,
            "radial": radial,
            "accuracy": (d_pos < d_neg).float().mean(),
        }

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        out = self.losses(batch)
        self.log_dict({f"train/{k}": val for k, val in out.items()}, prog_bar=True, batch_size=batch.shape[0])
        return out["loss"]

    def validation_step(self, batch: Tensor, batch_idx: int) -> None:
        out = self.losses(batch)
        self.log_dict(
            {f"val/{k}": val for k, val in out.items()}, prog_bar=True, batch_size=batch.shape[0], sync_dist=True
        )

    def configure_optimizers(self) -> torch.optim.AdamW:
        hp = cast("AttributeDict", self.hparams)  # what save_hyperparameters() stores
        return torch.optim.AdamW(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)


class ExportProjection(L.Callback):
    """At the end of ``fit``, write the best checkpoint's f_theta (``PoincareProjection.save_pretrained``).

    The artefact directory goes to ``path``, by default ``projection`` in the run's own log
    directory (``trainer.log_dir``, e.g. ``runs/iso_poincare/lightning_logs/version_3``), and
    never replaces an existing one: when the name is taken, ``projection-1``, ``projection-2``
    ... is used instead. The path is printed and kept in :attr:`exported`. It loads with
    ``geograph.PoincareProjection.from_pretrained(path)`` into ``ISORetriever``. Without a checkpoint
    callback (or before any checkpoint) the final weights are written. The checkpoint is read with
    ``torch.load(weights_only=True)``: one that holds anything but tensors and plain data is a
    ``ValueError``, never unpickled.
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.exported: Path | None = None

    @staticmethod
    def free_name(path: Path) -> Path:
        """``path``, or the first of ``<stem>-1<suffix>``, ``<stem>-2<suffix>`` ... that does not exist."""
        n = 0
        candidate = path
        while candidate.exists():
            n += 1
            candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
        return candidate

    # exports a PoincareModule's projection: attached to that module's fit only
    def on_fit_end(self, trainer: L.Trainer, pl_module: PoincareModule) -> None:  # type: ignore[override]
        log_dir = trainer.log_dir  # a collective under DDP: every process asks
        if not trainer.is_global_zero:
            return
        state = None
        ckpt = getattr(trainer.checkpoint_callback, "best_model_path", "") if trainer.checkpoint_callback else ""
        projection = PoincareProjection(**pl_module.projection.config())
        if ckpt and Path(ckpt).is_file():
            try:  # tensors and plain data only: a checkpoint cannot run code when read
                blob = torch.load(ckpt, map_location="cpu", weights_only=True)
            except pickle.UnpicklingError as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ValueError(
                    f"checkpoint {ckpt}: holds more than tensors and plain data, not read ({first})"
                ) from None
            state = {
                k[len("projection.") :]: val for k, val in blob["state_dict"].items() if k.startswith("projection.")
            }
        projection.load_state_dict(state if state is not None else pl_module.projection.state_dict())
        path = self.free_name(
            Path(self.path) if self.path else Path(log_dir or trainer.default_root_dir) / "projection"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        projection.save_pretrained(path)
        self.exported = path
        print(f"f_theta exported to {path} (geograph.PoincareProjection.from_pretrained)", flush=True)
