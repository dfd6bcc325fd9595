"""A small OpenAPI document built from the routes and the request models; /docs works offline.

Each request model's nested models go to components/schemas (pydantic's `$defs` would be
resolved against the document root, where no `$defs` exists, so validators and fuzzers
could not follow them).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
import re
from typing import Any

from pydantic import BaseModel
from quart import Quart

from server import __version__

REF_TEMPLATE = "#/components/schemas/{model}"

_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "integer"},
            },
        }
    },
}


def body_schema(models: tuple[type[BaseModel], ...],
                components: dict[str, Any]) -> dict[str, Any]:
    """A request body's schema; the models it refers to are added to `components`."""
    refs = []
    for model in models:
        schema = model.model_json_schema(ref_template=REF_TEMPLATE)
        for name, sub in [*schema.pop("$defs", {}).items(), (model.__name__, schema)]:
            if components.setdefault(name, sub) != sub:
                raise ValueError(f"two different schemas are both named {name}")
        refs.append({"$ref": REF_TEMPLATE.format(model=model.__name__)})
    return refs[0] if len(refs) == 1 else {"anyOf": refs}


def _openapi_path(rule: str) -> str:
    """A route's path as OpenAPI writes it: /v1/responses/<response_id> ->
    /v1/responses/{response_id} (a converter prefix such as <int:n> dropped)."""
    return re.sub(r"<(?:[^<>:]+:)?([^<>:]+)>", r"{\1}", rule)


def openapi_document(app: Quart) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    components: dict[str, Any] = {}
    for rule in app.url_map.iter_rules():
        view = app.view_functions.get(rule.endpoint)
        if rule.endpoint in UNDOCUMENTED or getattr(view, "undocumented", False):
            continue
        if getattr(rule, "websocket", False):
            continue  # WS /v1/realtime: no HTTP operation (FastAPI's document omits them too)
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            op: dict[str, Any] = {
                "operationId": f"{rule.endpoint}_{method.lower()}",
                "responses": {
                    "200": {"description": "OK"},
                    "default": {
                        "description": "Error",
                        "content": {"application/json": {"schema": _ERROR}},
                    },
                },
            }
            # Each route declares its body models where it is registered (http_io.accepts).
            models = getattr(view, "request_bodies", None)
            if models is not None and method == "POST":
                op["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": body_schema(models, components)}},
                }
            if rule.arguments:
                op["parameters"] = [{"name": name, "in": "path", "required": True,
                                     "schema": {"type": "string"}}
                                    for name in sorted(rule.arguments)]
            paths.setdefault(_openapi_path(rule.rule), {})[method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "llmserve", "version": __version__},
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": dict(sorted(components.items()))},
    }


# A self-contained page (no CDN): lists the operations of /openapi.json.
DOCS_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>llmserve API</title>
<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}code{background:#eee}
pre{background:#f6f6f6;padding:1em;overflow:auto}</style></head>
<body><h1>llmserve API</h1><p>Machine-readable: <a href="openapi.json">/openapi.json</a></p>
<div id="ops">Loading...</div>
<script>
fetch("openapi.json").then(r => r.json()).then(doc => {
  const root = document.getElementById("ops"); root.textContent = "";
  for (const [path, ops] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(ops)) {
      const h = document.createElement("h3");
      h.innerHTML = "<code>" + method.toUpperCase() + " " + path + "</code>";
      root.appendChild(h);
      if (op.requestBody) {
        const body = op.requestBody.content["application/json"].schema;
        for (const ref of body.anyOf || [body]) {
          const name = ref.$ref.split("/").pop();
          const pre = document.createElement("pre");
          const props = doc.components.schemas[name].properties || {};
          pre.textContent = name + ": " + Object.keys(props).join(", ");
          root.appendChild(pre);
        }
      }
    }
  }
});
</script></body></html>
"""


# --enable-offline-docs: Swagger UI 5 (Apache-2.0, vendored from the swagger-ui-py wheel
# into server/docs_assets/swagger-ui with its LICENSE), served by this server: no CDN, so
# the page works where the network stops at the host. No validator badge (it calls out).
# (Not a folder named "static": Quart would serve that at /static whatever the flags.)
SWAGGER_DIR = Path(__file__).parent / "docs_assets" / "swagger-ui"
# Routes that serve the documentation's own files, left out of the document.
UNDOCUMENTED = frozenset({"static", "swagger_asset"})
SWAGGER_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>llmserve API</title>
<link rel="stylesheet" href="static/swagger-ui/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="static/swagger-ui/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({url: "openapi.json", dom_id: "#swagger-ui", validatorUrl: null,
                             deepLinking: true});
</script></body></html>
"""
_MIMETYPES = {".js": "text/javascript", ".css": "text/css"}


@cache
def swagger_asset_bytes(name: str) -> tuple[bytes, str]:
    """One vendored asset and its media type (read once)."""
    path = SWAGGER_DIR / name
    return path.read_bytes(), _MIMETYPES[path.suffix]
