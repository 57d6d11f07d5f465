"""Input validation shared by the functional ops and the modules.

Every public entry point validates early and raises ``ValueError`` with the name and
shape of the offending argument, so that bad input never turns into NaN downstream.

Under ``torch.compile`` / ``torch.export`` (:func:`tracing`) the checks on *values* (NaN/inf)
are skipped, since each is a host synchronisation and a graph break; shape, rank and dtype
checks still run (they are static). A server that compiles a module validates its inputs
before the call (``geograph serve`` does, in the request schema).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import overload

import torch
from torch import Tensor


def tracing() -> bool:
    """True while torch.compile / torch.export traces the code (value checks are skipped)."""
    return torch.compiler.is_compiling()


def check_tensor(x: Tensor, name: str, ndim: int, *, finite: bool = True) -> None:
    """Raise unless ``x`` is a floating tensor of rank ``ndim`` (with only finite values)."""
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating tensor, got dtype {x.dtype}")
    if finite and not tracing() and not bool(torch.isfinite(x.sum())) and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} of shape {tuple(x.shape)} contains NaN or inf")


@overload
def check_mask(mask: Tensor, shape: Sequence[int], name: str = ...) -> Tensor: ...
@overload
def check_mask(mask: None, shape: Sequence[int], name: str = ...) -> None: ...
@overload
def check_mask(mask: Tensor | None, shape: Sequence[int], name: str = ...) -> Tensor | None: ...
def check_mask(mask: Tensor | None, shape: Sequence[int], name: str = "mask") -> Tensor | None:
    """Return ``mask`` as a bool tensor of ``shape``, or raise naming both shapes."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(mask.shape)}")
    return mask.bool()


def check_finite_where(x: Tensor, mask: Tensor | None, name: str) -> None:
    """Raise if ``x`` has NaN/inf in a row that ``mask`` (over the leading dims) marks real."""
    if tracing():
        return
    if bool(torch.isfinite(x.sum())):  # one reduction: the common, all-finite case
        return
    bad = ~torch.isfinite(x)
    if mask is not None:
        bad = bad & mask.reshape(*mask.shape, *([1] * (x.dim() - mask.dim())))
    if bool(bad.any()):
        raise ValueError(f"{name} of shape {tuple(x.shape)} contains NaN or inf at unmasked positions")


def check_positive_int(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_bool(value: bool, name: str) -> bool:
    """``value`` if it is a bool, else raise naming ``name`` (``1`` or ``"yes"`` are not flags)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def check_unit_interval(value: float, name: str) -> float:
    value = check_finite_float(value, name)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    return float(value)


def check_finite_float(value: float, name: str) -> float:
    """``value`` as a finite float, or raise naming ``name`` (NaN, inf, bools and strings)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    out = float(value)
    if out != out or out in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return out


def check_same_device(x: Tensor | None, name: str, device: torch.device, owner: str = "the module") -> None:
    """Raise if ``x`` is not on ``device`` (one device per call), naming both devices."""
    if isinstance(x, Tensor) and x.device != device:
        raise ValueError(f"{name} is on {x.device} but {owner} is on {device}: move one of them with .to() first")


def check_candidates(query: Tensor, docs: Tensor, mask: Tensor | None) -> Tensor | None:
    """Validate a padded candidate batch ``query (B, D)``, ``docs (B, N, D)``, ``mask (B, N)``:
    ranks, matching ``B`` and ``D``, one dtype, one device, finite query and finite real
    candidates. Returns ``mask`` as bool (``None`` stays ``None``)."""
    check_tensor(query, "query", 2)
    check_tensor(docs, "docs", 3, finite=False)
    if docs.shape[0] != query.shape[0] or docs.shape[2] != query.shape[1]:
        raise ValueError(
            f"docs must have shape (B={query.shape[0]}, N, D={query.shape[1]}) to match "
            f"query {tuple(query.shape)}, got {tuple(docs.shape)}"
        )
    if docs.dtype != query.dtype:
        raise ValueError(f"docs must have the dtype of query ({query.dtype}), got {docs.dtype}")
    check_same_device(docs, "docs", query.device, "query")
    check_same_device(mask, "mask", query.device, "query")
    mask = check_mask(mask, docs.shape[:2], "mask")
    check_finite_where(docs, mask, "docs")
    return mask


def check_percentile(percentile: float) -> float:
    """``percentile`` as a float in ``[0, 100]``, or raise."""
    percentile = check_finite_float(percentile, "percentile")
    if not 0.0 <= percentile <= 100.0:
        raise ValueError(f"percentile must lie in [0, 100], got {percentile!r}")
    return float(percentile)


def check_cert_tol(cert_tol: float | None) -> float | None:
    """``None``, or ``cert_tol`` as a finite float ``>= 0``, or raise."""
    if cert_tol is None:
        return None
    if (
        isinstance(cert_tol, bool)
        or not isinstance(cert_tol, (int, float))
        or not (cert_tol >= 0 and math.isfinite(cert_tol))
    ):
        raise ValueError(f"cert_tol must be None or a finite number >= 0, got {cert_tol!r}")
    return float(cert_tol)
