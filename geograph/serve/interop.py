"""The de facto rerank API on ``geograph serve``: ``POST /v2/rerank`` (Cohere v2) and ``POST /v1/rerank``
(Cohere v1, Jina).

Both paths have one handler. FastAPI validates the request (:class:`CohereV1Request`,
:class:`CohereV2Request`: the routes' typed bodies in the OpenAPI document, as is the answer,
:class:`CohereResponse`); the handler turns it into
the native :class:`~geograph.serve.schema.RerankRequest` and hands that to the native
``/rerank`` endpoint's own LitServe handler, so the request joins the same queue and batches,
is counted by the same metrics and stops with the same lifecycle; the answer is then written
in the Cohere shape::

    {"model": "maniscope", "query": "text", "documents": ["text", ...], "top_n": 3}
    -> {"id": "...", "model": "maniscope",
        "results": [{"index": 2, "relevance_score": 0.91, "score": 0.87, "document": {"text": ...}}, ...],
        "meta": {"api_version": {"version": "2"}, "dropped": [1], "batch_size": 4},
        "usage": {"documents": 5}}

* ``results``: best first; ``index`` is the position in ``documents``; ``relevance_score`` is the
  method's score mapped linearly from its range ``[lo, hi]`` onto [0, 1] (see
  :func:`geograph.serve.models.score_bounds`: Maniscope ``(score + alpha) / (1 + alpha)``,
  Ricci-Filtration ``(cos + 1) / 2``), so the order is the method's; ``score`` is the raw score.
  Ricci-Filtration's dropped documents are not in ``results``; ``meta.dropped`` lists their
  indices.
* ``top_n``: ``null``, 0 or more than the number of (kept) documents = all; below 0 is a 422.
* ``documents``: strings; on ``/v1/rerank`` also objects (``{"text": ...}``, or any fields
  joined as ``field: value`` lines in the order of ``rank_fields``), not mixed with strings.
* ``return_documents`` (default false): each result carries ``document`` (``{"text": ...}`` for a
  string, the object as given otherwise).
* ``max_tokens_per_doc``: each document is cut after that many tokens of the encoder's tokenizer
  before it is embedded (the encoder's own limit applies as well).
* ``model``: omitted, or the served method's name (``maniscope``, ``ricci``); any other name is a
  404 naming the served one, so a client left on a hosted model's name fails loudly instead of
  silently getting another ranking.
* geograph's extensions, as extra body keys (the ``cohere`` SDK sends them through
  ``request_options={"additional_body_parameters": {...}}``): ``query_embedding`` (``D`` floats,
  used instead of embedding ``query``) and ``candidate_embeddings`` (one row per document, used
  instead of embedding the documents; ``max_tokens_per_doc`` then has nothing to cut).

Errors are ``{"message": "<field>: <problem>"}`` with the native API's status codes (422 for a bad
request, every rule of the native schema included; 404 unknown model; 401, 413, 415 as the
server answers them on every path).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from geograph.serve.schema import RerankRequest, count_limit

if TYPE_CHECKING:
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

try:
    from fastapi import HTTPException
except ImportError:  # pragma: no cover - exercised only without the serve extra
    HTTPException = None  # type: ignore[misc, assignment]  # only without the serve extra

PATHS = ("/v1/rerank", "/v2/rerank")


def relevance_score(score: float, lo: float, hi: float) -> float:
    """``score`` mapped linearly from ``[lo, hi]`` onto [0, 1] (clamped against rounding).

    Example:
        >>> relevance_score(0.0, -1.0, 1.0), relevance_score(1.0, -0.3, 1.0), relevance_score(-0.3, -0.3, 1.0)
        (0.5, 1.0, 0.0)
    """
    import torch

    from geograph.registry import linear_relevance

    return float(linear_relevance(torch.tensor(float(score), dtype=torch.float64), lo, hi))


class InteropRequest(BaseModel):
    """A ``/v1/rerank`` or ``/v2/rerank`` body (:class:`CohereV1Request`, :class:`CohereV2Request`; this
    base takes ``context={"version": 1 or 2}``, default 1)."""

    model_config = ConfigDict(extra="forbid")
    version: ClassVar[int | None] = None

    model: str | None = Field(None, description="the served method's name, or omitted")
    query: str = Field(min_length=1, max_length=10000)
    documents: list[str | dict[str, Any]] = Field(min_length=1)
    top_n: int | None = Field(None, ge=0, description="null, 0 or above the count: all")
    max_tokens_per_doc: int | None = Field(None, ge=1)
    rank_fields: list[str] | None = Field(None, min_length=1, description="/v1: fields of object documents")
    return_documents: bool = False
    query_embedding: list[float] | None = Field(None, description="geograph: the query's embedding")
    candidate_embeddings: list[list[float]] | None = Field(None, description="geograph: one row per document")

    @model_validator(mode="after")
    def _validate(self, info: ValidationInfo) -> Self:
        version = self.version or (info.context or {}).get("version", 1)
        kinds = {isinstance(d, str) for d in self.documents}
        if len(kinds) > 1:
            raise ValueError("documents mixes strings and objects: give all as strings or all as objects")
        objects = kinds == {False}
        if objects and version == 2:
            raise ValueError("documents must be strings on /v2/rerank (objects are a /v1/rerank form)")
        if self.rank_fields is not None and not objects:
            raise ValueError("rank_fields applies to documents given as objects")
        over = count_limit(len(self.documents))
        if over is not None:
            raise ValueError(f"documents has {len(self.documents)} entries; at most {over[0]} per request ({over[1]})")
        for i, text in enumerate(self.texts()):
            if not text:
                raise ValueError(f"documents[{i}] is empty" + (" (no text, or none of rank_fields)" if objects else ""))
        if self.candidate_embeddings is not None and len(self.candidate_embeddings) != len(self.documents):
            raise ValueError(
                f"candidate_embeddings has {len(self.candidate_embeddings)} rows, "
                f"documents {len(self.documents)}: give one row per document"
            )
        return self

    def texts(self) -> list[str]:
        """The text of each document (an object's ``text``, or its ``rank_fields`` as lines)."""
        out = []
        for d in self.documents:
            if isinstance(d, str):
                out.append(d)
            elif self.rank_fields is None:
                out.append(d["text"] if isinstance(d.get("text"), str) else "")
            else:
                out.append("\n".join(f"{f}: {d[f]}" for f in self.rank_fields if f in d and d[f] is not None))
        return out

    def native(self) -> RerankRequest:
        """The native request (raises pydantic's ``ValidationError`` on its rules)."""
        n = len(self.documents)
        kw: dict[str, Any] = {"top_n": self.top_n if self.top_n and self.top_n < n else None}
        if self.query_embedding is not None:
            kw["query_embedding"] = self.query_embedding
        else:
            kw["query"] = self.query
        if self.candidate_embeddings is not None:
            kw["candidate_embeddings"] = self.candidate_embeddings
        else:
            kw["candidates"] = self.texts()
            kw["max_tokens_per_doc"] = self.max_tokens_per_doc
        return RerankRequest(**kw)


class CohereV1Request(InteropRequest):
    """``POST /v1/rerank`` (Cohere v1, Jina): documents as strings or objects."""

    version: ClassVar[int | None] = 1


class CohereV2Request(InteropRequest):
    """``POST /v2/rerank`` (Cohere v2): documents as strings."""

    version: ClassVar[int | None] = 2
    documents: list[str] = Field(min_length=1)  # type: ignore[assignment]  # pydantic: /v2 narrows the field

    @field_validator("documents", mode="before")
    @classmethod
    def _strings(cls, v: Any) -> Any:
        if isinstance(v, list) and any(not isinstance(d, str) for d in v):
            raise ValueError("documents must be strings on /v2/rerank (objects are a /v1/rerank form)")
        return v


class CohereResult(BaseModel):
    index: int = Field(description="position in documents")
    relevance_score: float = Field(description="the score mapped from the method's range onto [0, 1]")
    score: float = Field(description="the method's raw score")
    document: dict[str, Any] | None = Field(None, description="with return_documents: the document")


class CohereMeta(BaseModel):
    api_version: dict[str, str]
    dropped: list[int] = Field(description="Ricci-Filtration: documents it dropped")
    batch_size: int


class CohereResponse(BaseModel):
    """The ``/v1`` and ``/v2/rerank`` answer (``document`` left out unless ``return_documents``)."""

    id: str
    model: str
    results: list[CohereResult]
    meta: CohereMeta
    usage: dict[str, int]


def error_message(e: ValidationError | Sequence[Any]) -> str:
    """One line per pydantic error, ``loc: msg``, with the native names of the interop fields
    (``e``: the error, or its ``errors()`` as FastAPI gives them, located under ``body``)."""
    parts = []
    for err in e.errors() if isinstance(e, ValidationError) else e:
        where = list(err.get("loc", ()))
        where = where[1:] if where[:1] == ["body"] else where
        if err.get("type") == "json_invalid":
            parts.append(f"body: not valid JSON ({err.get('ctx', {}).get('error', err.get('msg'))})")
            continue
        if err.get("type") == "model_attributes_type" and not where:
            parts.append(f"body: expected a JSON object, got {type(err.get('input')).__name__}")
            continue
        loc = ".".join(str(x) for x in where)
        loc = loc.replace("candidates", "documents") if not loc.startswith("candidate_embeddings") else loc
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        msg = msg.replace("candidates[", "documents[").replace("candidates (", "documents (")
        if err.get("type") == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def answer(
    req: InteropRequest, out: dict[str, Any], *, method: str, bounds: tuple[float, float], version: int
) -> dict[str, Any]:
    """The Cohere-shaped response for the native answer ``out`` (``order``, ``scores``, ``dropped``)."""
    lo, hi = bounds
    results = []
    for j, s in zip(out["order"], out["scores"]):
        item: dict[str, Any] = {
            "index": int(j),
            "relevance_score": relevance_score(float(s), lo, hi),
            "score": float(s),
        }
        if req.return_documents:
            d = req.documents[j]
            item["document"] = {"text": d} if isinstance(d, str) else d
        results.append(item)
    if req.top_n:
        results = results[: req.top_n]
    return {
        "id": str(uuid.uuid4()),
        "model": method,
        "results": results,
        "meta": {
            "api_version": {"version": str(version)},
            "dropped": list(out["dropped"]),
            "batch_size": out["batch_size"],
        },
        "usage": {"documents": len(req.documents)},
    }


def _error(status: int, message: str) -> JSONResponse:
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=status, content={"message": message})


