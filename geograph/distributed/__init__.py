"""Past one machine: corpus embedding on Ray Data and corpus graphs on Ray tasks (the ``ray`` extra).

Importing this package does not import Ray; the functions do, when called. See docs/ray.md
for the workflow on a cluster.
"""

from geograph.distributed.builds import g3_graph, knn_graph, on_ray
from geograph.distributed.cluster import LOCAL, RayExecutor, ray_session
from geograph.distributed.embed import EmbedReport, embed_corpus

__all__ = ["ray_session", "RayExecutor", "LOCAL", "on_ray", "knn_graph", "g3_graph", "embed_corpus", "EmbedReport"]
