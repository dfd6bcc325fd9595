"""The OpenAI Responses API: POST /v1/responses, GET /v1/responses/{id} and POST
/v1/responses/{id}/cancel.

A response is a chat turn: its input items become chat messages (responses_input), the
chat template renders them with the request's tools, tool choice is planned and enforced
as on chat (tools.plan_tools: "required" and named functions by constrained decoding),
`text.format` becomes the structured-outputs constraint chat's `response_format` is,
`--reasoning-parser` splits the reasoning off as on chat (a `reasoning` output item), and
the generation service runs it. responses_render shapes the output, whole or as typed
stream events (`event: <type>` + `data: <json>`, numbered by sequence_number).

Stored responses (server.frontend.responses_store, SQLite, off the event loop) serve GET and
`previous_response_id`: a later turn renders the stored conversation, then the stored
output, then its own input. `store: false` keeps nothing. Each row belongs to the client
of the request's API key (all clients are one without keys), which holds at most its
share of the store's bounds. A stored stream whose client leaves before its last event is
stored `incomplete` with what was generated so far.

`background: true` runs the response in the server's nursery (responses_background), which
also carries out cancels, of this server's responses and, through the store's rows, of those
another server on the same store file runs. GET reads the row, whichever server runs it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, TypeVar

import trio
from actors.params.sampling import SamplingParams
from actors.runtime.request import PromptInput
from quart import Quart, Response, request

from server import sse
from server.api.common.chat_protocol import ChatTool
from server.api.common.params import build_params, priority_header
from server.api.common.protocol import APIModel
from server.api.common.unsupported import check_unsupported
from server.api.http_io import accepts, check_model, json_response, parse, read_json
from server.api.openai.protocol.responses import ResponsesRequest
from server.api.openai.responses_background import BackgroundResponses
from server.api.openai.responses_input import conversation, input_messages, items_to_messages
from server.api.openai.responses_render import (
    EventCounter,
    OutputBuilder,
    ResponseShape,
    abandoned_body,
    failed_body,
    final_body,
    new_id,
)
from server.auth import presented_key
from server.errors import APIError, bad_request
from server.frontend import service
from server.frontend.chat.reasoning_plan import apply_reasoning, plan_reasoning
from server.frontend.chat.render import render_call, template_kwargs
from server.frontend.chat.request import ChatRequest
from server.frontend.chat.tools import ToolPlan, apply_plan, plan_tools
from server.frontend.context import context_of
from server.frontend.failures import ServiceFailure
from server.frontend.generation import detach_from_request, new_request_id
from server.frontend.reasoning_gate import gate_reasoning
from server.frontend.responses_store import UNFINISHED, ResponseStore, client_id
from server.frontend.service import ChoiceDelta, Failed, Finished, Idle, TextGeneration
from server.sse import sse_response
from server.state import ServerState

log = logging.getLogger("server.responses")

# A refusal of either kind: the request's own checks (APIError) or the service's.
_Named = TypeVar("_Named", APIError, ServiceFailure)

MAX_METADATA_PAIRS = 16  # OpenAI's bounds on `metadata`
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


def not_found(response_id: str, param: str = "response_id") -> APIError:
    return APIError(404, f"Response with id '{response_id[:256]}' not found.", param=param)


# -- the request -----------------------------------------------------------------------------
class _ToolRequest(APIModel):
    """The tool fields in chat's shape, for plan_tools (which checks them as chat does)."""

    tools: list[ChatTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    structured_outputs: Any = None


def _chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise bad_request(f"tools of type {kind!r} are not supported by this server; "
                              "only 'function' tools are", f"tools.{i}.type")
        out.append({"type": "function",
                    "function": {k: v for k, v in tool.items() if k != "type"}})
    return out


def _chat_tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function":
        raise bad_request(f"tool_choice of type {choice.get('type')!r} is not supported by "
                          "this server; use none, auto, required or "
                          '{"type": "function", "name": ...}', "tool_choice")
    return {"type": "function",
            "function": {k: v for k, v in choice.items() if k != "type"}}


def _tool_plan(srv: ServerState, req: ResponsesRequest) -> ToolPlan:
    fields: dict[str, Any] = {"parallel_tool_calls": req.parallel_tool_calls,
                              "structured_outputs": req.structured_outputs}
    if req.tools:  # the Responses API sends `tools: []` for no tools
        fields["tools"] = _chat_tools(req.tools)
    # "auto" and "none" without tools mean no tool calls, as the Responses API defaults them.
    if "tool_choice" in req.model_fields_set and (
            req.tools or req.tool_choice not in ("auto", "none")):
        fields["tool_choice"] = _chat_tool_choice(req.tool_choice)
    tools = parse(_ToolRequest, fields)
    structured = tools.structured_outputs
    if hasattr(structured, "model_dump"):
        structured = structured.model_dump(by_alias=True)
    return plan_tools(ChatRequest(
        messages=(),
        tools=None if tools.tools is None else tuple(
            t.model_dump(exclude_none=True) for t in tools.tools),
        tool_choice=tools.tool_choice, tool_choice_given="tool_choice" in tools.model_fields_set,
        parallel_tool_calls=tools.parallel_tool_calls, structured_outputs=structured,
    ), srv.config)


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    """`text.format` as chat's response_format (the constraint structured.spec_of reads)."""
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.get("type") == "text":
        return None
    if req.structured_outputs is not None:
        raise bad_request("Cannot specify both structured_outputs and text.format",
                          "structured_outputs")
    kind = fmt.get("type")
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise bad_request("text.format of type json_schema needs a `schema` object",
                              "text.format.schema")
        return {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}}
    raise bad_request(f"text.format.type {kind!r} is not one of text, json_object, "
                      "json_schema", "text.format.type")


