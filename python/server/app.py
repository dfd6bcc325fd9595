"""The Quart-Trio application: the API modules it mounts, the error envelope, the health gate,
headers and HTTP metrics."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from actors.loader.whisper import is_transcription_model
from server.api import (
    dev,
    elastic,
    generative_scoring,
    lora,
    ops,
    orca,
    pooling,
    profile,
    scale_out,
    weights,
)
from server.api.anthropic import errors as anthropic_errors
from server.api.anthropic import routes as anthropic_messages
from server.api.openai import (
    audio, batch, chat, completions, invocations, models, responses, tokenize,
)
from server.auth import APIKeyMiddleware
from server.errors import APIError, api_error_of_failure, envelope_bytes
from server.frontend.failures import ServiceFailure
from server.frontend.generation import RetireAtRequestEnd
from server.state import ServerState
from server.write_watchdog import WriteWatchdog

log = logging.getLogger("server.http")

# Every module that registers routes, each through its `register(app, srv)`.
API_MODULES = (ops, completions, chat, batch, models, tokenize, invocations,
               anthropic_messages, responses, scale_out, dev, weights, profile, pooling, lora,
               audio, orca, generative_scoring, elastic)
# Not mounted under the pooling runner (an encoder, or --runner pooling), as vLLM.
GENERATION_MODULES = (completions, chat, batch, anthropic_messages, responses, scale_out,
                      generative_scoring, elastic)

# Routes that answer before the model is loaded (and after an engine failure).
ALWAYS_OPEN = frozenset({"/health", "/ping", "/ready", "/readyz", "/version", "/metrics"})
_HTTP_MESSAGES = {
    404: "Route not found.",
    405: "Method not allowed for this route.",
    408: "The request body arrived too slowly.",
    413: "The request body is too large.",
    415: "Unsupported media type.",
}


def _error_response(status: int, message: str, param: str | None = None,
                    headers: dict[str, str] | None = None) -> Response:
    # Anthropic's clients read their own envelope, on every failure of their routes.
    body = (anthropic_errors.envelope_bytes(status, message)
            if anthropic_errors.is_anthropic_path(request.path)
            else envelope_bytes(status, message, param))
    response = Response(body, status=status, mimetype="application/json")
    for k, v in (headers or {}).items():
        response.headers[k] = v
    return response


def create_app(srv: ServerState) -> Any:
    """The ASGI callable to serve: the Quart-Trio app behind the API-key check."""
    app = QuartTrio("server")
    cfg = srv.config
    app.config.update(
        MAX_CONTENT_LENGTH=cfg.max_body_bytes,
        BODY_TIMEOUT=30,
        RESPONSE_TIMEOUT=None,  # streams are long; clients and drain decide when they end
        PROVIDE_AUTOMATIC_OPTIONS=True,
    )
    # A Whisper model serves transcription only (vLLM's supported tasks for it): neither
    # the generation routes nor the pooling ones are mounted.
    no_generation = pooling.pooling_only(cfg) or is_transcription_model(cfg.model)
    for module in API_MODULES:
        if not (no_generation and module in GENERATION_MODULES):
            module.register(app, srv)

    @app.before_request
    async def gate() -> Response | None:
        g.started = time.monotonic()
        path = request.url_rule.rule if request.url_rule is not None else None
        if path in ALWAYS_OPEN or request.method == "OPTIONS":
            return None
        if srv.health.loading:
            return _error_response(503, "The model is still loading.", headers={"Retry-After": "5"})
        if srv.health.failed:
            return _error_response(503, "The engine has failed; the server is shutting down.")
        return None

    @app.errorhandler(APIError)
    async def api_error(exc: APIError) -> Response:
        return _error_response(exc.status, exc.message, exc.param, exc.headers)

    @app.errorhandler(ServiceFailure)
    async def service_failure(exc: ServiceFailure) -> Response:
        # The generation service's failures, in the same status table for every dialect.
        error = api_error_of_failure(exc)
        return _error_response(error.status, error.message, error.param, error.headers)

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        message = _HTTP_MESSAGES.get(status, exc.name or "HTTP error")
        headers = {}
        if status == 405 and exc.get_headers():
            headers = {k: v for k, v in exc.get_headers() if k.lower() == "allow"}
        if status == 413:
            # The rest of the body is still on the wire: this connection cannot be reused.
            headers["Connection"] = "close"
        return _error_response(status, message, headers=headers)

    @app.errorhandler(Exception)
    async def internal_error(exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _error_response(500, "Internal server error.")

    @app.after_request
    async def finish(response: Response) -> Response:
        rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
        if srv.metrics is not None and rule not in ("/metrics", "/health", "/ping"):
            srv.metrics.count_http(rule, request.method, response.status_code)
        if cfg.enable_request_id_headers:
            response.headers["X-Request-Id"] = (
                request.headers.get("X-Request-Id", "")[:128] or uuid.uuid4().hex
            )
        origin = request.headers.get("Origin")
        if origin and ("*" in cfg.allowed_origins or origin in cfg.allowed_origins):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Vary"] = "Origin"
            if request.method == "OPTIONS":
                response.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
                response.headers["Access-Control-Allow-Headers"] = request.headers.get(
                    "Access-Control-Request-Headers", "Authorization, Content-Type"
                )
        if cfg.enable_log_requests:
            elapsed = time.monotonic() - getattr(g, "started", time.monotonic())
            log.info("%s %s %d %.1fms", request.method, rule, response.status_code,
                     elapsed * 1000)
        return response

    srv.write_watchdog = WriteWatchdog(
        APIKeyMiddleware(app.asgi_app, cfg.api_keys), connections=srv.connections,
        max_buffered=cfg.max_buffered_bytes, max_total_buffered=cfg.max_total_buffered_bytes)
    # Outermost: whatever ends a request, the generations it started are retired.
    app.asgi_app = RetireAtRequestEnd(srv.write_watchdog)  # type: ignore[method-assign]
    return app
