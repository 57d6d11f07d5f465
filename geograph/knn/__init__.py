"""The k-NN engine: corpus-wide top-k lists under every corpus-scale computation.

One tiled all-pairs routine (:mod:`~geograph.knn.allpairs`) scores row blocks against column
blocks and keeps partial top-k lists; :func:`~geograph.knn.build.self_topk` builds a corpus's
lists by the exact scan (:mod:`~geograph.knn.exact`) or the IVF cell join
(:mod:`~geograph.knn.ivf_join`), sized by :mod:`~geograph.knn.policy`, checked by
:mod:`~geograph.knn.ivf_recall` and refined by :mod:`~geograph.knn.nn_descent`;
:mod:`~geograph.knn.update` keeps the lists current as passages are added and removed, and
:mod:`~geograph.knn.faiss_ivf` holds faiss (the join's k-means cells and the dense index).

The engine depends on no method and not on the optimal-transport engine (an import contract in
``pyproject.toml``); a method passes its own pair score in as a transform.
"""

from geograph.knn.allpairs import tiled_pairs, tiled_topk
from geograph.knn.build import self_topk
from geograph.knn.policy import IVFOptions, IVFReport, SelfTopk
from geograph.knn.update import ListsChange, TopkLists, lists_add, lists_edges, lists_remove, topk_lists

__all__ = [
    "tiled_pairs",
    "tiled_topk",
    "self_topk",
    "IVFOptions",
    "IVFReport",
    "SelfTopk",
    "TopkLists",
    "ListsChange",
    "topk_lists",
    "lists_add",
    "lists_remove",
    "lists_edges",
]
