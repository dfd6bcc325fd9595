"""POST /inference/v1/generate (token ids and SamplingParams in; token ids, logprobs and,
with output_mode "text", text out; streamed or whole) and POST /inference/v1/abort_requests,
in vLLM 0.33's shapes.

The prompt is the request's token ids as they are (the same PromptInput /v1/completions
builds for a token-id prompt, so both give the same tokens); sampling_params is mapped by
the completions route's own build_params. The response's request_id,
"generate-tokens-{id}", is what abort_requests takes: abort ends each unfinished choice
with finish_reason "abort", and a stream still delivers those ends, then [DONE].

Logprobs: each position's top_logprobs is the sampled token first, then the top ones (as
vLLM sends them). A sampled token's rank is its place among the top ones, or null when it
is not among them (this engine does not compute the rank of tokens outside the top).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from actors.runtime.messages import ChoiceTiming
from actors.runtime.request import PromptInput
from quart import Quart, Response, request

from server.api.common.params import build_params, check_stream_options
from server.api.common.render_json import (
    MIN_LOGPROB,
    prompt_logprobs_json,
    response_usage_json,
    usage_json,
)
from server.api.common.stream import sse_body
from server.api.http_io import accepts, built_json_response, check_model, parse, read_json
from server.api.scale_out.protocol import AbortRequests, GenerateRequest
from server.errors import APIError, bad_request
from server.frontend import service
from server.frontend.chat.tool_calls import chat_message
from server.frontend.context import context_of
from server.frontend.generation import new_request_id
from server.frontend.logprobs import LogprobEntry
from server.frontend.service import ChoiceDelta, Collected, TextGeneration, Usage
from server.sse import sse_response
from server.state import ServerState

PATHS = ("/inference/v1/generate", "/inference/v1/abort_requests")

# vLLM SamplingParams fields that would change the output and are not implemented here.
_UNSUPPORTED = {
    "prompt_logprob_token_ids": "prompt_logprob_token_ids",
    "prompt_logprob_start": "prompt_logprob_start",
    "logprob_token_ids": "logprob_token_ids",
    "bad_words": "bad_words",
    "thinking_token_budget": "thinking_token_budget",
    "watermarking": "watermarking",
    "extra_args": "extra_args",
    "routed_experts_prompt_start": "routed experts",
    "use_beam_search": "beam search",
}


# -- the request --------------------------------------------------------------------------
def _checked(srv: ServerState, req: GenerateRequest) -> Any:
    """The request's SamplingParams, vLLM's refusals first."""
    sp = req.sampling_params
    extra = sp.model_extra or {}
    for name, what in _UNSUPPORTED.items():
        if extra.get(name):
            raise bad_request(f"{what} is not supported by this server yet",
                              f"sampling_params.{name}")
    if not sp.spaces_between_special_tokens:
        raise bad_request("spaces_between_special_tokens=false is not supported by this "
                          "server yet", "sampling_params.spaces_between_special_tokens")
    if any(t < 0 for t in req.token_ids):
        raise bad_request("token_ids must not contain negative values", "token_ids")
    if req.output_mode != "tokens" and not sp.detokenize:
        raise bad_request(f"output_mode={req.output_mode!r} requires "
                          "sampling_params.detokenize to be true", "output_mode")
    for name in ("features", "content_parts"):
        if getattr(req, name):
            raise bad_request("multimodal inputs are not supported by this server", name)
    for name in ("kv_transfer_params", "ec_transfer_params"):
        if getattr(req, name):
            raise bad_request(f"{name} needs a KV connector, which this server does not "
                              "have", name)
    if srv.config.tokens_only:
        if sp.stop:
            raise bad_request("stop strings are not supported on a --tokens-only server "
                              "because detokenization is disabled. Check stop strings on "
                              "the coordinator, or use stop_token_ids.", "sampling_params.stop")
        if req.output_mode != "tokens":
            raise bad_request(f"output_mode={req.output_mode!r} requires a tokenizer, but "
                              "this server does not load one (--tokens-only). Send the "
                              "request to a server that loads a tokenizer, or use "
                              "output_mode='tokens'.", "output_mode")
    if req.output_mode == "derender":
        if req.stream:
            raise bad_request("output_mode='derender' does not support stream=true.",
                              "output_mode")
        if (req.parse_context or {}).get("tools"):
            raise bad_request("output_mode='derender' with tools is not supported by this "
                              "server yet", "parse_context.tools")
    # The route's fields that SamplingFields reads live at the top level here.
    sp.stream, sp.stream_options = req.stream, req.stream_options
    sp.priority, sp.cache_salt = req.priority, req.cache_salt
    check_stream_options(sp)
    max_tokens = sp.max_tokens if "max_tokens" in sp.model_fields_set else None
    assert srv.limits is not None
    try:
        return build_params(sp, max_tokens=max_tokens, logprobs=sp.logprobs,
                            defaults=srv.defaults, limits=srv.limits,
                            prompt_logprobs=None if req.stream else sp.prompt_logprobs,
                            stream_interval=srv.config.stream_interval)
    except APIError as exc:
        if exc.param and exc.param not in ("stream_options", "priority", "cache_salt"):
            exc.param = f"sampling_params.{exc.param}"
        raise


# -- the response ---------------------------------------------------------------------------
def _ranked(lp: LogprobEntry) -> list[tuple[int, str, float, int | None]]:
    """(token id, text, logprob, rank): the sampled token first, then the top ones."""
    out: list[tuple[int, str, float, int | None]] = []
    sampled_rank = None
    for r, t in enumerate(lp.top, start=1):
        if t.token_id == lp.token_id:
            sampled_rank = r
        else:
            out.append((t.token_id, t.text, t.logprob, r))
    return [(lp.token_id, lp.text, lp.logprob, sampled_rank), *out]


def _clamped(v: float) -> float:
    return max(v, MIN_LOGPROB)  # NaN too


def tokens_logprobs(items: Sequence[LogprobEntry]) -> dict[str, Any]:
    content = []
    for lp in items:
        ranked = _ranked(lp)
        content.append({"token_id": lp.token_id, "logprob": _clamped(lp.logprob),
                        "rank": ranked[0][3],
                        "top_logprobs": [{"token_id": t, "logprob": _clamped(v), "rank": r}
                                         for t, _, v, r in ranked]})
    return {"content": content}


def text_logprobs(items: Sequence[LogprobEntry]) -> dict[str, Any]:
    content = []
    for lp in items:
        content.append({"token": lp.text, "logprob": _clamped(lp.logprob),
                        "bytes": list(lp.bytes),
                        "top_logprobs": [{"token": text, "logprob": _clamped(v),
                                          "bytes": list(text.encode())}
                                         for _, text, v, _ in _ranked(lp)]})
    return {"content": content}


class GenerateRenderer:
    """The chunks and the whole body of one generate response (sse_body's ChunkRenderer)."""

    def __init__(self, gen: TextGeneration, req: GenerateRequest, request_id: str,
                 model: str, logprobs: bool) -> None:
        self.gen, self.req, self.request_id, self.model = gen, req, request_id, model
        self.mode = req.output_mode
        self.logprobs = logprobs
        opts = req.stream_options
        self.include_usage = bool(opts and opts.include_usage)
        self.continuous_usage = self.include_usage and bool(opts and opts.continuous_usage_stats)
        self.prompt_ids_pending = bool(req.return_token_ids)

    def _logprobs_json(self, items: Sequence[LogprobEntry]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        return tokens_logprobs(items) if self.mode == "tokens" else text_logprobs(items)

    def _choice(self, index: int, finish: str | None, stop: str | int | None,
                token_ids: list[int], text: str, logprobs: Sequence[LogprobEntry],
                ) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": index, "finish_reason": finish, "stop_reason": stop,
            "token_ids": token_ids, "routed_experts": None, "sampling_mask": None,
            "weight_versions": None}
        if self.mode == "derender":
            choice["message"] = chat_message("assistant", text)
        elif self.mode == "text":
            choice["text"] = text
        choice["logprobs"] = self._logprobs_json(logprobs)
        return choice

    def first_chunks(self) -> list[dict[str, Any]]:
        return []

    def chunk(self, d: ChoiceDelta) -> dict[str, Any] | None:
        if not (d.token_ids or d.finish_reason is not None or (self.mode == "text" and d.text)):
            return None
        usage = None
        if self.continuous_usage:
            usage = response_usage_json(self.gen.choice_usage(d.index, d.generated_tokens))
        chunk: dict[str, Any] = {"request_id": self.request_id, "usage": usage}
        if self.prompt_ids_pending:
            self.prompt_ids_pending = False
            chunk["prompt_token_ids"] = self.gen.prompt_of(d.index).token_ids
        chunk["output_mode"] = self.mode
        chunk["choices"] = [self._choice(d.index, d.finish_reason, d.stop_reason,
                                         d.token_ids, d.text, d.logprobs)]
        return chunk

    def final(self, usage: Usage, timing: ChoiceTiming | None = None
              ) -> dict[str, Any] | None:
        """The usage chunk; no timing metrics (vLLM's generate route has none)."""
        if not self.include_usage:
            return None
        u = usage_json(usage)
        return {"request_id": self.request_id,
                "usage": {"prompt_tokens": u["prompt_tokens"], "total_tokens": u["total_tokens"],
                          "completion_tokens": u["completion_tokens"]},
                "output_mode": self.mode, "choices": []}

    def response(self, result: Collected) -> dict[str, Any]:
        choices = [self._choice(r.index, r.finish_reason or "stop", r.stop_reason,
                                r.token_ids, r.text, r.logprobs) for r in result.choices]
        return {
            "request_id": self.request_id, "model": self.model, "created": self.gen.created,
            "usage": response_usage_json(result.usage),
            "prompt_logprobs": prompt_logprobs_json(result.prompt_logprobs[0]),
            "prompt_token_id_logprobs": None,
            "prompt_token_ids": self.gen.prompts[0].token_ids if self.req.return_token_ids
            else None,
            "mm_placeholders": None, "metrics": None,
            "kv_transfer_params": None, "ec_transfer_params": None,
            "output_mode": self.mode, "choices": choices,
        }


# -- running requests, by the id abort_requests names -------------------------------------
class Running:
    """The generate requests in flight, by their response request_id (ids may repeat)."""

    def __init__(self) -> None:
        self._by_id: dict[str, list[TextGeneration]] = {}

    def add(self, request_id: str, gen: TextGeneration) -> None:
        self._by_id.setdefault(request_id, []).append(gen)

    def remove(self, request_id: str, gen: TextGeneration) -> None:
        gens = self._by_id.get(request_id, [])
        if gen in gens:
            gens.remove(gen)
        if not gens:
            self._by_id.pop(request_id, None)

    def abort(self, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            for gen in list(self._by_id.get(rid, ())):
                gen.abort()


async def _tracked(body: AsyncIterator[bytes], running: Running, request_id: str,
                   gen: TextGeneration) -> AsyncIterator[bytes]:
    try:
        async for part in body:
            yield part
    finally:
        running.remove(request_id, gen)


async def handle(srv: ServerState, running: Running, req: GenerateRequest) -> Response:
    model = check_model(srv, req.model)
    params = _checked(srv, req)
    base = new_request_id(request.headers.get("X-Request-Id"), req.request_id)
    request_id = f"generate-tokens-{base}"
    gen = await service.start(context_of(srv), base,
                              [PromptInput(token_ids=list(req.token_ids))], params)
    running.add(request_id, gen)
    renderer = GenerateRenderer(gen, req, request_id, model, params.logprobs is not None)
    if req.stream:
        return sse_response(_tracked(sse_body(gen, renderer), running, request_id, gen))
    try:
        result = await gen.collect()
    finally:
        running.remove(request_id, gen)
    return await built_json_response(
        lambda: renderer.response(result),
        off_loop=params.logprobs is not None or params.prompt_logprobs is not None)


async def abort_requests(running: Running) -> Response:
    body = await read_json()
    if body.get("request_ids") is None:
        raise bad_request("Missing 'request_ids' in request body", "request_ids")
    running.abort(parse(AbortRequests, body).request_ids)
    return Response(b"", status=200)


def register(app: Quart, srv: ServerState) -> None:
    running = Running()

    @app.post("/inference/v1/generate")
    @accepts(GenerateRequest)
    async def inference_generate() -> Response:
        return await handle(srv, running, parse(GenerateRequest, await read_json()))

    @app.post("/inference/v1/abort_requests")
    @accepts(AbortRequests)
    async def inference_abort() -> Response:
        return await abort_requests(running)

    if srv.config.tokens_only and not srv.config.enable_dev_endpoints:
        # vLLM's older path for tokens-only servers (with dev endpoints, theirs serves it);
        # here it needs the API key like every other route.
        @app.post("/abort_requests")
        @accepts(AbortRequests)
        async def legacy_abort() -> Response:
            return await abort_requests(running)

