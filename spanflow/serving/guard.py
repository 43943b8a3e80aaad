"""What stands between the network and the routes: auth, status counting, no bare 500s, and
connections that cannot be held open by a client that sends nothing."""
from __future__ import annotations

import hmac
import json
import logging
import re

log = logging.getLogger("spanflow.serve")

# probes: a readiness probe (Kubernetes httpGet) holds no secret; /ready names its models only to the key
OPEN_PATHS = ("/health", "/ready")


def key_matches(header: bytes | None, key: str) -> bool:
    """An `Authorization: Bearer KEY` header (its raw bytes; scheme in any case) holding `key` as
    UTF-8, as clients send a key that is not ASCII, compared in constant time."""
    scheme, _, token = (header or b"").strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key.encode("utf-8"))


def route_shown(path: str) -> str:
    """A route as its users read it: `/v1/models/{name}`, without the router's `:path` converter."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", path)


class Guard:
    """ASGI middleware around the whole app (docs and OpenAPI schema included).

    Every path but /health and /ready needs the API key when one is set (/ready says its
    models only with it); every response's status is
    counted under its route (unknown paths under "other", so clients cannot grow the label
    set); an exception no handler turned into a response becomes one 500 JSON answer and
    one log line with its traceback, and is counted like any other status.
    """

    def __init__(self, app, *, api_key: str | None, count, routes: set[str]):
        self.app, self.api_key, self.count = app, api_key, count
        self.routes = {r for r in routes if "{" not in r}
        # a route with a parameter ("/v1/models/{name:path}") is one label: its path up to the parameter
        self.prefixes = sorted(((r[:r.index("{")], route_shown(r)) for r in routes if "{" in r), key=lambda p: -len(p[0]))

    def label(self, path: str) -> str:
        """The route `path` is counted under: itself, its route's template, or "other" (unknown
        paths share one label, so a scan of made-up paths cannot grow the metrics without bound)."""
        if path in self.routes:
            return path
        return next((r for prefix, r in self.prefixes if path.startswith(prefix)), "other")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        route = self.label(path)
        keyed = not self.api_key or key_matches(dict(scope.get("headers") or []).get(b"authorization"),
                                                 self.api_key)
        if not keyed and path not in OPEN_PATHS:
            self.count(route, 401)
            return await _send_json(send, 401, "missing or wrong API key (Authorization: Bearer ...)",
                                    [(b"www-authenticate", b"Bearer")])
        scope.setdefault("state", {})["keyed"] = keyed  # an open route may say more to the key's holder
        started = []

        async def send_counting(message):
            if message["type"] == "http.response.start":
                started.append(message["status"])
                self.count(route, message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_counting)
        except Exception:
            log.exception("internal error on %s", path)
            if not started:
                self.count(route, 500)
                await _send_json(send, 500, "internal server error")


# OpenAI's `code` is a string (or null); typed clients refuse an error body with a number there
CODES = {400: "bad_request", 401: "invalid_api_key", 404: "not_found", 405: "method_not_allowed",
         408: "request_timeout", 413: "request_too_large", 415: "unsupported_media_type", 422: "invalid_request",
         429: "rate_limit_exceeded", 500: "server_error", 503: "not_ready", 504: "timeout"}


# error_body's JSON schema, for /openapi.json
ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "code", "param"],
    "properties": {"message": {"type": "string"}, "type": {"enum": ["invalid_request_error", "server_error"]},
                   "code": {"type": "string"}, "param": {"type": ["string", "null"]}}}}}


def error_body(status: int, message: str, param: str | None = None) -> dict:
    """Every error answer's body: {"error": {"message", "type", "code", "param"}}; `type` as
    OpenAI's API names its kinds, which its clients read (`e.type`), `code` a string naming the
    status's cause (the HTTP status itself is the response's)."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": _text(message), "type": kind, "code": CODES.get(status, str(status)),
                      "param": None if param is None else _text(param)}}


def _text(s: str) -> str:
    """`s` as UTF-8 can carry it: a lone surrogate from a request (a key "\\ud800") is shown as
    its escape, not left to fail the response's encoding (a 500 for the client's 4xx)."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


async def _send_json(send, status: int, message: str, headers: list | None = None) -> None:
    body = json.dumps(error_body(status, message)).encode()  # the app's shape
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def deadline_protocol(idle_s: float):
    """uvicorn's HTTP protocol class with a deadline on clients that do not start a request.

    uvicorn closes a keep-alive connection idle after a response, but not a new connection
    that sends nothing or trickles its headers. Every `idle_s` this checks: a connection
    that is not inside a request and has not started a new one since the last check is
    closed. Bodies have their own deadline in the app (408).
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base

    class DeadlineProtocol(base):
        def connection_made(self, transport):
            super().connection_made(transport)
            self._seen = object()
            self._tick()

        def _tick(self):
            if self.transport.is_closing():
                return
            cycle = self.cycle
            busy = cycle is not None and not cycle.response_complete
            if not busy and cycle is self._seen:
                self.transport.close()
                return
            self._seen = cycle
            self.loop.call_later(idle_s, self._tick)

    return DeadlineProtocol
