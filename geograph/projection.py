"""Encoders: ISO-RAG's hyperbolic projection f_theta onto the Poincare ball (geoopt)."""

from __future__ import annotations

from pathlib import Path

import geoopt
import torch  # noqa: F401 - the doctests run in this namespace
from torch import Tensor, nn

from geograph._checks import check_positive_int
from geograph._io import atomic_torch_save, one_line, read_torch
from geograph.functional.isoperimetric import conformal_volume  # its home; re-exported here

__all__ = ["PoincareProjection", "IdentityPoincare", "conformal_volume"]

_FORMAT = 1  # the file format of PoincareProjection.save


class PoincareProjection(nn.Module):
    r"""f_theta: a small MLP, then the exponential map at the origin of the Poincare ball.

    .. math:: z = \exp_0^c\big(W_2\, \mathrm{GELU}(W_1 h + b_1) + b_2\big), \qquad
              \exp_0^c(v) = \tanh(\sqrt{c}\,\lVert v\rVert) \frac{v}{\sqrt{c}\,\lVert v\rVert}

    computed by ``geoopt.PoincareBall(c).expmap0`` and projected with geoopt's ``projx`` so
    that every output is strictly inside the ball (``|z| <= (1 - 4e-3) / sqrt(c)`` in float32),
    however large the input. ``hidden=0`` drops the hidden layer (one linear map).

    State: ``state_dict()`` holds the weights and the ball's curvature; after
    ``load_state_dict`` the attribute ``c`` (read by :class:`~geograph.ISORetriever`) is the
    loaded curvature (to 6 significant digits: the ball stores it in float32).

    Args:
        in_dim: embedding size ``D``.
        out_dim: ball dimension.
        hidden: hidden width of the MLP (0 = none).
        c: curvature magnitude of the ball (``-c`` sectional curvature).

    Shape:
        ``(..., in_dim) -> (..., out_dim)``.

    Example:
        >>> f = PoincareProjection(8, 4, hidden=16)
        >>> bool((f(1e6 * torch.randn(5, 8)).norm(dim=-1) < 1).all())
        True
    """

    def __init__(self, in_dim: int, out_dim: int, *, hidden: int = 256, c: float = 1.0) -> None:
        super().__init__()
        self.in_dim = check_positive_int(in_dim, "in_dim")
        self.out_dim = check_positive_int(out_dim, "out_dim")
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 0:
            raise ValueError(f"hidden must be a non-negative integer, got {hidden!r}")
        if not float(c) > 0:
            raise ValueError(f"c must be positive, got {c!r}")
        self.hidden = hidden
        self.c = float(c)
        self.ball = geoopt.PoincareBall(c=self.c)
        if hidden:
            self.mlp = nn.Sequential(nn.Linear(in_dim, hidden), nn.GELU(), nn.Linear(hidden, out_dim))
        else:
            self.mlp = nn.Linear(in_dim, out_dim)
        self.register_load_state_dict_post_hook(_curvature_after_load)

    def forward(self, h: Tensor) -> Tensor:
        if not isinstance(h, Tensor) or h.shape[-1] != self.in_dim:
            raise ValueError(f"input must end in dimension {self.in_dim}, got {tuple(getattr(h, 'shape', ()))}")
        return self.ball.projx(self.ball.expmap0(self.mlp(h)))

    def distance(self, x: Tensor, y: Tensor) -> Tensor:
        """Poincare distance (geoopt ``dist``) along the last dimension."""
        return self.ball.dist(x, y)

    def config(self) -> dict:
        return {"in_dim": self.in_dim, "out_dim": self.out_dim, "hidden": self.hidden, "c": self.c}

    def save(self, path: str | Path) -> Path:
        """Write the configuration and weights to one file (``torch.save``), atomically.

        The file is written under a temporary name in the same directory and renamed into
        place: a save killed half-way leaves the previous file (or none), never a partial one.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_torch_save(
            {"kind": "PoincareProjection", "format": _FORMAT, "config": self.config(), "state_dict": self.state_dict()},
            path,
        )
        return path

    @classmethod
    def load(
        cls, path: str | Path, *, map_location: str | None = "cpu", in_dim: int | None = None
    ) -> PoincareProjection:
        """Read a file written by :meth:`save` (or exported by the training CLI).

        Args:
            path: the file.
            map_location: where to put the weights.
            in_dim: the embedding size the projection must take (the corpus's ``D``), if known.

        Raises:
            ValueError: one line naming the file: truncated or unreadable, not a saved
                projection, another format version, weights that do not fit its
                configuration, or an input size other than ``in_dim``.
        """
        blob = read_torch(path, map_location)
        if not isinstance(blob, dict) or blob.get("kind") != "PoincareProjection":
            raise ValueError(f"{path} is not a saved PoincareProjection")
        fmt = blob.get("format", 1)  # files written before the format was recorded are format 1
        if fmt != _FORMAT:
            raise ValueError(f"{path}: PoincareProjection format {fmt!r}, this geograph reads format {_FORMAT}")
        try:
            model = cls(**blob["config"])
            model.load_state_dict(blob["state_dict"])
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"{path}: the weights do not fit the saved configuration ({one_line(exc)})") from None
        if in_dim is not None and model.in_dim != in_dim:
            raise ValueError(f"{path}: the projection takes {model.in_dim}-dimensional inputs, the corpus has {in_dim}")
        return model.eval()

    def extra_repr(self) -> str:
        return f"in_dim={self.in_dim}, out_dim={self.out_dim}, hidden={self.hidden}, c={self.c}"


class IdentityPoincare(nn.Module):
    r"""The untrained default signal: ``z = exp_0(h)``, the raw embedding mapped into the ball.

    For unit-norm embeddings every ``|z| = tanh(1)``, so every node gets the same conformal
    volume and ISO-RAG's ratio ``phi`` becomes purely combinatorial (ball and shell sizes).
    """

    def __init__(self, c: float = 1.0) -> None:
        super().__init__()
        self.c = float(c)
        self.ball = geoopt.PoincareBall(c=self.c)
        self.register_load_state_dict_post_hook(_curvature_after_load)

    def forward(self, h: Tensor) -> Tensor:
        return self.ball.projx(self.ball.expmap0(h))


def _curvature_after_load(module: nn.Module, incompatible_keys) -> None:
    """``load_state_dict`` post hook: ``c`` follows the ball's curvature, which the state carries.

    The ball holds ``c`` in float32 (0.5 comes back as 0.49999997): a value within float32
    rounding of the current ``c`` keeps it, another is read to 6 significant digits.
    """
    loaded = float(module.ball.c)
    if abs(loaded - module.c) > 1e-6 * max(abs(module.c), 1e-30):
        module.c = float(f"{loaded:.6g}")
