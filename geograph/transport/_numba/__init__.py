"""The optimal-transport engine's compiled kernels (private): the numba runtime (cache, lock,
threads), the exact transport simplex and the Ricci curvature and flow drivers built on it.

Importing this package compiles nothing; a kernel compiles (or loads from the cache) when its
module is first imported.
"""
