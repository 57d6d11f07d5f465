"""Encoders: ISO-RAG's hyperbolic projection f_theta onto the Poincare ball (geoopt)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch  # noqa: F401 - the doctests run in this namespace
from torch import Tensor, nn

from geograph._checks import check_positive_int
from geograph._io import one_line, read_torch
from geograph.artefacts.format import read_artefact, resolve_source, write_artefact
from geograph.artefacts.identity import CorpusFingerprint, corpus_fingerprint, recorded_identity
from geograph.geometry.isoperimetric import conformal_volume  # its home; re-exported here

__all__ = ["PoincareProjection", "IdentityPoincare", "conformal_volume"]


def _ball(c: float) -> Any:
    """geoopt's Poincare ball of curvature ``-c``, imported on first use: importing geoopt (which
    imports scipy.optimize) costs more than a second, paid otherwise by every process that imports
    geograph, servers and CLI commands that never project."""
    import geoopt

    return geoopt.PoincareBall(c=c)


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

    manifest: dict[str, Any]  # what the artefact it was loaded from recorded (set by from_pretrained)

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
        self.ball = _ball(self.c)
        self.mlp: nn.Module
        if hidden:
            self.mlp = nn.Sequential(nn.Linear(in_dim, hidden), nn.GELU(), nn.Linear(hidden, out_dim))
        else:
            self.mlp = nn.Linear(in_dim, out_dim)
        self.register_load_state_dict_post_hook(_curvature_after_load)  # type: ignore[no-untyped-call]  # unannotated in torch

    def forward(self, h: Tensor) -> Tensor:
        if not isinstance(h, Tensor) or h.shape[-1] != self.in_dim:
            raise ValueError(f"input must end in dimension {self.in_dim}, got {tuple(getattr(h, 'shape', ()))}")
        z: Tensor = self.ball.projx(self.ball.expmap0(self.mlp(h)))  # geoopt is untyped
        return z

    def distance(self, x: Tensor, y: Tensor) -> Tensor:
        """Poincare distance (geoopt ``dist``) along the last dimension."""
        d: Tensor = self.ball.dist(x, y)  # geoopt is untyped
        return d

    def config(self) -> dict[str, Any]:
        return {"in_dim": self.in_dim, "out_dim": self.out_dim, "hidden": self.hidden, "c": self.c}

    def save_pretrained(
        self, directory: str | Path, *, encoder: Any = None, corpus: Tensor | CorpusFingerprint | None = None
    ) -> Path:
        """Write the configuration and weights as an artefact directory (:mod:`geograph.artefacts`).

        ``encoder`` (a :class:`geograph.data.Encoder` or an
        :class:`~geograph.artefacts.EncoderIdentity`) and ``corpus`` (the embeddings, or the
        :class:`~geograph.artefacts.CorpusFingerprint`, it was trained on) are recorded in the
        manifest; a projection loaded by :meth:`from_pretrained` keeps what it recorded. Written
        atomically: the manifest is removed first and written last.
        """
        saved = getattr(self, "manifest", None) or {}
        identity = recorded_identity(encoder, self.in_dim, saved)
        if isinstance(corpus, Tensor):
            corpus = corpus_fingerprint(corpus)
        elif corpus is None and saved.get("corpus"):
            corpus = CorpusFingerprint.from_dict(saved["corpus"])
        state = {k: v.detach() for k, v in self.state_dict().items()}
        return write_artefact(
            directory, "PoincareProjection", state, params=self.config(), encoder=identity, corpus=corpus
        )

    @classmethod
    def from_pretrained(
        cls,
        source: str | Path,
        *,
        encoder: Any = None,
        corpus: Tensor | None = None,
        map_location: str | None = "cpu",
        in_dim: int | None = None,
    ) -> PoincareProjection:
        """Load a projection saved by :meth:`save_pretrained` (a directory or a Hugging Face Hub id).

        Args:
            source: the directory or hub id; a file in the former ``torch.save`` format loads with
                a ``DeprecationWarning``.
            encoder: the encoder in use: a projection trained on another model's vectors is refused.
            corpus: the corpus in use (``(V, D)`` embeddings): its ``D`` must be the input size.
            map_location: where to put the weights.
            in_dim: the embedding size the projection must take, if known.

        Raises:
            ValueError: one line naming the file: unreadable or truncated, not a saved projection,
                weights that do not fit its configuration, or another input size.
            geograph.artefacts.ArtefactMismatch: another format version or encoder.
        """
        path = resolve_source(source, cls.__name__)
        if isinstance(corpus, Tensor) and in_dim is None:
            in_dim = int(corpus.shape[-1])
        if path.is_file():
            model = _load_v1(cls, path, map_location)
            warnings.warn(
                f"{path}: a PoincareProjection saved in the former torch.save format; it loads, but re-save it "
                "with PoincareProjection.from_pretrained(path).save_pretrained(new_dir)",
                DeprecationWarning,
                stacklevel=2,
            )
            model.manifest = {}
        else:
            art = read_artefact(path, "PoincareProjection", encoder=encoder)
            try:
                model = cls(**art.params)
                model.load_state_dict(art.tensors)
            except (KeyError, TypeError, ValueError, RuntimeError) as exc:
                raise ValueError(f"{path}: the weights do not fit the saved configuration ({one_line(exc)})") from None
            model.manifest = {**art.manifest, "source": str(path)}
            if map_location is not None:
                model = model.to(map_location)
        if in_dim is not None and model.in_dim != in_dim:
            raise ValueError(f"{path}: the projection takes {model.in_dim}-dimensional inputs, the corpus has {in_dim}")
        return model.eval()

    def save(self, path: str | Path) -> Path:
        """:meth:`save_pretrained` without provenance (``path`` becomes a directory)."""
        return self.save_pretrained(path)

    @classmethod
    def load(
        cls, path: str | Path, *, map_location: str | None = "cpu", in_dim: int | None = None
    ) -> PoincareProjection:
        """:meth:`from_pretrained` without the encoder check."""
        return cls.from_pretrained(path, map_location=map_location, in_dim=in_dim)

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
        self.ball = _ball(self.c)
        self.register_load_state_dict_post_hook(_curvature_after_load)  # type: ignore[no-untyped-call]  # unannotated in torch

    def forward(self, h: Tensor) -> Tensor:
        z: Tensor = self.ball.projx(self.ball.expmap0(h))  # geoopt is untyped
        return z


def _load_v1(cls: type[PoincareProjection], path: Path, map_location: str | None) -> PoincareProjection:
    """A projection from a former ``torch.save`` file (read with ``weights_only=True``: tensors only)."""
    blob = read_torch(path, map_location)
    if not isinstance(blob, dict) or blob.get("kind") != "PoincareProjection":
        raise ValueError(f"{path} is not a saved PoincareProjection")
    fmt = blob.get("format", 1)  # files written before the format was recorded are format 1
    if fmt != 1:
        raise ValueError(f"{path}: PoincareProjection format {fmt!r}, this geograph reads format 1 files")
    try:
        model = cls(**blob["config"])
        model.load_state_dict(blob["state_dict"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{path}: the weights do not fit the saved configuration ({one_line(exc)})") from None
    return model


def _curvature_after_load(module: PoincareProjection | IdentityPoincare, incompatible_keys: object) -> None:
    """``load_state_dict`` post hook: ``c`` follows the ball's curvature, which the state carries.

    The ball holds ``c`` in float32 (0.5 comes back as 0.49999997): a value within float32
    rounding of the current ``c`` keeps it, another is read to 6 significant digits.
    """
    loaded = float(module.ball.c)
    if abs(loaded - module.c) > 1e-6 * max(abs(module.c), 1e-30):
        module.c = float(f"{loaded:.6g}")
