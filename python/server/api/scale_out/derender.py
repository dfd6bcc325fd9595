"""POST /v1/chat/completions/derender and /v1/completions/derender: a whole
/inference/v1/generate response (output_mode "tokens") turned into the OpenAI response the
coupled route gives: token ids decoded to text (the stop token left out, a stop string
cut), logprobs with their token texts, usage from the caller's prompt token counts.

Whole responses only: vLLM's per-chunk streaming derender (a client-carried decode state
per SSE chunk) is answered with a 400, as is a chat request with tools on a server with a
tool-call parser (the parsed message is not built here yet). Bounds come before any
decoding: at most MAX_CHOICES choices and prompts, no more token ids or logprob positions
than the context holds, no more alternatives per position than --max-logprobs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from actors.params.limits import MAX_N
from quart import Quart, Response

from server.api.common.chat_protocol import ChatCompletionRequest
from server.api.common.completion_protocol import CompletionRequest
from server.api.common.protocol import APIModel
from server.api.common.render_json import (
    LogprobStyle,
    chat_logprobs,
    completion_logprobs,
    logprob_style,
)
from server.api.http_io import accepts, built_json_response, check_model, parse, read_json
from server.errors import bad_request
from server.frontend.chat.tool_calls import chat_message
from server.frontend.logprobs import LogprobEntry, TopLogprob
from server.state import ServerState

PATHS = ("/v1/chat/completions/derender", "/v1/completions/derender")
MAX_CHOICES = MAX_N
SEED_TOKENS = 4  # prompt ids a decode starts from, so the first token's leading space stays


class GenerateLogprob(APIModel):
    token_id: int
    logprob: float
    rank: int | None = None


class GenerateLogprobContent(GenerateLogprob):
    top_logprobs: list[GenerateLogprob] = []


class GenerateLogprobs(APIModel):
    content: list[GenerateLogprobContent] | None = None


class GenerateChoice(APIModel):
    index: int
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    logprobs: GenerateLogprobs | None = None


class GenerateTokensResponse(APIModel):
    request_id: str
    choices: list[GenerateChoice]
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[Any] | None = None
    output_mode: str = "tokens"


class DerenderChatRequest(APIModel):
    stream: bool = False
    model: str | None = None
    generate_response: GenerateTokensResponse
    prompt_tokens: int | None = None
    prompt_token_ids: list[int] | None = None
    chat_request: ChatCompletionRequest | None = None


class DerenderCompletionRequest(APIModel):
    stream: bool = False
    model: str | None = None
    generate_responses: list[GenerateTokensResponse]
    prompt_tokens: list[int] | None = None
    prompt_token_ids: list[list[int] | None] | None = None
    completion_request: CompletionRequest | None = None


# -- checks -------------------------------------------------------------------------------
def _check_common(srv: ServerState, stream: bool, responses: Sequence[GenerateTokensResponse],
                  prompt_ids: Sequence[list[int] | None]) -> None:
    if stream:
        raise bad_request("streaming derender is not supported by this server yet; "
                          "derender the whole response, or use output_mode='text' on "
                          "/inference/v1/generate", "stream")
    assert srv.limits is not None and srv.limits.max_model_len is not None
    limit, max_lps = srv.limits.max_model_len, srv.limits.max_logprobs
    if len(responses) > MAX_CHOICES:
        raise bad_request(f"generate_responses count ({len(responses)}) exceeds server "
                          f"maximum ({MAX_CHOICES}).", "generate_responses")
    for gen in responses:
        if gen.output_mode != "tokens":
            raise bad_request("only output_mode='tokens' responses can be derendered",
                              "output_mode")
        if len(gen.choices) > MAX_CHOICES:
            raise bad_request(f"choices count ({len(gen.choices)}) in response "
                              f"'{gen.request_id}' exceeds server maximum ({MAX_CHOICES}).",
                              "choices")
        for c in gen.choices:
            if not c.token_ids:
                raise bad_request(f"choice {c.index} has empty or null token_ids",
                                  "token_ids")
            _check_ids(srv, c.token_ids, f"token_ids length ({len(c.token_ids)}) in choice "
                       f"{c.index} exceeds max_model_len ({limit}).")
            content = (c.logprobs.content if c.logprobs else None) or []
            if len(content) > limit:
                raise bad_request(f"logprobs.content length ({len(content)}) in choice "
                                  f"{c.index} exceeds max_model_len ({limit}).", "logprobs")
            for e in content:
                _check_ids(srv, [e.token_id, *(t.token_id for t in e.top_logprobs)], "")
                if max_lps is not None and max_lps >= 0 and len(e.top_logprobs) > max_lps + 1:
                    raise bad_request(f"top_logprobs count ({len(e.top_logprobs)}) in choice "
                                      f"{c.index} exceeds max_logprobs ({max_lps}).",
                                      "logprobs")
    for ids in prompt_ids:
        if ids is not None:
            _check_ids(srv, ids, f"prompt_token_ids length ({len(ids)}) exceeds "
                       f"max_model_len ({limit}).")


def _check_ids(srv: ServerState, ids: Sequence[int], too_long: str) -> None:
    assert srv.limits is not None
    if too_long and len(ids) > (srv.limits.max_model_len or 0):
        raise bad_request(too_long, "token_ids")
    for t in ids:
        if not 0 <= t < srv.limits.vocab_size:
            raise bad_request(f"Token id {t} is out of vocabulary", "token_ids")


# -- decoding (in a worker thread) ------------------------------------------------------------
class Decoder:
    """One request's decoding, as the engine's detokenizer would have done it."""

    def __init__(self, srv: ServerState, req: Any) -> None:
        self.backend = srv.tokenizer.backend_tokenizer
        self.texts = srv.token_texts  # logprob token texts, decoded once per id
        assert srv.actors is not None
        self.eos = set(srv.actors.info.eos_token_ids)
        self.req = req

    def text(self, choice: GenerateChoice, seed: Sequence[int]) -> tuple[str, int | str | None]:
        req = self.req
        ids, reason = list(choice.token_ids or ()), choice.stop_reason
        include = bool(req is not None and req.include_stop_str_in_output)
        stopped_on_token = choice.finish_reason == "stop" and (
            (isinstance(reason, int) and ids[-1] == reason)
            or (reason is None and (ids[-1] in self.eos
                                    or ids[-1] in ((req and req.stop_token_ids) or ()))))
        if stopped_on_token and not include:
            ids = ids[:-1]
        skip = req is None or req.skip_special_tokens is not False
        head = list(seed[-SEED_TOKENS:])
        prefix = self.backend.decode(head, skip_special_tokens=skip) if head else ""
        full = self.backend.decode(head + ids, skip_special_tokens=skip)
        text = full[len(prefix):] if full.startswith(prefix) else \
            self.backend.decode(ids, skip_special_tokens=skip)
        stops = [reason] if isinstance(reason, str) else []
        if choice.finish_reason == "stop" and reason is None and req is not None:
            stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or ())
        for stop in stops:
            at = text.find(stop)
            if at >= 0:
                return text[:at + len(stop)] if include else text[:at], stop
        return text, reason

    def logprobs(self, choice: GenerateChoice) -> list[LogprobEntry] | None:
        if choice.logprobs is None or choice.logprobs.content is None:
            return None
        out = []
        for e in choice.logprobs.content:
            ranked = sorted((t for t in e.top_logprobs if t.rank is not None),
                            key=lambda t: t.rank or 0)
            out.append(LogprobEntry(e.token_id, self.texts[e.token_id], e.logprob, tuple(
                TopLogprob(t.token_id, self.texts[t.token_id], t.logprob) for t in ranked)))
        return out


def _token_fields(srv: ServerState, body: ChatCompletionRequest | CompletionRequest | None
                  ) -> tuple[bool, LogprobStyle]:
    """The original request's return_token_ids and logprob style (the coupled route's; the
    generate route lists no ids, so its logprobs are the top ones)."""
    as_ids = None if body is None else body.return_tokens_as_token_ids
    style = logprob_style(as_ids, srv.config.return_tokens_as_token_ids, None)
    return body is not None and bool(body.return_token_ids), style


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion, "prompt_tokens_details": None}


def derender_chat(srv: ServerState, req: DerenderChatRequest, model: str) -> dict[str, Any]:
    chat = req.chat_request
    gen = req.generate_response
    decoder = Decoder(srv, chat)
    seed = req.prompt_token_ids or gen.prompt_token_ids or []
    top_n = (chat.top_logprobs or 0) if chat is not None and chat.logprobs else -1
    ids, style = _token_fields(srv, chat)
    choices = []
    for c in gen.choices:
        text, stop_reason = decoder.text(c, seed)
        lps = decoder.logprobs(c)
        choices.append({"index": c.index, "message": chat_message("assistant", text),
                        "logprobs": None if lps is None else chat_logprobs(lps, top_n, style),
                        "finish_reason": c.finish_reason, "stop_reason": stop_reason,
                        "token_ids": list(c.token_ids or ()) if ids else None,
                        "routed_experts": None, "weight_versions": None})
    completion = sum(len(c.token_ids or ()) for c in gen.choices)
    return {"id": gen.request_id, "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": choices, "service_tier": None,
            "system_fingerprint": None, "usage": _usage(req.prompt_tokens or 0, completion),
            "prompt_logprobs": gen.prompt_logprobs}


def derender_completion(srv: ServerState, req: DerenderCompletionRequest,
                        model: str) -> dict[str, Any]:
    cmpl = req.completion_request
    decoder = Decoder(srv, cmpl)
    n = len(req.generate_responses)
    counts = req.prompt_tokens or [0] * n
    seeds = req.prompt_token_ids or [None] * n
    num = -1 if cmpl is None or cmpl.logprobs is None else cmpl.logprobs
    ids, style = _token_fields(srv, cmpl)
    choices, completion, index = [], 0, 0
    for gen, seed in zip(req.generate_responses, seeds, strict=True):
        for c in gen.choices:
            text, stop_reason = decoder.text(c, seed or gen.prompt_token_ids or [])
            lps = decoder.logprobs(c)
            choices.append({"index": index, "text": text,
                            "logprobs": None if lps is None else completion_logprobs(
                                lps, 0, num, style=style),
                            "finish_reason": c.finish_reason, "stop_reason": stop_reason,
                            "token_ids": list(c.token_ids or ()) if ids else None,
                            "prompt_logprobs": None,
                            "prompt_token_ids": list(gen.prompt_token_ids or seed or [])
                            if ids else None,
                            "routed_experts": None, "weight_versions": None})
            completion += len(c.token_ids or ())
            index += 1
    return {"id": req.generate_responses[0].request_id, "object": "text_completion",
            "created": int(time.time()), "model": model, "choices": choices, "service_tier": None,
            "system_fingerprint": None, "usage": _usage(sum(counts), completion)}


def register(app: Quart, srv: ServerState) -> None:
    @app.post("/v1/chat/completions/derender")
    @accepts(DerenderChatRequest)
    async def chat_derender() -> Response:
        req = parse(DerenderChatRequest, await read_json())
        model = check_model(srv, req.model)
        _check_common(srv, req.stream, [req.generate_response], [req.prompt_token_ids])
        parser = srv.config.tool_call_parser
        if parser is not None and req.chat_request is None:
            raise bad_request("chat_request is required when a tool or reasoning parser is "
                              "configured because plain detokenization would leak raw "
                              "parser markup into content.", "chat_request")
        if parser is not None and req.chat_request is not None and req.chat_request.tools:
            raise bad_request("derendering tool calls is not supported by this server yet",
                              "chat_request.tools")
        return await built_json_response(lambda: derender_chat(srv, req, model), off_loop=True)

    @app.post("/v1/completions/derender")
    @accepts(DerenderCompletionRequest)
    async def completions_derender() -> Response:
        req = parse(DerenderCompletionRequest, await read_json())
        model = check_model(srv, req.model)
        if not req.generate_responses:
            raise bad_request("generate_responses must not be empty", "generate_responses")
        n = len(req.generate_responses)
        for name in ("prompt_tokens", "prompt_token_ids"):
            given = getattr(req, name)
            if given is not None and len(given) != n:
                raise bad_request(f"{name} length ({len(given)}) must equal "
                                  f"generate_responses length ({n})", name)
        _check_common(srv, req.stream, req.generate_responses, req.prompt_token_ids or [])
        return await built_json_response(lambda: derender_completion(srv, req, model),
                                         off_loop=True)