def add_routes(app: FastAPI, *, method: str, bounds: tuple[float, float]) -> None:
    """``POST /v1/rerank`` and ``/v2/rerank`` on the FastAPI ``app`` of a reranker's server.

    Call after LitServe has registered ``/rerank``: its endpoint function is the one handler
    both paths hand their (translated) requests to.
    """
    native = next(
        (
            r.endpoint  # type: ignore[attr-defined]  # the POST /rerank route is an APIRoute
            for r in app.routes
            if getattr(r, "path", None) == "/rerank" and "POST" in getattr(r, "methods", ())
        ),
        None,
    )
    if native is None:
        raise RuntimeError("the /rerank endpoint must be registered before the interop routes")

    async def handle(req: InteropRequest, version: int) -> JSONResponse | dict[str, Any]:
        if req.model is not None and req.model != method:
            return _error(
                404, f"model: {req.model!r} is not served here; this server serves {method!r} (or omit model)"
            )
        try:
            native_req = req.native()
        except ValidationError as e:
            return _error(422, error_message(e))
        try:
            out = await native(native_req)
        except HTTPException as e:
            return _error(e.status_code, e.detail if isinstance(e.detail, str) else json.dumps(e.detail))
        return answer(req, out, method=method, bounds=bounds, version=version)

    # the return annotation is FastAPI's response model: it validates the dict (a Response passes as it is)
    async def rerank_v1(body: CohereV1Request) -> CohereResponse:
        return await handle(body, 1)  # type: ignore[return-value]

    async def rerank_v2(body: CohereV2Request) -> CohereResponse:
        return await handle(body, 2)  # type: ignore[return-value]

    common: dict[str, Any] = {
        "methods": ["POST"],
        "response_model_exclude_none": True,
        "responses": {404: {"description": "model"}},
    }
    app.add_api_route("/v1/rerank", rerank_v1, summary="Cohere v1 / Jina rerank", **common)
    app.add_api_route("/v2/rerank", rerank_v2, summary="Cohere v2 rerank", **common)


