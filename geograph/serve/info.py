"""What ``geograph serve`` says about itself: ``GET /info``, the 404 of a route it does not serve,
and the line it prints once it answers.

* ``GET /info`` (replacing LitServe's, which described LitServe's internals: a ``model`` never
  set, the internal queue ``/infer`` that is no route): the method, geograph's version, the
  encoder, the corpus and the version served, every limit a request is checked against, the
  workers, and the routes (:func:`add_info_route`);
* a path this server does not serve answers 404 with one line that says which paths it does
  serve, and why a route of another configuration is not here (``/rerank`` on a retriever,
  ``/admin/reload`` without an API key) (:func:`add_not_found_handler`);
* ``geograph serve: listening on http://HOST:PORT (METHOD, N workers, encoder NAME)`` on stderr,
  once ``/health`` answers ``ok`` (:func:`listening_line`, printed by
  :func:`~geograph.serve.lifecycle.announce_ready`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from geograph import registry
from geograph.serve.models import RERANKERS

if TYPE_CHECKING:
    from fastapi import FastAPI
    from fastapi.responses import Response
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.types import Scope

    from geograph.serve.config import ServeConfig
    from geograph.serve.reload import ReloadChannel

#: the routes some configuration of ``geograph serve`` serves, and which configuration
OPTIONAL_ROUTES = {
    "/rerank": "rerankers",
    "/v1/rerank": "rerankers",
    "/v2/rerank": "rerankers",
    "/admin/reload": "api_key",
}
#: routes left out of the lists (LitServe's index page, Swagger UI's redirect)
HIDDEN_ROUTES = ("/", "/docs/oauth2-redirect")
#: the documentation routes, listed last
DOC_ROUTES = ("/docs", "/redoc", "/openapi.json")


def served_routes(app: FastAPI) -> dict[str, list[str]]:
    """The FastAPI ``app``'s routes: path -> HTTP methods (``HEAD`` left out); the ``POST`` routes
    first, the documentation last, each group in registration order."""
    out: dict[str, list[str]] = {}
    for route in app.router.routes:
        path = getattr(route, "path", None)
        if path is None or path in HIDDEN_ROUTES:
            continue
        methods = sorted(m for m in getattr(route, "methods", None) or () if m != "HEAD")
        out.setdefault(path, [])
        out[path] += [m for m in methods if m not in out[path]]
    order = sorted(out, key=lambda p: 0 if "POST" in out[p] else 2 if p in DOC_ROUTES else 1)
    return {p: out[p] for p in order}


def not_found_line(path: str, method: str, served: Iterable[str]) -> str:
    """The 404 line of ``path`` on a ``method`` server that serves the paths ``served``.

    Example:
        >>> not_found_line("/rerank", "iso", ["/retrieve", "/health"])
        "/rerank is not served by method 'iso' (only by the rerankers: maniscope, ricci); it serves: /retrieve, /health"
        >>> not_found_line("/nope", "iso", ["/retrieve", "/health"])
        "no route /nope; method 'iso' serves: /retrieve, /health"
    """
    listing = ", ".join(served)
    why = OPTIONAL_ROUTES.get(path)
    if why == "rerankers":
        return (
            f"{path} is not served by method {method!r} (only by the rerankers: {', '.join(sorted(RERANKERS))}); "
            f"it serves: {listing}"
        )
    if why == "api_key":
        return f"{path} is served only with an API key (--api-key or $GEOGRAPH_API_KEY); this server serves: {listing}"
    return f"no route {path}; method {method!r} serves: {listing}"


def add_not_found_handler(app: FastAPI, method: str) -> None:
    """A 404 for a path no route of ``app`` matches: ``{"detail": not_found_line(...)}`` (a 404 that
    a route raises itself keeps its own detail)."""
    from fastapi.exception_handlers import http_exception_handler
    from fastapi.responses import JSONResponse
    from starlette.routing import Match

    def no_route(scope: Scope) -> bool:
        return all(route.matches(scope)[0] is Match.NONE for route in app.router.routes)

    async def not_found(request: Request, exc: HTTPException) -> Response:
        if getattr(exc, "detail", None) == "Not Found" and no_route(request.scope):
            served = list(served_routes(app))
            return JSONResponse(status_code=404, content={"detail": not_found_line(request.url.path, method, served)})
        return await http_exception_handler(request, exc)

    app.add_exception_handler(404, not_found)  # type: ignore[arg-type]  # a 404 is an HTTPException


def describe(
    cfg: ServeConfig, *, encoder: dict[str, Any], dim: int, num_docs: int, corpus_version: int | None, workers: int
) -> dict[str, Any]:
    """The part of ``GET /info`` fixed at start (:func:`add_info_route` adds what a reload changes
    and the routes): ``cfg`` the :class:`~geograph.serve.config.ServeConfig`, ``encoder`` the
    encoder's identity (name, checksum, dimension, prefixes) and path, ``workers`` the number of
    inference workers."""
    from geograph import __version__

    reranker = cfg.method in RERANKERS
    return {
        "server": "geograph",
        "version": __version__,
        "method": cfg.method,
        "params": {**registry.get(cfg.method).defaults(), **cfg.params},
        "encoder": encoder,
        "corpus": {
            "path": str(cfg.corpus),
            "passages": num_docs,
            "dimension": dim,
            "graph": cfg.graph,
            "projection": cfg.projection,
            "corpus_version": corpus_version,
            "version": 0,
        },
        "limits": {
            "candidates": cfg.candidates if reranker else None,
            "max_candidates": cfg.max_candidates,
            "max_batch_candidates": cfg.max_batch_candidates,
            "max_k": cfg.max_k,
            "max_text_chars": cfg.max_text_chars,
            "max_batch_size": cfg.max_batch_size,
            "max_batch_texts": cfg.max_batch_texts,
            "max_batch_tokens": cfg.max_batch_tokens,
            "batch_timeout": cfg.batch_timeout,
            "max_payload_mb": cfg.max_payload_mb,
            "request_timeout": cfg.request_timeout,
            "reload_timeout": cfg.reload_timeout if cfg.api_key is not None else None,
        },
        "workers": {
            "inference_workers": workers,
            "api_servers": cfg.api_servers,
            "accelerator": cfg.accelerator,
            "devices": cfg.devices,
        },
        "api_key": cfg.api_key is not None,
    }


def add_info_route(app: FastAPI, about: dict[str, Any], channel: ReloadChannel | None = None) -> None:
    """``GET /info`` on ``app`` (LitServe's own route at that path is removed): ``about``
    (:func:`describe`) with the served version and corpus read when asked (a reload changes them:
    ``channel`` is the server's :class:`~geograph.serve.reload.ReloadChannel`, ``None`` without
    one), the bounds on ``k`` and the routes."""
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, Field

    from geograph.serve.schema import LIMITS

    class Info(BaseModel):
        """``GET /info``: what this server serves."""

        server: str = Field(description='"geograph"')
        version: str = Field(description="geograph's version")
        method: str = Field(description="the served method")
        params: dict[str, Any] = Field(
            description="the method's parameters in use (its defaults, then those given at start)"
        )
        encoder: dict[str, Any] = Field(description="name, path, sha256 of its files, dimension, prefixes")
        corpus: dict[str, Any] = Field(
            description="path, passages, dimension, graph, projection, the saved graph's corpus_version "
            "and the served version (0 at start, one more each reload)"
        )
        limits: dict[str, Any] = Field(description="the limits requests are checked against (k_min, k_max included)")
        workers: dict[str, Any] = Field(description="inference workers, API servers, accelerator, devices")
        api_key: bool = Field(description="whether every route but /health needs the API key")
        routes: dict[str, list[str]] = Field(description="path -> HTTP methods")

    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != "/info"]

    async def info() -> JSONResponse:  # (no return model: the answer is built here, not validated)
        out = {**about, "corpus": dict(about["corpus"]), "limits": dict(about["limits"])}
        if "num_docs" in LIMITS:  # the served version's (kept current by the reload's middleware)
            out["corpus"]["passages"] = LIMITS["num_docs"]
            out["corpus"]["corpus_version"] = LIMITS.get("corpus_version", out["corpus"]["corpus_version"])
        if channel is not None:
            out["corpus"]["version"] = int(channel.version.value)
        out["limits"]["k_min"] = LIMITS.get("k_min")
        out["limits"]["k_max"] = LIMITS.get("k_max")
        out["routes"] = served_routes(app)
        return JSONResponse(content=out)

    app.add_api_route(
        "/info",
        info,
        methods=["GET"],
        response_model=None,
        responses={200: {"model": Info, "description": "what this server serves"}},
        summary="the method, version, encoder, corpus and limits of this server",
    )


def listening_line(host: str, port: int, method: str, workers: int, encoder: str) -> str:
    """The line printed once the server answers.

    Example:
        >>> listening_line("::", 8000, "iso", 1, "all-MiniLM-L6-v2")
        'geograph serve: listening on http://[::]:8000 (iso, 1 worker, encoder all-MiniLM-L6-v2)'
    """
    where = f"[{host}]" if ":" in host else host
    return (
        f"geograph serve: listening on http://{where}:{port} "
        f"({method}, {workers} worker{'' if workers == 1 else 's'}, encoder {encoder})"
    )
