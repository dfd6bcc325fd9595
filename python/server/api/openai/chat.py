"""POST /v1/chat/completions."""

from __future__ import annotations

from typing import Any

from quart import Quart, Response, request

from actors.runtime.request import PromptInput
from server.errors import bad_request
from server.generation import Generation, new_request_id
from server.api.http_io import accepts, built_json_response, check_model, parse, read_json
from server.api.openai.protocol.chat import ChatCompletionRequest
from server.api.openai.stream import chat_logprobs, collect, prompt_logprobs_json
from server.api.openai.stream import response_usage, sse_stream
from server.api.openai.params import build_params, check_stream_options
from server.sse import sse_response
from server.state import ServerState
from server.unsupported import check_unsupported


def render_call(srv: ServerState, req: Any) -> Any:
    """Validate the chat inputs now; return the deferred render (run by the tokenizer)."""
    assert srv.renderer is not None
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    return srv.renderer.prepare(
        messages,
        request_template=req.chat_template,
        kwargs=template_kwargs(req),
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message,
        tools=getattr(req, "tools", None),
        documents=getattr(req, "documents", None),
    )


def template_kwargs(req: Any) -> dict[str, Any] | None:
    """chat_template_kwargs, plus reasoning_effort as vLLM passes it on: under its own name,
    and as enable_thinking unless the request's kwargs set that (a template that reads
    neither never sees them)."""
    effort = getattr(req, "reasoning_effort", None)
    if effort is None:
        return req.chat_template_kwargs
    kwargs = dict(req.chat_template_kwargs or {}, reasoning_effort=effort)
    kwargs.setdefault("enable_thinking", effort != "none")
    return kwargs


def check_tools(req: ChatCompletionRequest) -> None:
    if req.tools is not None and len(req.tools) == 0:
        raise bad_request("tools must not be an empty list", "tools")
    choice = req.tool_choice
    if choice is None or choice == "none":
        return
    if req.tools is None:
        raise bad_request("tool_choice needs tools", "tool_choice")
    raise bad_request(
        "tool_choice other than 'none' needs a tool-call parser, which this server does not "
        "have", "tool_choice",
    )


def response_role(req: ChatCompletionRequest) -> str:
    """As vLLM: the assistant's, unless no generation prompt is added (the model then
    continues the last message, whose role the response reports)."""
    return "assistant" if req.add_generation_prompt else req.messages[-1].role


def echo_text(req: ChatCompletionRequest, role: str) -> str:
    """echo: the last message's content when it has the response's role ("" otherwise);
    text parts are joined with newlines, as the template sees them."""
    last = req.messages[-1]
    if not req.echo or last.role != role:
        return ""
    content = last.content
    if content is None or isinstance(content, str):
        return content or ""
    return "\n".join(p.text or "" for p in content)


def message(role: str, content: str) -> dict[str, Any]:
    # vLLM's shape: tool_calls is left out when there are none; the rest are null.
    return {"role": role, "content": content, "refusal": None, "annotations": None,
            "audio": None, "function_call": None, "reasoning": None}


