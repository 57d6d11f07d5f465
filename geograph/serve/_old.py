"""``geograph serve``: an HTTP reranking / retrieval server on LitServe with dynamic batching.

::

    geograph serve --method maniscope --corpus DIR [--port 8000] [--max-batch-size 64] [--batch-timeout 0.01]

``DIR`` is a BEIR-format folder (``corpus.jsonl``); its passages are embedded once through
the on-disk cache. Endpoints (JSON schema in the README):

* ``POST /rerank``: a query (text or embedding) and candidates (texts, embeddings or corpus
  ids) -> the candidates' positions best first with scores (``maniscope``, ``ricci``);
* ``POST /retrieve``: a query -> top-k corpus ids with scores (every method; the rerankers
  rerank the dense top-``--candidates``);
* ``GET /health``: ``ok`` once the workers are up (LitServe's health check).

Requests are validated by pydantic in the API server before they reach a worker (dimension,
NaN/inf, empty or oversized lists, unknown ids): a bad request gets a 422 naming the field and
never fails the batch it would have joined. Concurrent requests are batched by LitServe
(``max_batch_size``, ``batch_timeout``) into one padded, masked module call; every response
carries the size of the batch that served it (``batch_size``). One inference worker per
device (``--devices``, ``--workers-per-device`` to change it).
"""

import argparse
import math
import os
from pathlib import Path
from typing import Any, Optional, Sequence

try:  # the serve extra; the module stays importable (and documented) without it
    import litserve as ls
    from fastapi.exceptions import RequestValidationError
    from pydantic import BaseModel, ConfigDict, Field, model_validator
except ImportError:  # pragma: no cover - exercised only without the extra
    ls = None
    BaseModel = object

METHODS = ("maniscope", "ricci", "iso", "g3")
RERANKERS = ("maniscope", "ricci")

# Limits the request models check, set by :func:`build_server` in the process that forks the
# API servers (pydantic validates there; the inference workers receive validated requests).
LIMITS: dict[str, Any] = {}


def _check_vector(v: Optional[list], name: str) -> None:
    if v is None:
        return
    dim = LIMITS.get("dim")
    if dim is not None and len(v) != dim:
        raise ValueError(f"{name} must have {dim} values (the corpus embedding dimension), got {len(v)}")
    if not all(math.isfinite(x) for x in v):
        raise ValueError(f"{name} contains NaN or infinite values")


if ls is not None:

    class _Request(BaseModel):
        model_config = ConfigDict(extra="forbid")

        query: Optional[str] = Field(None, min_length=1, max_length=10000, description="query text")
        query_embedding: Optional[list[float]] = Field(None, description="query embedding (D floats)")

        def _check_query(self) -> None:
            if (self.query is None) == (self.query_embedding is None):
                raise ValueError("give exactly one of query (text) and query_embedding")
            _check_vector(self.query_embedding, "query_embedding")

    class RetrieveRequest(_Request):
        """``POST /retrieve``: ``{"query": str} | {"query_embedding": [D floats]}``, ``"k"``."""

        k: int = Field(10, ge=1, description="number of passages returned")

        @model_validator(mode="after")
        def _validate(self):
            self._check_query()
            if self.k > LIMITS.get("max_k", 1000):
                raise ValueError(f"k must be <= {LIMITS.get('max_k', 1000)}, got {self.k}")
            return self

    class RerankRequest(_Request):
        """``POST /rerank``: a query and exactly one of ``candidates`` (texts),
        ``candidate_embeddings`` (``N x D``) or ``candidate_ids`` (corpus ids)."""

        candidates: Optional[list[str]] = Field(None, min_length=1)
        candidate_embeddings: Optional[list[list[float]]] = Field(None, min_length=1)
        candidate_ids: Optional[list[str]] = Field(None, min_length=1)

        @model_validator(mode="after")
        def _validate(self):
            self._check_query()
            given = [n for n in ("candidates", "candidate_embeddings", "candidate_ids") if getattr(self, n) is not None]
            if len(given) != 1:
                raise ValueError("give exactly one of candidates, candidate_embeddings and candidate_ids")
            items = getattr(self, given[0])
            limit = LIMITS.get("max_candidates", 1000)
            if len(items) > limit:
                raise ValueError(f"{given[0]} has {len(items)} entries; at most {limit} per request")
            for i, row in enumerate(self.candidate_embeddings or []):
                _check_vector(row, f"candidate_embeddings[{i}]")
            if self.candidate_ids is not None and "ids" in LIMITS:
                unknown = [x for x in self.candidate_ids if x not in LIMITS["ids"]]
                if unknown:
                    raise ValueError(f"unknown candidate_ids {unknown[:5]} (not in the corpus)")
            return self


