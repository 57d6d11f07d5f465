"""GraphRicciCurvature 0.6.1's numerical thresholds: their one home.

Read by the torch path (:mod:`geograph.transport.curvature`) and the compiled exact path
(:mod:`geograph.transport._numba.ricci`), so that both follow the reference's rules.
"""

#: a neighbour weight sum at or below this falls back to the uniform measure
WEIGHT_SUM_EPS = 1e-7
#: an edge whose endpoints are closer than this gets curvature 0 (the reference divides by it)
DIST_EPS = 1e-7
