"""The optimal-transport engine: W1 between lazy random-walk measures, Ollivier-Ricci curvature
and the normalized discrete Ricci flow.

:mod:`~geograph.transport.solvers` holds the batched solvers (log-domain Sinkhorn with its
certificate, the exact simplex through the compiled kernels, the transport bounds) and
:class:`~geograph.transport.solvers.SinkhornOptions` (the curvature's and the flow's Sinkhorn options
and their defaults, handed down as one object),
:mod:`~geograph.transport.curvature` Ollivier-Ricci curvature on padded graph batches and
:mod:`~geograph.transport.flow` the Ricci flow; the numba kernels are the private subpackage
``geograph.transport._numba``. The engine depends on no method and not on the k-NN engine (an
import contract in ``pyproject.toml``).
"""

from geograph.transport.curvature import lazy_measures, ollivier_ricci
from geograph.transport.flow import RicciFlowOutput, SimplexStats, exact_flow_stats, ricci_flow
from geograph.transport.solvers import SinkhornOptions, SinkhornOutput, TransportBounds, emd, sinkhorn, transport_bounds

__all__ = [
    "sinkhorn",
    "SinkhornOutput",
    "SinkhornOptions",
    "emd",
    "transport_bounds",
    "TransportBounds",
    "lazy_measures",
    "ollivier_ricci",
    "ricci_flow",
    "RicciFlowOutput",
    "exact_flow_stats",
    "SimplexStats",
]