class MessageErrorMiddleware:
    """ASGI middleware: an error answered on ``/v1`` or ``/v2/rerank`` without a ``message`` (413,
    415, 503 from the server's other layers) gets one, from its ``detail``, as clients read it.

    It reads and rewrites the body, so it must sit inside the response compression (LitServe's
    gzip, which :func:`~geograph.serve.server.build_server` leaves outside every geograph
    middleware): outside it, a compressed error would be read as text and sent on as JSON still
    marked ``content-encoding: gzip``, which no client can decode."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in PATHS:
            await self.app(scope, receive, send)
            return
        held: dict[str, Any] = {}

        async def send_(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                held["start"], held["body"] = message, b""
                return
            if "start" in held and message["type"] == "http.response.body":
                held["body"] += message.get("body", b"")
                if message.get("more_body"):
                    return
                body = held["body"]
                try:
                    content = json.loads(body)
                except ValueError:
                    content = {"detail": body.decode(errors="replace")}
                if isinstance(content, dict) and "message" not in content:
                    detail = content.get("detail", content)
                    content["message"] = detail if isinstance(detail, str) else json.dumps(detail)
                    body = json.dumps(content).encode()
                headers = [
                    (k, v)
                    for k, v in held["start"].get("headers", [])
                    if k.lower() not in (b"content-length", b"content-type")
                ]
                headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                await send({**held["start"], "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, send_)
