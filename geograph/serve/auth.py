"""The optional API key of ``geograph serve``.

With a key (``--api-key``, ``api_key:`` in the config, or ``$GEOGRAPH_API_KEY``) every request
needs ``Authorization: Bearer <key>`` (what the ``cohere`` SDK and the framework clients send)
except ``GET /health`` and the groups the config opens with ``public`` (``metrics``: ``/metrics``;
``docs``: ``/docs``, ``/redoc``, ``/openapi.json``). Anything else gets a 401 before its body is
read. The comparison is constant-time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

ALWAYS_OPEN = ("/health",)
GROUPS = {"metrics": ("/metrics",), "docs": ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")}
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def open_paths(public: Iterable[str]) -> frozenset[str]:
    """The paths that need no key: ``/health`` and those of the ``public`` groups.

    Example:
        >>> sorted(open_paths(["metrics"]))
        ['/health', '/metrics']
    """
    paths = set(ALWAYS_OPEN)
    for group in public:
        paths.update(GROUPS[group])
    return frozenset(paths)


def authorized(headers: Iterable[tuple[bytes, bytes]], key: bytes) -> bool:
    """Whether the ASGI ``headers`` carry ``Authorization: Bearer <key>``.

    Example:
        >>> authorized([(b"authorization", b"Bearer s3cret")], b"s3cret"), authorized([], b"s3cret")
        (True, False)
    """
    value = next((v for k, v in headers if k.lower() == b"authorization"), b"")
    scheme, _, token = value.strip().partition(b" ")
    # compare_digest runs in time independent of where the strings differ; always call it
    return hmac.compare_digest(token.strip(), key) and scheme.lower() == b"bearer"


class APIKeyMiddleware:
    """ASGI middleware: 401 for a request without the key, except on ``open`` paths.

    Args:
        key: the API key.
        public: config groups (``metrics``, ``docs``) that stay open.
    """

    def __init__(self, app: ASGIApp, key: str, public: Iterable[str] = ()) -> None:
        self.app, self.key, self.open = app, key.encode("utf-8"), open_paths(public)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open or authorized(scope.get("headers") or [], self.key):
            await self.app(scope, receive, send)
            return
        given = any(k.lower() == b"authorization" for k, _ in scope.get("headers") or [])
        msg = "invalid API key" if given else "missing API key: send 'Authorization: Bearer <key>'"
        body = json.dumps({"message": msg, "detail": msg}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def exposure_warning(host: str, key: str | None) -> str | None:
    """A warning line when ``host`` is not a loopback address and there is no key, else ``None``.

    Example:
        >>> exposure_warning("127.0.0.1", None) is None, exposure_warning("0.0.0.0", "k") is None
        (True, True)
    """
    if key is not None or host in LOOPBACK:
        return None
    return (
        f"warning: listening on {host} without an API key: anyone who reaches the port can use every "
        "endpoint (set --api-key or $GEOGRAPH_API_KEY)"
    )
