"""The operational routes, outside any model API: health and ping, readiness, version, load,
Prometheus metrics, the KV-event sources, and the API's own description (/openapi.json,
/docs: a plain list of operations, or with --enable-offline-docs Swagger UI from assets in
the package). /server_info is an operator route (server/api/dev.py).

/health is liveness with a reason (503 with the state in our envelope while loading,
draining or failed); /ready and /readyz are vLLM's readiness probes (its data-parallel
supervisor's): 200 once every engine is up and serving, 503 otherwise, both with an empty
body. A paused or sleeping engine is still ready, as vLLM's: its /health stays 200 then.
/kv_event_sources is vLLM's map of data-parallel rank -> the KV-event publisher that rank
runs (its resolved KVEventsConfig), {} without --kv-events-config."""

from __future__ import annotations

from quart import Quart, Response

from server import __version__
from server.api.http_io import json_response
from server.errors import APIError
from server.openapi import DOCS_HTML, SWAGGER_HTML, openapi_document, swagger_asset_bytes
from server.state import ServerState

# Until the model is loaded the metrics actor does not exist; scrapers still get a 200.
LOADING_METRICS = (b"# HELP llmserve_model_loading 1 while the model loads (the other metrics "
                   b"appear once it has loaded)\n# TYPE llmserve_model_loading gauge\n"
                   b"llmserve_model_loading 1.0\n")


def register(app: Quart, srv: ServerState) -> None:
    @app.get("/health")
    async def health() -> Response:
        if srv.health.serving:
            return Response(b"", status=200)
        state = "loading" if srv.health.loading else "draining" if srv.health.draining else "failed"
        raise APIError(503, f"The server is {state}.")

    @app.get("/ready")
    @app.get("/readyz", endpoint="readyz")
    async def ready() -> Response:
        return Response(b"", status=200 if srv.health.serving else 503)

    @app.route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:
        return await health()

    @app.get("/version")
    async def version() -> Response:
        return json_response({"version": __version__})

    @app.get("/load")
    async def load() -> Response:
        return json_response({"server_load": len(srv.registry or ())})

    @app.get("/kv_event_sources")
    async def kv_event_sources() -> Response:
        return json_response({str(rank): source
                              for rank, source in sorted(srv.kv_event_sources.items())})

    @app.get("/metrics")
    async def metrics() -> Response:
        body = LOADING_METRICS if srv.metrics is None else srv.metrics.exposition()
        return Response(body, mimetype="text/plain; version=0.0.4")

    @app.get("/openapi.json")
    async def openapi() -> Response:
        return json_response(openapi_document(app))

    if srv.config.enable_offline_docs:
        @app.get("/docs")
        async def docs() -> Response:
            return Response(SWAGGER_HTML, mimetype="text/html")

        @app.get("/static/swagger-ui/<any('swagger-ui-bundle.js', 'swagger-ui.css'):name>")
        async def swagger_asset(name: str) -> Response:
            body, mimetype = swagger_asset_bytes(name)
            response = Response(body, mimetype=mimetype)
            response.headers["Cache-Control"] = "public, max-age=86400"
            return response
    else:
        @app.get("/docs")
        async def docs() -> Response:
            return Response(DOCS_HTML, mimetype="text/html")
