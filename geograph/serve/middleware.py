"""ASGI middlewares and handlers of ``geograph serve``'s own around LitServe's routes: the request deadline
(504), JSON-only POSTs (415), and a 422 that names the invalid fields without echoing the input.

(The API key's middleware is :mod:`~geograph.serve.auth`'s, the metrics' :mod:`~geograph.serve.prometheus`'s,
the interop error bodies' :mod:`~geograph.serve.interop`'s.)
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.requests import Request
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: the routes whose answers come from an inference worker (the deadline applies to them)
INFERENCE_ROUTES = ("/retrieve", "/rerank", "/v1/rerank", "/v2/rerank")


class DeadlineMiddleware:
    """ASGI middleware: a POST to an inference route still unanswered after ``seconds`` gets 504.

    LitServe's own ``timeout`` only drops a request that waited that long in the queue, when a
    worker takes it; a request whose worker hangs or dies is never answered. Here the request's
    handler is cancelled at its deadline (the API server forgets it) and the client gets
    ``504 {"detail": "no answer within request_timeout (S s)"}``.
    """

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app, self.seconds = app, float(seconds)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        import asyncio

        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in INFERENCE_ROUTES:
            await self.app(scope, receive, send)
            return
        started = [False]

        async def send_(message: Message) -> None:
            if message["type"] == "http.response.start":
                started[0] = True
            await send(message)

        try:
            await asyncio.wait_for(self.app(scope, receive, send_), self.seconds)
        except TimeoutError:
            if started[0]:  # the answer is on its way already: it cannot become a 504
                return
            body = json.dumps({"detail": f"no answer within request_timeout ({self.seconds:g} s)"}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 504,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                }
            )
            await send({"type": "http.response.body", "body": body})


class JSONOnlyMiddleware:
    """ASGI middleware: a POST whose ``content-type`` is not JSON gets a 415 naming the header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in INFERENCE_ROUTES:
            ctype = dict(scope.get("headers") or []).get(b"content-type", b"").decode("latin-1").lower()
            if ctype.split(";")[0].strip() != "application/json":
                from fastapi.responses import JSONResponse

                msg = f"content-type must be application/json, got {ctype or 'none'!r}"
                resp = JSONResponse(
                    status_code=415,
                    content={
                        "message": msg,
                        "detail": [{"loc": ["header", "content-type"], "msg": msg, "type": "content_type"}],
                    },
                )
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with each error's location and message only: the default echoes the input, which
    cannot be rendered as JSON when it holds NaN, and can be megabytes long. On ``/v1`` and
    ``/v2/rerank`` the body is ``{"message": "<field>: <problem>"}``, as Cohere's clients read it;
    on ``/rerank`` the dialect's tag (``geograph``, ``tei``) is left out of the location."""
    from fastapi.responses import JSONResponse

    from geograph.serve.interop import PATHS, error_message
    from geograph.serve.tei import DIALECTS

    if request.url.path in PATHS:
        return JSONResponse(status_code=422, content={"message": error_message(exc.errors())})
    errors = []
    for e in exc.errors():
        loc = list(e.get("loc", ()))
        if request.url.path == "/rerank" and len(loc) > 1 and loc[0] == "body" and loc[1] in DIALECTS:
            del loc[1]
        errors.append({"loc": loc, "msg": str(e.get("msg", "")), "type": e.get("type")})
    return JSONResponse(status_code=422, content={"detail": errors})
