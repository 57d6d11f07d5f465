"""``geograph serve``: an HTTP reranking / retrieval server on LitServe with dynamic batching.

::

    geograph serve --method maniscope --corpus DIR [--config serve.yaml] [--port 8000] [--param k=5] ...

``DIR`` is a BEIR-format folder (``corpus.jsonl``); its passages are embedded once through
the on-disk cache (query and candidate texts never are). Settings come from a YAML file
(``--config``, see ``configs/serve.yaml``) and flags that override it; method parameters go
under ``params`` or ``--param KEY=VALUE``. Endpoints (the schema: docs/serving.md):

* ``POST /rerank`` (maniscope, ricci): a query (text or embedding) and candidates (texts,
  embeddings or corpus ids), optional ``top_n`` -> positions best first with scores, and the
  positions Ricci-Filtration dropped;
* ``POST /retrieve``: a query and ``k`` -> corpus ids with scores (the rerankers rerank the
  request's own dense pool of ``candidates``, default ``--candidates``);
* ``POST /v2/rerank`` (Cohere v2) and ``POST /v1/rerank`` (Cohere v1, Jina), rerankers only: the
  de facto rerank API over the ``/rerank`` handler (:mod:`~geograph.serve.interop`);
* ``GET /health``: ``ok`` once the workers are up (Ricci-Filtration's with its numba kernels
  compiled); ``GET /metrics``: Prometheus text format.

With an API key (``--api-key`` or ``$GEOGRAPH_API_KEY``) every endpoint but ``/health`` needs
``Authorization: Bearer <key>`` (:mod:`~geograph.serve.auth`; ``public`` opens ``/metrics``, ``/docs``),
and ``POST /admin/reload`` serves the saved corpus and graph anew without downtime
(:mod:`~geograph.serve.reload`; without a key the route does not exist).

Every endpoint's requests go to one queue that one pool of inference workers serves
(:mod:`~geograph.serve.api`). A response depends only on its own request and the configuration,
never on its batch-mates.
A request unanswered after ``request_timeout`` seconds gets 504. SIGTERM/SIGINT stop every
process the server started, quietly (status 0); an inference worker that dies stops the server
with status 1, for its supervisor to restart it.

Package layout, one job per file: :mod:`~geograph.serve.schema` (request validation),
:mod:`~geograph.serve.config` (config file and flags), :mod:`~geograph.serve.corpus` (corpus
and text encoders), :mod:`~geograph.serve.models` (module factory and artefacts),
:mod:`~geograph.serve.api` (the LitServe worker), :mod:`~geograph.serve.interop` (``/v1``,
``/v2/rerank``), :mod:`~geograph.serve.auth` (the API key), :mod:`~geograph.serve.prometheus`
(``/metrics``), :mod:`~geograph.serve.middleware` (deadline, JSON-only, 422 bodies),
:mod:`~geograph.serve.pool` (workers and threads for ``auto``), :mod:`~geograph.serve.reload`
(``POST /admin/reload``), :mod:`~geograph.serve.lifecycle`
(signals, worker monitor, stop), :mod:`~geograph.serve.server` (build, run),
:mod:`~geograph.serve._litserve` (every override and use of LitServe's internals),
:mod:`~geograph.serve.cli` (the command).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from geograph._lazy import lazy_getattr

if TYPE_CHECKING:
    from geograph.serve.cli import main
    from geograph.serve.models import METHODS, RERANKERS, build_model

__all__ = ["main", "METHODS", "RERANKERS", "build_model"]

#: where each exported name lives: imported on first use, so that a process that needs only a
#: part of the server (LitServe's logger process unpickles :mod:`geograph.serve.prometheus`'s
#: logger) loads no torch and no method
_HOMES = {
    "main": "geograph.serve.cli",
    "METHODS": "geograph.serve.models",
    "RERANKERS": "geograph.serve.models",
    "build_model": "geograph.serve.models",
}
__getattr__ = lazy_getattr(__name__, _HOMES, globals())