def _check(req: ResponsesRequest, store: ResponseStore | None) -> None:
    if req.background:
        if not req.store:
            raise bad_request("background can only be used when `store` is true",
                              "background")
        if store is None:
            raise bad_request("background mode needs the response store, which this server "
                              "runs without (--no-responses-store)", "background")
        if req.stream:
            raise bad_request("background responses cannot be streamed by this server; "
                              "poll GET /v1/responses/{id} instead", "stream")
    if req.model_extra and req.model_extra.get("prompt") is not None:
        raise bad_request("prompt template is not supported", "prompt")
    meta = req.metadata or {}
    if len(meta) > MAX_METADATA_PAIRS or any(
            len(k) > MAX_METADATA_KEY or len(v) > MAX_METADATA_VALUE for k, v in meta.items()):
        raise bad_request(f"metadata holds at most {MAX_METADATA_PAIRS} pairs, keys of at "
                          f"most {MAX_METADATA_KEY} and values of at most "
                          f"{MAX_METADATA_VALUE} characters", "metadata")


def _top_logprobs(req: ResponsesRequest) -> int | None:
    """The logprobs to compute: only when `include` asks for the output's."""
    if "message.output_text.logprobs" not in (req.include or []):
        return None
    return req.top_logprobs or 0


def _sampling_params(srv: ServerState, req: ResponsesRequest, plan: ToolPlan) -> SamplingParams:
    req.n = 1  # one output per response
    req.stream_options = None
    # As chat: a forced tool choice's schema is the output's one constraint.
    req.response_format = None if plan.forced else _response_format(req)
    if req.truncation == "auto" and req.truncate_prompt_tokens is None:
        req.truncate_prompt_tokens = -1  # keep the end of the conversation that fits
    check_unsupported(req)
    assert srv.limits is not None
    params = build_params(req, max_tokens=req.max_output_tokens, logprobs=_top_logprobs(req),
                          defaults=srv.defaults, limits=srv.limits,
                          aliases={"max_tokens": "max_output_tokens",
                                   "logprobs": "top_logprobs"},
                          priority_header=priority_header(),
                          stream_interval=srv.config.stream_interval)
    return apply_plan(params, plan)


