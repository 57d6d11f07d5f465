"""The configs shipped with geograph (package data), named by their path under this folder.

``iso_poincare`` (f_theta training: ``python -m geograph.train fit --config iso_poincare``),
``serve`` (``geograph serve``), ``bench/default`` and ``bench/smoke`` (``geograph bench run``).
A ``--config`` of the training and benchmark commands takes a file or one of these names;
``configs/<name>.yaml`` as written in the docs finds the shipped file from any directory.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["HERE", "names", "resolve"]

#: the folder of the shipped configs
HERE = Path(__file__).resolve().parent


def names() -> list[str]:
    """The shipped configs' names: their paths under :data:`HERE` without ``.yaml``, sorted."""
    return sorted(p.relative_to(HERE).with_suffix("").as_posix() for p in HERE.rglob("*.yaml"))


def resolve(value: str | Path) -> Path:
    """A ``--config`` value as a file: an existing file as given, else the shipped config it names.

    ``"iso_poincare"``, ``"iso_poincare.yaml"`` and ``"configs/iso_poincare.yaml"`` (the
    source tree's path, when no such file is under the working directory) all name the shipped
    ``iso_poincare.yaml``.

    Raises:
        ValueError: neither a file nor a shipped config's name (the message lists the names).

    Example:
        >>> resolve("bench/smoke").name
        'smoke.yaml'
    """
    path = Path(value)
    if path.is_file():
        return path
    name = path.as_posix().removesuffix(".yaml")
    name = name.removeprefix("configs/")
    if name in names():
        return HERE / f"{name}.yaml"
    raise ValueError(f"--config {value}: no such file, and not a shipped config ({', '.join(names())})")
