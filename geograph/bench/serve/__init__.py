"""``geograph bench serve``: closed-loop load on ``geograph serve`` over HTTP, against the encoder's limit.

It starts a server on 127.0.0.1 (``--method``, ``--corpus``; extra server flags with
``--server-arg``) or targets one (``--url``), and measures, in one run on one machine:

* **limit**: the encoder's batched texts/s (all-MiniLM-L6-v2 or ``--encoder``, batches of 64,
  this process, before the server starts; median of ``--repeat`` passes over distinct texts,
  with one torch thread and with all CPUs: the better);
* **text**: ``--text-requests`` ``/retrieve`` requests, each with a distinct query text, from
  ``--clients`` closed-loop clients: req/s, and req/s as a share of the limit (one text per
  request, so the encoder bounds it);
* **CPU**: for each measured phase, the machine's CPU by part (the clients, i.e. this process;
  the HTTP front; the workers' encoding and the rest of their time; the server's other
  processes; other programs) as shares of its wall seconds times the usable CPUs. The clients
  share the cores with the server, so they are kept cheap (one asyncio loop, keep-alive
  connections, bodies serialised before the clock starts, answers parsed after it stops) and
  their share is printed;
* **mixed**: ``--requests`` requests mixing ``/retrieve`` with a query text, ``/retrieve``
  with a query vector, ``/rerank`` with candidate texts, ``/rerank`` with candidate ids (the
  last two for rerankers): req/s and p50 / p99 per kind and overall;
* **soak** (``--soak N``): N mixed requests drawn from a pool of requests whose answers were
  first fetched one at a time; after a warm-up pass the resident memory (RSS) of every server
  process before and after, wrong answers (ids or order differ, or a score by more than 1e-6),
  5xx. Needs a server this command started (RSS is read from its process tree). With a
  server whose ``--text-cache-size`` is below the pool's texts, texts are encoded again under
  load (in groups with other requests' texts) and checked against their answers alone.

Targets: p99 <= 4 x p50 (mixed), text req/s >= 50% of the limit, and in the soak
RSS growth <= 50 MB per process, 0 wrong answers, 0 5xx. Prints a table and writes
``<out>/serve.json``; exits 1 when a request is not answered with 200, or a soak finds a wrong
answer.
"""

# One job per module: workload (the requests), load (closed-loop clients, latency summary), process
# (the server subprocess), limit (the encoder's texts/s), cpu (where the machine's CPU went), soak
# (answers under load against alone), cli (the command).

from __future__ import annotations

from geograph.bench.serve.cli import check_args, main, parser
from geograph.bench.serve.limit import encoder_limit
from geograph.bench.serve.load import closed_loop, quantile, summarise
from geograph.bench.serve.process import Server, wait_healthy
from geograph.bench.serve.soak import SCORE_TOL, same_answer, soak
from geograph.bench.serve.workload import KINDS, Workload

__all__ = [
    "main",
    "parser",
    "check_args",
    "KINDS",
    "Workload",
    "closed_loop",
    "quantile",
    "summarise",
    "Server",
    "wait_healthy",
    "encoder_limit",
    "SCORE_TOL",
    "same_answer",
    "soak",
]
