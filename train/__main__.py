"""``python -m train fit --config configs/iso_poincare.yaml`` from the repository root: the CLI of
:mod:`geograph.train` (``python -m geograph.train`` anywhere)."""

from geograph.train.__main__ import ProjectionCLI, main  # noqa: F401

if __name__ == "__main__":
    main()