async def handle(srv: ServerState, req: ChatCompletionRequest) -> Response:
    model = check_model(srv, req.model)
    check_stream_options(req)
    check_tools(req)
    check_unsupported(req)
    limits = srv.limits
    assert limits is not None
    top = req.top_logprobs
    if top is not None and top != 0 and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
    logprobs = (top or 0) if req.logprobs else None
    max_tokens = req.max_completion_tokens
    if max_tokens is None:
        max_tokens = req.max_tokens
    # As vLLM: echo scores the prompt with top_logprobs alternatives (0 unless given) unless
    # prompt_logprobs says otherwise; a stream computes none (build_params refuses k > 0).
    prompt_lps = req.prompt_logprobs
    if prompt_lps is None and req.echo:
        prompt_lps = top or 0
    # A 400 names the field the client sent: chat's number of logprobs is top_logprobs.
    aliases = {"logprobs": "top_logprobs"}
    if req.max_completion_tokens is not None:
        aliases["max_tokens"] = "max_completion_tokens"
    params = build_params(req, max_tokens=max_tokens, logprobs=logprobs, defaults=srv.defaults,
                          limits=limits, prompt_logprobs=None if req.stream else prompt_lps,
                          aliases=aliases)
    render = render_call(srv, req)
    prompts = [PromptInput(render=render, add_special_tokens=req.add_special_tokens)]
    rid = new_request_id(request.headers.get("X-Request-Id"), req.request_id)
    gen = Generation(srv, rid, prompts, params)
    await gen.start()
    response_id = f"chatcmpl-{rid}"
    texts = srv.token_texts
    role = response_role(req)
    echoed = echo_text(req, role)

    if not req.stream:
        try:
            results = await collect(gen)
        finally:
            gen.retire()

        def build() -> dict[str, Any]:
            choices = [
                {
                    "index": r.index,
                    "message": message(role, echoed + r.text),
                    "logprobs": chat_logprobs(texts, r.logprobs, top or 0)
                    if req.logprobs else None,
                    "finish_reason": r.finish_reason,
                    "stop_reason": r.stop_reason,
                }
                for r in results
            ]
            return {
                "id": response_id, "object": "chat.completion", "created": gen.created,
                "model": model, "choices": choices, "service_tier": None,
                "system_fingerprint": srv.fingerprint,
                "usage": response_usage(gen, sum(r.num_tokens for r in results)),
                "prompt_logprobs": prompt_logprobs_json(
                    texts, results[0].prompt_logprobs if results else None),
            }

        return await built_json_response(
            build, off_loop=bool(req.logprobs) or params.prompt_logprobs is not None)

    opts = req.stream_options
    include_usage = bool(opts and opts.include_usage)

    def base() -> dict[str, Any]:
        return {"id": response_id, "object": "chat.completion.chunk", "created": gen.created,
                "model": model}

    def first_chunks() -> list[dict[str, Any]]:
        # One role chunk per choice, then (echo) one chunk per choice with the echoed text.
        chunks = [
            dict(base(), choices=[{"index": i, "delta": {"role": role, "content": ""},
                                   "logprobs": None, "finish_reason": None}])
            for i in range(gen.state.num_choices)
        ]
        if echoed:
            chunks += [
                dict(base(), choices=[{"index": i, "delta": {"content": echoed},
                                       "logprobs": None, "finish_reason": None}])
                for i in range(gen.state.num_choices)
            ]
        return chunks

    def chunk_of(u: Any) -> dict[str, Any] | None:
        if not u.text and not u.token_ids and u.finish_reason is None:
            return None
        # A token whose text is held back still gets its chunk (content "", its logprobs),
        # as vLLM sends it; a finish without any token has an empty delta.
        delta = {"content": u.text} if u.text or u.token_ids else {}
        choice: dict[str, Any] = {"index": u.index, "delta": delta,
                                  "logprobs": chat_logprobs(texts, u.logprobs, top or 0)
                                  if req.logprobs else None,
                                  "finish_reason": u.finish_reason}
        chunk = dict(base(), choices=[choice])
        if u.finish_reason is not None:
            choice["stop_reason"] = u.stop_reason
            if not include_usage:
                chunk["system_fingerprint"] = srv.fingerprint
        return chunk

    def final_chunk(use: dict[str, int]) -> dict[str, Any]:
        return dict(base(), choices=[], usage=use, system_fingerprint=srv.fingerprint)

    return sse_response(sse_stream(
        gen, first_chunks=first_chunks, chunk_of=chunk_of,
        final_chunk=final_chunk if include_usage else None,
        continuous_usage=include_usage and bool(opts and opts.continuous_usage_stats),
    ))


def register(app: Quart, srv: ServerState) -> None:
    @app.post("/v1/chat/completions")
    @accepts(ChatCompletionRequest)
    async def v1_chat() -> Response:
        return await handle(srv, parse(ChatCompletionRequest, await read_json()))