def load_corpus(corpus_dir: str | Path, cache: Optional[str] = None):
    """``(dataset, embeddings (V, D))`` of a BEIR folder, embedded through the cache."""
    from geograph.data import Encoder, load_beir

    corpus_dir = Path(corpus_dir)
    if not (corpus_dir / "corpus.jsonl").is_file():
        raise SystemExit(f"--corpus {corpus_dir}: not a BEIR-format folder (no corpus.jsonl)")
    split = "test" if (corpus_dir / "qrels" / "test.tsv").is_file() else None
    if split is None:  # a corpus without judgements: load_beir needs a split file, so read passages only
        from geograph.data.beir import _read_jsonl, Dataset

        rows = _read_jsonl(corpus_dir / "corpus.jsonl")
        dataset = Dataset(corpus_dir.name, [str(r["_id"]) for r in rows], [r.get("title", "") for r in rows],
                          [r.get("text", "") for r in rows], [], [], {})
    else:
        dataset = load_beir(corpus_dir, split)
    return dataset, Encoder(cache=cache, progress=False).encode(dataset.passages())


class GeoAPI(ls.LitAPI if ls is not None else object):
    """One endpoint (``/rerank`` or ``/retrieve``) of one method; LitServe batches its requests.

    ``setup`` (in the worker process) embeds the corpus through the cache, builds the module
    and loads the text encoder; ``predict`` runs one padded, masked module call per batch.
    """

    def __init__(self, endpoint: str, method: str, corpus_dir: str, *, candidates: int = 20, cache: Optional[str] = None,
                 options: Optional[dict] = None, max_batch_size: int = 64, batch_timeout: float = 0.01) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path=f"/{endpoint}")
        self.endpoint, self.method, self.corpus_dir = endpoint, method, str(corpus_dir)
        self.candidates, self.cache, self.options = candidates, cache, dict(options or {})

    def setup(self, device) -> None:
        import torch

        from geograph.data import Encoder

        self.device = torch.device(device)
        self.dataset, emb = load_corpus(self.corpus_dir, self.cache)
        self.index = {d: i for i, d in enumerate(self.dataset.doc_ids)}
        self.corpus = emb.to(self.device)
        self.encoder = Encoder(cache=self.cache, progress=False)
        self.model = build_model(self.method, self.corpus, self.options)
        from geograph.retrievers import DenseRetriever

        self.dense = DenseRetriever(self.corpus)

    # LitServe hooks -----------------------------------------------------------------
    def decode_request(self, request: "RerankRequest"):  # annotation replaced per endpoint in build_server
        return request

    def batch(self, inputs):
        return list(inputs)

    def unbatch(self, output):
        return output

    def encode_response(self, output):
        return output

    def _queries(self, reqs):
        import torch

        texts = [r.query for r in reqs if r.query is not None]
        enc = iter(self.encoder.encode(texts)) if texts else iter(())
        rows = [torch.tensor(r.query_embedding) if r.query is None else next(enc) for r in reqs]
        return torch.stack(rows).to(self.device, self.corpus.dtype)

    def predict(self, reqs):
        import torch

        with torch.inference_mode():
            return self._retrieve(reqs) if self.endpoint == "retrieve" else self._rerank(reqs)

    def _retrieve(self, reqs):
        q = self._queries(reqs)
        k = max(r.k for r in reqs)
        ids, scores = run_retrieve(self.method, self.model, self.dense, q, k, self.candidates, self.corpus)
        out = []
        for i, r in enumerate(reqs):
            kk = min(r.k, ids.shape[1])
            out.append({"ids": [self.dataset.doc_ids[j] for j in ids[i, :kk].tolist()],
                        "scores": [float(s) for s in scores[i, :kk].tolist()], "batch_size": len(reqs)})
        return out

    def _rerank(self, reqs):
        import torch

        q = self._queries(reqs)
        docs = []
        texts = [t for r in reqs if r.candidates is not None for t in r.candidates]
        enc = self.encoder.encode(texts).to(self.device, self.corpus.dtype) if texts else None
        used = 0
        for r in reqs:
            if r.candidates is not None:
                docs.append(enc[used : used + len(r.candidates)])
                used += len(r.candidates)
            elif r.candidate_embeddings is not None:
                docs.append(torch.tensor(r.candidate_embeddings, dtype=self.corpus.dtype, device=self.device))
            else:
                docs.append(self.corpus[torch.tensor([self.index[x] for x in r.candidate_ids], device=self.device)])
        n = max(d.shape[0] for d in docs)
        padded = torch.zeros(len(docs), n, q.shape[1], dtype=q.dtype, device=self.device)
        mask = torch.zeros(len(docs), n, dtype=torch.bool, device=self.device)
        for i, d in enumerate(docs):
            padded[i, : d.shape[0]] = d
            mask[i, : d.shape[0]] = True
        res = self.model(q, padded, mask)
        out = []
        for i, d in enumerate(docs):
            order = [j for j in res.order[i].tolist() if j < d.shape[0] and bool(res.keep[i, j])]
            dropped = [j for j in range(d.shape[0]) if not bool(res.keep[i, j])]
            out.append({"order": order, "scores": [float(res.scores[i, j]) for j in order], "dropped": dropped,
                        "batch_size": len(reqs)})
        return out


