"""The LitServe worker of ``geograph serve``: one pool of workers for every endpoint, one padded,
masked module call per endpoint and batch.

One queue, one pool: ``/retrieve`` and ``/rerank`` (and the interop routes, which join
``/rerank``) put their requests on one queue that one pool of inference workers serves, first
come first served, and a batch may hold both kinds (each kind is one module call). With a pool
per endpoint the ``/retrieve`` workers idle while the ``/rerank`` queue grows; one pool of one
worker per core serves as many requests per second with a shorter tail (measured by
``geograph bench serve``: docs/serving.md, "Load and latency").

Per-request semantics: a response depends only on its own request and the server's
configuration. Every request brings its own candidate pool and ``k``; a batch of mixed
requests is padded to its largest pool and masked, and the modules treat padding as absent
(their ``mask`` contract), so the answer is the one the request would get alone. For the
corpus retrievers (ISO, G3), which take one ``k`` per call, the batch runs with its largest
``k`` and each request gets the first ``k`` of its row (top-k is a prefix of top-k').

Results are read back with one device-to-host transfer per endpoint and batch: everything a
response needs is packed into one tensor first.

Versions: a worker answers from one :class:`Served` (the corpus's ids and vectors, the module, the
dense index), read once per batch; ``POST /admin/reload`` (:mod:`geograph.serve.reload`) has each
worker build the next one in a thread and swap the reference between batches. Every answer
carries the ``version`` that computed it.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from geograph.serve._litserve import VersionConflict, logging_enabled
from geograph.serve.lifecycle import ParentGuard
from geograph.serve.models import KERNEL_METHODS, RERANKERS, build_model, k_bounds
from geograph.serve.schema import RerankRequest, RerankResponse, RetrieveRequest, RetrieveResponse

if TYPE_CHECKING:
    import numpy as np
    import torch
    from pydantic import BaseModel

    from geograph.serve.reload import Limits

try:
    import litserve as ls

    from geograph.serve._litserve import WaitingBatchedLoop
except ImportError:  # pragma: no cover - exercised only without the serve extra
    ls = None

#: LitServe's name of the server's one API: its queue and workers (``infer_0``, ``infer_1``, ...)
#: (a name internal to the server: not a route, the routes are :attr:`GeoAPI.routes`, and not shown
#: by ``GET /info``, :mod:`geograph.serve.info`)
API_PATH = "/infer"

#: the stages of a request's time in a worker, as ``/metrics`` reports them
#: (``geograph_stage_seconds{stage}``): waiting in the queue (arrival to the batch's start),
#: tokenising its texts, encoding them, the method's module call, and packing the answers
STAGES = ("queue", "tokenise", "encode", "method", "serialise")


def numba_threads(threads: int) -> int:
    """Cap this process's numba pool (the Ricci-Filtration kernels) at ``threads``, its torch share
    (numba starts one thread per core whatever the workers are: two workers on two cores would run
    four compute threads); the threads numba now runs."""
    import numba
    import torch

    before = torch.get_num_threads()  # numba's OpenMP layer, started here, sets the thread's OpenMP count
    numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))  # type: ignore[attr-defined]  # set by numba's config at import
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)
    return int(numba.get_num_threads())


@dataclass(frozen=True)
class Served:
    """What a worker answers from, swapped as a whole by a reload: the corpus's ids and embeddings,
    the module, the dense index of the rerankers, the bounds on ``k``, and the version's number
    (``corpus_version``: the saved graph's, ``None`` without a graph)."""

    version: int
    ids: list[str]
    index: dict[str, int]
    corpus: Any
    model: Any
    dense: Any
    k_min: int
    k_max: int | None
    k_max_reason: str
    corpus_version: int | None

    def with_version(self, version: int) -> Served:
        return replace(self, version=version)

    def limits(self) -> Limits:
        """The request limits of this version (:class:`geograph.serve.reload.Limits`)."""
        from geograph.serve.reload import Limits

        return Limits(list(self.ids), self.k_min, self.k_max, self.k_max_reason, self.corpus_version)

    def conflict(self, r: object, method: str) -> str | None:
        """Why this version cannot answer ``r`` (a request checked against another version's
        limits), naming the field; ``None`` when it can (always, without a reload)."""
        if isinstance(r, RerankRequest):
            unknown = [x for x in r.candidate_ids or () if x not in self.index]
            return f"candidate_ids: unknown ids {unknown[:5]}" if unknown else None
        if not isinstance(r, RetrieveRequest):
            return None
        if method in RERANKERS:
            pool = r.pool()
            return f"candidates: {pool} exceeds the corpus size {len(self.ids)}" if pool > len(self.ids) else None
        if r.k < self.k_min or (self.k_max is not None and r.k > self.k_max):
            return f"k: {r.k} is outside [{self.k_min}, {self.k_max}] ({self.k_max_reason or method})"
        return None


class GeoAPI(ls.LitAPI if ls is not None else object):  # type: ignore[misc]  # litserve is untyped
    """Every endpoint of one method (``/retrieve``, and ``/rerank`` for the rerankers) in one
    LitServe API: one request queue, one pool of workers; a batch may mix the endpoints.

    ``setup`` (in the worker process) embeds the corpus through the on-disk cache, builds
    the module (or loads its artefacts) and the text encoder, and for Ricci-Filtration compiles
    the numba kernels (:func:`geograph.functional.warmup`), all before LitServe marks the worker
    ready (``/health`` says ``ok`` only then); ``predict`` answers a batch. ``load`` builds what a
    version serves (at start and on each reload).

    Args:
        settings: the server configuration as a dict (see :class:`geograph.serve.config.ServeConfig`).
    """

    def __init__(self, settings: dict[str, Any]) -> None:
        super().__init__(
            max_batch_size=settings["max_batch_size"],
            batch_timeout=settings["batch_timeout"],
            api_path=API_PATH,
            loop=WaitingBatchedLoop(),
        )
        self.settings = dict(settings)
        self.method = settings["method"]
        #: a worker gets SIGTERM when the main process dies, as soon as it unpickles this API
        #: (geograph.serve.lifecycle: no process outlives the main process)
        self.parent_guard = ParentGuard(signal.SIGTERM)
        self.max_batch_texts = settings.get("max_batch_texts")  # None: batches are bounded by count only
        #: a batch's padded size (requests x their largest candidate count) stays within this (None: no bound)
        self.max_batch_candidates = settings.get("max_batch_candidates")
        #: a batch's padded tokens to encode stay within this (None: no bound; a request over it runs alone)
        self.max_batch_tokens = settings.get("max_batch_tokens")
        #: route -> request model; the server registers one POST route for each
        self.routes: dict[str, type[BaseModel]] = {"/retrieve": RetrieveRequest}
        #: route -> response model (the 200 schema of the route in the OpenAPI document)
        self.responses: dict[str, type[BaseModel]] = {"/retrieve": RetrieveResponse}
        #: route -> its summary in the OpenAPI document
        self.summaries = {"/retrieve": "Retrieve the corpus passages for a query"}
        if self.method in RERANKERS:
            self.routes["/rerank"] = RerankRequest
            self.responses["/rerank"] = RerankResponse
            self.summaries["/rerank"] = "Rerank a query's candidates"

    def setup(self, device: str) -> None:
        import torch

        from geograph.serve.corpus import TextEncoder
        from geograph.serve.lifecycle import worker_signals

        worker_signals()
        s = self.settings
        self.device = torch.device(device)
        if self.device.type == "cpu" and s.get("worker_threads"):
            torch.set_num_threads(int(s["worker_threads"]))  # no more threads than cores (pool.worker_threads)
            if self.method in KERNEL_METHODS:
                numba_threads(int(s["worker_threads"]))  # the kernels' pool gets the same share
        self.encoder = TextEncoder(
            s["encoder"],
            query_prefix=s["query_prefix"],
            passage_prefix=s["passage_prefix"],
            cache=s["cache"],
            memory=s["text_cache_size"],
            max_chars=s.get("max_text_chars"),
            backend=s.get("encoder_backend", "torch"),
        )
        self.served = self.load(version=0)
        self.encoder.warm()  # the worker reports ready only once it can encode a request text
        if self.method in KERNEL_METHODS:
            self._warm_kernels()
        channel = getattr(self, "reload_channel", None)
        if channel is not None:  # POST /admin/reload (geograph.serve.reload): swapped by its thread
            from geograph.serve.reload import follow_reloads, worker_index

            follow_reloads(self, channel, worker_index())

    def load(self, version: int) -> Served:
        """The corpus, module and dense index read from the configured paths, as :class:`Served`
        ``version`` (at start and on every reload: the corpus embedded through the on-disk cache,
        the artefacts checked against it and the encoder)."""
        from geograph.retrievers import DenseRetriever
        from geograph.serve.corpus import read_corpus

        s = self.settings
        dataset = read_corpus(s["corpus"])
        corpus = self.encoder.corpus(dataset.passages()).to(self.device)
        n = len(dataset.doc_ids)
        if self.method in RERANKERS and s.get("candidates", 0) > n:
            raise ValueError(f"candidates: {s['candidates']} exceeds the corpus size {n}")
        model = build_model(
            self.method,
            corpus,
            s["params"],
            graph=s["graph"],
            projection=s["projection"],
            ids=dataset.doc_ids,
            encoder=self.encoder,  # its identity, and the agreement of its backend with the artefact's
        )
        if s["graph"] is not None:  # the saved graph, checked to be this corpus, is memory-mapped: its
            # embeddings are shared by the workers, not copied (nn.Module types the graph as Tensor | Module)
            corpus = model.graph.embeddings  # type: ignore[union-attr, assignment]
        k_min, k_max, why = k_bounds(self.method, model, n)
        return Served(
            version=version,
            ids=list(dataset.doc_ids),
            index={d: i for i, d in enumerate(dataset.doc_ids)},
            corpus=corpus,
            model=model,
            dense=DenseRetriever(corpus) if self.method in RERANKERS else None,
            k_min=k_min,
            k_max=k_max,
            k_max_reason=why,
            corpus_version=None if s["graph"] is None else int(getattr(model.graph, "corpus_version", 0)),
        )

    def _warm_kernels(self) -> None:
        """Compile (or load from the cache) the numba kernels before the worker reports ready,
        so the first request does not pay for them (seconds without a cache); one line says so."""
        import os
        import sys

        import torch

        from geograph.functional import warmup

        info = warmup()
        print(
            f"geograph serve: worker (pid {os.getpid()}): numba kernels ready in {info['seconds']:.1f} s "
            f"(cache: {info['source']} {info['directory']}; threading layer {info['threading_layer']}, "
            f"{info['threads']} threads; torch {torch.get_num_threads()} threads)",
            file=sys.stderr,
            flush=True,
        )

    def request_tokens(self, body: Any) -> int:
        """Padded tokens (:meth:`~geograph.serve.corpus.TextEncoder.padded_tokens`) the texts of a
        queued request (a validated request) bring to its batch's encoding; the tokens are kept
        for the encoding. Never raises (it runs in the batch loop): anything unreadable counts 0."""
        try:
            if isinstance(body, RerankRequest):
                texts = self.encoder.request_texts(body.query, body.candidates, body.max_tokens_per_doc)
            elif isinstance(body, RetrieveRequest):
                texts = self.encoder.request_texts(body.query, None, None)
            else:
                return 0
            return self.encoder.padded_tokens(texts)
        except Exception:  # noqa: BLE001 - the request's own answer reports what is wrong with it
            return 0

    # LitServe hooks -----------------------------------------------------------------------
    def batch(self, inputs: Iterable[Any]) -> list[Any]:
        return list(inputs)

    def unbatch(self, output: list[Any]) -> list[Any]:
        return output

    # (type comments: LitServe reads these two hooks' annotations as the request and response types)
    def encode_response(self, output):  # type: (Any) -> Any
        return output

    def decode_request(self, request):  # type: (Any) -> Any
        return request

    def predict(self, reqs: Sequence[RetrieveRequest | RerankRequest]) -> list[Any]:
        """Answers to a batch of validated requests, in order: the ``/retrieve`` ones in one module
        call, the ``/rerank`` ones in another (each answer says its own part's ``batch_size`` and
        the ``version`` that computed it).

        The served state is read once, here: a reload swaps it between batches, never within one
        (:mod:`geograph.serve.reload`). A request that the served version cannot take (checked
        against an older corpus) is answered with a :class:`VersionConflict` marker (a 409)."""
        import torch

        served = self.served
        out: list[Any] = [None] * len(reqs)
        parts: dict[str, list[int]] = {"retrieve": [], "rerank": []}
        for i, r in enumerate(reqs):
            problem = served.conflict(r, self.method)
            if problem is not None:
                out[i] = VersionConflict(f"{problem} (in corpus version {served.version}: the corpus was reloaded)")
            else:
                parts["rerank" if isinstance(r, RerankRequest) else "retrieve"].append(i)
        logging = logging_enabled(self)
        # the tokenizing the batch loop did (request_tokens: the texts it counted), which the
        # whole batch waited for
        counted, self.encoder.timings["tokenise"] = self.encoder.timings["tokenise"], 0.0
        with torch.inference_mode():
            for endpoint, rows in parts.items():
                if not rows:
                    continue
                run = self._retrieve if endpoint == "retrieve" else self._rerank
                self.stages = dict.fromkeys(STAGES, 0.0)
                self.encoder.timings.update(tokenise=0.0, encode=0.0)
                for i, answer in zip(rows, run(served, [reqs[i] for i in rows])):
                    answer["version"] = served.version
                    out[i] = answer
                self._stage(None)
                if logging:
                    self.log("batch", (endpoint, len(rows)))
                    self.stages.update(self.encoder.timings)
                    self.stages["tokenise"] += counted
                    waits = getattr(self.loop, "waits", {})
                    queued = [waits.get(id(reqs[i]), 0.0) for i in rows]
                    self.log("stages", (endpoint, self.stages, queued))
        self.encoder.timings["tokenise"] = 0.0  # what the loop tokenizes next counts for the next batch
        return out

    # ---------------------------------------------------------------------------------------
    def _stage(self, name: str | None) -> Callable[[str | None], Any]:
        """End the stage being timed (if any) and start timing ``name`` (``None``: none) in
        :attr:`stages`; returns this method, to mark the next stage (the last one runs until
        :meth:`predict` has every answer of the part)."""
        import time

        now = time.perf_counter()
        running = getattr(self, "_running", None)
        stages = getattr(self, "stages", None)
        if running is not None and stages is not None:
            stages[running[0]] = stages.get(running[0], 0.0) + now - running[1]
        self._running = None if name is None else (name, now)
        return self._stage

    def _queries(self, served: Served, reqs: Sequence[RetrieveRequest | RerankRequest]) -> torch.Tensor:
        import torch

        texts = [r.query for r in reqs if r.query is not None]
        enc = iter(self.encoder.queries(texts)) if texts else iter(())
        rows = [torch.tensor(r.query_embedding, dtype=torch.float32) if r.query is None else next(enc) for r in reqs]
        return torch.stack(rows).to(self.device, served.corpus.dtype)

    # (reqs: predict's split of a batch by request type, the /retrieve ones here, the /rerank ones in _rerank)
    def _retrieve(self, served: Served, reqs: Sequence[Any]) -> list[dict[str, Any]]:
        import torch

        q = self._queries(served, reqs)
        b = len(reqs)
        if self.method not in RERANKERS:
            k = max(r.k for r in reqs)
            mark = self._stage("method")
            out = served.model(q, k)
            packed = (
                torch.stack([out.indices.to(torch.float64), out.scores.to(torch.float64)]).cpu().numpy()
            )  # one transfer
            mark("serialise")
            return [
                {
                    "ids": [served.ids[int(j)] for j in packed[0, i, : r.k].tolist()],
                    "scores": packed[1, i, : r.k].tolist(),
                    "dropped": [],
                    "batch_size": b,
                }
                for i, r in enumerate(reqs)
            ]
        pools = torch.tensor([r.pool() for r in reqs], device=self.device)
        width = max(r.pool() for r in reqs)
        top = served.dense(q, width).indices  # (B, width); a row's first c entries are its own top-c
        mask = torch.arange(width, device=self.device) < pools.unsqueeze(1)
        mark = self._stage("method")
        res = served.model(q, served.corpus[top], mask)
        cols = self._pack(res, mask, top)
        mark("serialise")
        return [self._answer_retrieve(served, cols, i, r, b) for i, r in enumerate(reqs)]

    def _pack(self, res: Any, mask: torch.Tensor, ids: torch.Tensor | None = None) -> np.ndarray:
        """``(6, B, N)`` float64 on the host: order, sorted scores, sorted keep, keep, mask, sorted ids."""
        import torch

        order = res.order
        parts = [
            order,
            res.scores.gather(1, order),
            res.keep.gather(1, order),
            res.keep,
            mask,
            (ids.gather(1, order) if ids is not None else order),
        ]
        return torch.stack([p.to(torch.float64) for p in parts]).cpu().numpy()  # one transfer

    def _answer_retrieve(self, served: Served, cols: np.ndarray, i: int, r: RetrieveRequest, b: int) -> dict[str, Any]:
        order, scores, kept_sorted, keep, mask, ids = (c[i] for c in cols)
        n = int(mask.sum())
        sel = kept_sorted[:n] > 0
        kept_ids, kept_scores = ids[:n][sel][: r.k], scores[:n][sel][: r.k]
        dropped = [served.ids[int(j)] for j, kp in zip(ids[:n], kept_sorted[:n]) if not kp]
        return {
            "ids": [served.ids[int(j)] for j in kept_ids],
            "scores": kept_scores.tolist(),
            "dropped": sorted(dropped, key=served.index.__getitem__),
            "batch_size": b,
        }

    def _rerank(self, served: Served, reqs: Sequence[Any]) -> list[dict[str, Any]]:
        import torch

        q = self._queries(served, reqs)
        sizes = [r.size() for r in reqs]
        b, n = len(reqs), max(sizes)
        blocks: list[torch.Tensor | None] = [None] * b
        text_rows = [i for i, r in enumerate(reqs) if r.candidates is not None]
        if text_rows:
            texts = [
                t for i in text_rows for t in self.encoder.truncate(reqs[i].candidates, reqs[i].max_tokens_per_doc)
            ]
            enc = self.encoder.passages(texts).to(self.device, q.dtype)
            for i, part in zip(text_rows, enc.split([sizes[i] for i in text_rows])):  # type: ignore[no-untyped-call]  # unannotated in torch
                blocks[i] = part
        id_rows = [i for i, r in enumerate(reqs) if r.candidate_ids is not None]
        if id_rows:
            idx = torch.tensor([served.index[x] for i in id_rows for x in reqs[i].candidate_ids], device=self.device)
            for i, part in zip(id_rows, served.corpus[idx].split([sizes[i] for i in id_rows])):
                blocks[i] = part
        for i, r in enumerate(reqs):
            if r.candidate_embeddings is not None:
                blocks[i] = torch.tensor(r.candidate_embeddings, dtype=q.dtype, device=self.device)
        # scatter the concatenated blocks into the padded (B, N, D) batch in one indexed copy
        counts = torch.tensor(sizes, device=self.device)
        rows = torch.repeat_interleave(torch.arange(b, device=self.device), counts)
        starts = torch.cumsum(counts, 0) - counts
        cols_ = torch.arange(sum(sizes), device=self.device) - starts[rows]
        docs = torch.zeros(b, n, q.shape[1], dtype=q.dtype, device=self.device)
        docs[rows, cols_] = torch.cat(cast("list[torch.Tensor]", blocks))  # a request gives one of the three
        mask = torch.arange(n, device=self.device) < counts.unsqueeze(1)
        mark = self._stage("method")
        res = served.model(q, docs, mask)
        cols = self._pack(res, mask)
        mark("serialise")
        out = []
        for i, r in enumerate(reqs):
            order, scores, kept_sorted, keep, _, _ = (c[i] for c in cols)
            m = sizes[i]
            sel = kept_sorted[:m] > 0
            top_n = r.top_n if r.top_n is not None else m
            out.append(
                {
                    "order": order[:m][sel][:top_n].astype(int).tolist(),
                    "scores": scores[:m][sel][:top_n].tolist(),
                    "dropped": [j for j in range(m) if not keep[j]],
                    "batch_size": b,
                }
            )
        return out
