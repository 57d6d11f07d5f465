"""The source tree's name for :mod:`geograph.train` (f_theta training), kept so that
``python -m train fit --config configs/iso_poincare.yaml`` and ``class_path: train.module...`` in
the configs work from the repository root.

This folder is not installed (``[tool.setuptools.packages.find]`` in ``pyproject.toml`` takes
only ``geograph*``), so geograph claims no top-level ``train`` module in site-packages; the
installed command is ``python -m geograph.train fit ...``. ``train.data``, ``train.module`` and
``train.fit`` are the very module objects of ``geograph.train`` (no second copy of any class).
"""

import sys

from geograph.train import *  # noqa: F401,F403
from geograph.train import __all__, data, fit, module  # noqa: F401

for _name, _module in (("data", data), ("module", module), ("fit", fit)):
    sys.modules[f"{__name__}.{_name}"] = _module
del _name, _module
