"""Helpers for tests of geograph and of code built on it (importable without pytest)."""

from __future__ import annotations

import importlib.util

import torch

#: Tolerances per dtype for ``torch.testing.assert_close`` comparisons against references.
TOLERANCES = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float64: {"atol": 1e-6, "rtol": 0.0},
}


def devices() -> list[str]:
    """``["cpu"]`` plus ``"cuda"`` when a CUDA device is visible."""
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def has_package(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it."""
    return importlib.util.find_spec(name) is not None
