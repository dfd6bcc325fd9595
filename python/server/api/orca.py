"""ORCA load reports: the ``endpoint-load-metrics`` response header, as vLLM emits it for
load-aware routers (Envoy's and the Gateway API inference extension's ORCA readers).

A client asks with the request header ``endpoint-load-metrics-format: TEXT`` or ``JSON``
(any case). A successful non-streamed answer of ``/v1/completions`` or
``/v1/chat/completions`` (also when ``/invocations`` dispatched the body there) then
carries the scheduler's live gauges at the moment the answer is built:

    endpoint-load-metrics: TEXT named_metrics.num_requests_waiting=0.0, named_metrics.kv_cache_usage_perc=0.25
    endpoint-load-metrics: JSON {"named_metrics": {"num_requests_waiting": 0.0, "kv_cache_usage_perc": 0.25}}

Names, order and number text are vLLM's (its Prometheus snapshot of
``vllm:num_requests_waiting`` then ``vllm:kv_cache_usage_perc``, each value a Python
float). With several data-parallel engines each engine's gauge is listed, engine by
engine within each name, as vLLM's snapshot lists them (so JSON keeps the last engine's).
Any other format asks for nothing: no header, the request served as usual (vLLM logs a
warning and does the same; here it is a debug line, since a client writes it). Streams, errors and every other route carry no header.
"""

from __future__ import annotations

import json
import logging

from quart import Quart, Response, g, request

from server.state import ServerState

log = logging.getLogger("server.orca")

FORMAT_HEADER = "endpoint-load-metrics-format"
HEADER = "endpoint-load-metrics"
ROUTES = frozenset({"/v1/completions", "/v1/chat/completions"})
FORMATS = ("text", "json")


def orca_header(metrics_format: str, named_metrics: list[tuple[str, float]]) -> str | None:
    """The header's value in the format asked (TEXT or JSON, any case), else None."""
    fmt = metrics_format.lower()
    if fmt == "text":
        return "TEXT " + ", ".join(f"named_metrics.{name}={value}"
                                   for name, value in named_metrics)
    if fmt == "json":
        return "JSON " + json.dumps({"named_metrics": dict(named_metrics)})
    return None


def register(app: Quart, srv: ServerState) -> None:
    @app.after_request
    async def add_load_report(response: Response) -> Response:
        fmt = request.headers.get(FORMAT_HEADER, "")
        if not fmt or response.status_code != 200 or response.mimetype != "application/json":
            return response
        rule = request.url_rule.rule if request.url_rule is not None else None
        if rule == "/invocations":
            rule = g.get("invocation_route")
        if rule not in ROUTES or srv.metrics is None:
            return response
        value = orca_header(fmt, srv.metrics.load_gauges())
        if value is None:
            log.debug("%s %r is not a format of the ORCA header (TEXT, JSON)", FORMAT_HEADER,
                        fmt[:100])
        else:
            response.headers[HEADER] = value
        return response