def _echo(req: ResponsesRequest, params: SamplingParams, stored: bool) -> dict[str, Any]:
    """The request fields the response object repeats (the effective sampling values)."""
    fmt = req.text.format if req.text is not None and req.text.format else {"type": "text"}
    return {"background": bool(req.background), "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "metadata": req.metadata or {},
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": req.reasoning.model_dump(exclude_none=True) if req.reasoning else None,
            "service_tier": "auto", "store": stored, "temperature": params.temperature,
            "text": {"format": fmt},
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": req.tools or [], "top_logprobs": req.top_logprobs or 0,
            "top_p": params.top_p, "truncation": req.truncation or "disabled",
            "user": req.user}


# -- the routes ------------------------------------------------------------------------------
class ResponsesAPI:
    """The routes' shared state: the store and the background responses running now."""

    def __init__(self, srv: ServerState) -> None:
        self.srv = srv
        cfg = srv.config
        # Each API key is a client of its own, named by a digest of the key.
        self.clients = frozenset(client_id(k) for k in cfg.api_keys if k) or frozenset({""})
        self.store = (None if cfg.responses_store is None else ResponseStore(
            cfg.responses_store, max_count=cfg.responses_store_max_count,
            max_age=cfg.responses_store_max_age, max_bytes=cfg.responses_store_max_bytes,
            clients=self.clients))
        self.background = None if self.store is None else BackgroundResponses(srv, self.store)

    def _client(self) -> str:
        """The request's client: the configured key it came with (the API-key middleware
        has let it in), as Authorization: Bearer or x-api-key; "" when no keys are set."""
        if self.clients == {""}:
            return ""
        cid = client_id(presented_key(request.scope.get("headers", [])))
        return cid if cid in self.clients else ""

    async def create(self, req: ResponsesRequest) -> Response:
        srv = self.srv
        model = check_model(srv, req.model)
        _check(req, self.store)
        history = await self._history(req.previous_response_id)
        messages = input_messages(req.input)
        plan = _tool_plan(srv, req)
        try:
            params = _sampling_params(srv, req, plan)
        except APIError as exc:
            raise _named_for_responses(exc) from None
        assert srv.renderer is not None
        chat = ChatRequest(
            messages=tuple(conversation(req.instructions, history, messages)),
            chat_template=req.chat_template, chat_template_kwargs=req.chat_template_kwargs,
            reasoning_effort=req.reasoning.effort if req.reasoning else None)
        kwargs = template_kwargs(chat, srv.renderer.default_kwargs,
                                 srv.config.reasoning_effort_map)
        params = gate_reasoning(srv, params, budget=req.thinking_token_budget,
                                template_kwargs=kwargs, include_reasoning=req.include_reasoning)
        render = render_call(srv.renderer, chat, plan.tools)
        thinking = plan_reasoning(chat, srv.config, default_kwargs=srv.renderer.default_kwargs,
                                  tokenizer=srv.tokenizer,
                                  include_reasoning=req.include_reasoning,
                                  tool_parser=plan.auto_parser)
        params = apply_reasoning(params, thinking)
        store = self.store if req.store else None
        client = self._client()
        shape = ResponseShape(response_id=new_id("resp"), model=model,
                              echo=_echo(req, params, store is not None),
                              metrics=srv.config.enable_per_request_metrics)
        turn = history + messages  # what a later turn continues, before this one's output
        if req.background:
            detach_from_request()  # the generation outlives this request
        rid = new_request_id(request.headers.get("X-Request-Id"), req.request_id)
        try:
            gen = await service.start(context_of(srv), rid, [PromptInput(render=render)], params)
        except ServiceFailure as exc:
            raise _named_for_responses(exc) from None
        builder = OutputBuilder(plan, _top_logprobs(req), thinking, gen.prompts[0].text)
        if req.background:
            assert self.background is not None  # _check: background needs the store
            return json_response(await self.background.start(gen, shape, builder, turn,
                                                             client))
        if req.stream:
            return sse_response(self._events(gen, shape, builder, store, turn, client))
        result = await gen.collect()
        choice = result.choices[0]
        builder.feed_whole(choice)
        body = final_body(shape, builder, result.usage, choice.finish_reason, choice.timing)
        if store is not None:
            await store.put(body, turn, client)
        return json_response(body)

    async def _history(self, previous_id: str | None) -> list[dict[str, Any]]:
        """The earlier turns of the conversation `previous_id` ends, as chat messages."""
        if previous_id is None:
            return []
        prev = None if self.store is None else await self.store.get(previous_id)
        if prev is None:
            raise not_found(previous_id, "previous_response_id")
        if prev.status in UNFINISHED:
            raise bad_request(f"Response with id '{previous_id}' has not finished yet "
                              f"(status {prev.status}).", "previous_response_id")
        return prev.messages + items_to_messages(prev.body.get("output") or [])

    async def _events(self, gen: TextGeneration, shape: ResponseShape, builder: OutputBuilder,
                      store: ResponseStore | None, turn: list[dict[str, Any]],
                      client: str) -> AsyncIterator[bytes]:
        counter = EventCounter()

        def out(event: dict[str, Any]) -> bytes:
            return sse.event(counter.number(event), event["type"])

        finish: str | None = None
        generated = 0  # tokens so far
        final: dict[str, Any] | None = None
        try:
            opening = shape.body("in_progress", [])
            yield out({"type": "response.created", "response": opening})
            yield out({"type": "response.in_progress", "response": opening})
            async with aclosing(gen.stream(idle_after=sse.KEEPALIVE_INTERVAL)) as events:
                async for ev in events:
                    if isinstance(ev, ChoiceDelta):
                        finish = ev.finish_reason or finish
                        generated = ev.generated_tokens
                        for event in builder.feed(ev.text, ev.logprobs, ev.finish_reason,
                                                  ev.token_ids):
                            yield out(event)
                    elif isinstance(ev, Idle):
                        yield sse.KEEPALIVE
                    elif isinstance(ev, Failed):
                        final = failed_body(shape, builder, ev.message)
                    elif isinstance(ev, Finished):
                        final = final_body(shape, builder, ev.usage, finish, ev.timing)
                    if final is not None:
                        if store is not None:  # before the last event: a client may go then
                            await store.put(final, turn, client)
                        yield out({"type": f"response.{final['status']}", "response": final})
                        return
        finally:
            gen.retire()
            if store is not None and final is None:
                # The client left first (or the stream broke): keep what it got.
                with trio.CancelScope(shield=True):  # the request's scope is cancelled
                    try:
                        await store.put(abandoned_body(shape, builder, gen.usage(generated),
                                                       finish), turn, client)
                    except Exception:
                        log.exception("response %s: storing its abandoned stream failed",
                                      shape.id)

    async def retrieve(self, response_id: str) -> dict[str, Any]:
        stored = None if self.store is None else await self.store.get(response_id)
        if stored is None:
            raise not_found(response_id)
        return stored.body

    async def cancel(self, response_id: str) -> dict[str, Any]:
        final = None if self.background is None else await self.background.cancel(response_id)
        if final is None:
            raise not_found(response_id)
        return final


def _named_for_responses(exc: _Named) -> _Named:
    """A refusal names the field the client sent: `text.format` for the constraint chat
    calls response_format, `input` for the prompt."""
    if exc.param is not None and exc.param.startswith("response_format"):
        exc.param = "text.format" + exc.param[len("response_format"):]
    elif exc.param == "prompt":
        exc.param = "input"
    return exc


def register(app: Quart, srv: ServerState) -> None:
    api = ResponsesAPI(srv)

    if api.background is not None:
        app.after_serving(api.background.close)

    @app.post("/v1/responses")
    @accepts(ResponsesRequest)
    async def v1_responses() -> Response:
        return await api.create(parse(ResponsesRequest, await read_json()))

    @app.get("/v1/responses/<response_id>")
    async def v1_response(response_id: str) -> Response:
        if request.args.get("stream", "false").lower() not in ("false", "0", ""):
            raise bad_request("streaming a stored response is not supported by this server",
                              "stream")
        return json_response(await api.retrieve(response_id))

    @app.post("/v1/responses/<response_id>/cancel")
    async def v1_response_cancel(response_id: str) -> Response:
        return json_response(await api.cancel(response_id))
