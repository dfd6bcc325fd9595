"""The operational routes, outside any model API: health and ping, version, load,
Prometheus metrics, and the API's own description (/openapi.json, /docs: a plain list of
operations, or with --enable-offline-docs Swagger UI from assets in the package).
/server_info is an operator route (server/api/dev.py)."""

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

    @app.route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:
        return await health()

    @app.get("/version")
    async def version() -> Response:
        return json_response({"version": __version__})

    @app.get("/load")
    async def load() -> Response:
        return json_response({"server_load": len(srv.registry or ())})

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