def build_model(method: str, corpus, options: Optional[dict] = None):
    """The module a server runs for ``method`` on ``corpus (V, D)`` (options: constructor kwargs)."""
    options = dict(options or {})
    if method == "maniscope":
        from geograph import Maniscope

        return Maniscope(**options)
    if method == "ricci":
        from geograph import RicciFiltration

        return RicciFiltration(**options)
    if method == "iso":
        from geograph import CorpusGraph, ISORetriever, PoincareProjection

        knn = options.pop("knn", 10)
        projection = options.pop("projection", None)
        proj = PoincareProjection.load(projection) if projection else None
        return ISORetriever(CorpusGraph.from_knn(corpus, min(knn, corpus.shape[0] - 1)), projection=proj, **options)
    if method == "g3":
        from geograph import G3Retriever

        return G3Retriever(corpus, **options)
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def run_retrieve(method: str, model, dense, query, k: int, candidates: int, corpus):
    """``(ids (B, k'), scores)`` for a batch of queries, as ``/retrieve`` answers them."""
    import torch

    if method in RERANKERS:
        top = dense(query, min(max(candidates, k), corpus.shape[0]))
        res = model(query, corpus[top.indices])
        idx = top.indices.gather(1, res.order)
        scores = res.scores.gather(1, res.order)
        return idx[:, :k], scores[:, :k]
    k = min(k, model.max_k if method == "iso" else corpus.shape[0])
    out = model(query, k)
    return out.indices, out.scores.to(torch.float64)


def build_server(method: str, corpus_dir: str, *, max_batch_size: int = 64, batch_timeout: float = 0.01,
                 candidates: int = 20, cache: Optional[str] = None, options: Optional[dict] = None,
                 accelerator: str = "auto", devices="auto", workers_per_device: int = 1, max_candidates: int = 1000,
                 max_k: int = 1000, max_payload_size: int = 10 * 2**20, timeout: float = 60.0):
    """A configured :class:`litserve.LitServer` (call ``.run(port=...)``)."""
    if ls is None:
        raise SystemExit("geograph serve needs the serve extra: pip install 'geograph[serve]' (litserve)")
    if method not in METHODS:
        raise SystemExit(f"--method must be one of {METHODS}, got {method!r}")
    dataset, emb = load_corpus(corpus_dir, cache)  # fills the cache before the workers start
    LIMITS.clear()
    LIMITS.update(dim=int(emb.shape[1]), ids=frozenset(dataset.doc_ids), max_candidates=max_candidates, max_k=max_k)

    kw = dict(candidates=candidates, cache=cache, options=options, max_batch_size=max_batch_size,
              batch_timeout=batch_timeout)
    apis = [RetrieveAPI("retrieve", method, corpus_dir, **kw)]
    if method in RERANKERS:
        apis.append(RerankAPI("rerank", method, corpus_dir, **kw))
    server = ls.LitServer(apis, accelerator=accelerator, devices=devices, workers_per_device=workers_per_device,
                          timeout=timeout, max_payload_size=max_payload_size)
    server.app.add_exception_handler(RequestValidationError, _validation_error)
    return server


def _validation_error(request, exc):
    """422 with each error's location and message only: the default echoes the input, which
    cannot be rendered as JSON when it holds NaN, and can be megabytes long."""
    from fastapi.responses import JSONResponse

    errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")} for e in exc.errors()]
    return JSONResponse(status_code=422, content={"detail": errors})


if ls is not None:

    class RetrieveAPI(GeoAPI):
        def decode_request(self, request: RetrieveRequest):
            return request

    class RerankAPI(GeoAPI):
        def decode_request(self, request: RerankRequest):
            return request


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="geograph serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", required=True, choices=METHODS)
    p.add_argument("--corpus", required=True, help="BEIR-format folder (corpus.jsonl)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--batch-timeout", type=float, default=0.01, help="seconds a batch waits to fill")
    p.add_argument("--candidates", type=int, default=20, help="dense top-M reranked by /retrieve (maniscope, ricci)")
    p.add_argument("--max-candidates", type=int, default=1000, help="largest candidate list accepted by /rerank")
    p.add_argument("--accelerator", default="auto")
    p.add_argument("--devices", default="auto")
    p.add_argument("--workers-per-device", type=int, default=1)
    p.add_argument("--api-servers", type=int, default=1, help="uvicorn API server processes")
    p.add_argument("--cache", help="embedding cache directory")
    args = p.parse_args(argv)
    devices = args.devices if args.devices == "auto" else int(args.devices)
    server = build_server(args.method, args.corpus, max_batch_size=args.max_batch_size,
                          batch_timeout=args.batch_timeout, candidates=args.candidates, cache=args.cache,
                          accelerator=args.accelerator, devices=devices, workers_per_device=args.workers_per_device,
                          max_candidates=args.max_candidates)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    server.run(host=args.host, port=args.port, num_api_servers=args.api_servers, generate_client_file=False)
    return 0
