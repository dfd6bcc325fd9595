"""POST /v1/chat/completions."""

from __future__ import annotations

from typing import Any

from quart import Response, request

from actors.runtime.request import PromptInput
from server.errors import bad_request
from server.generation import Generation, new_request_id
from server.protocol.chat import ChatCompletionRequest
from server.routes.common import check_model, json_response, sse_response
from server.routes.stream import chat_logprobs, collect, sse_stream, usage
from server.sampling import build_params, check_stream_options
from server.state import ServerState


def render_call(srv: ServerState, req: Any) -> Any:
    """Validate the chat inputs now; return the deferred render (run by the tokenizer)."""
    assert srv.renderer is not None
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    return srv.renderer.prepare(
        messages,
        request_template=req.chat_template,
        kwargs=req.chat_template_kwargs,
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message,
        tools=getattr(req, "tools", None),
        documents=getattr(req, "documents", None),
    )


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


async def handle(srv: ServerState, req: ChatCompletionRequest) -> Response:
    model = check_model(srv, req.model)
    check_stream_options(req)
    check_tools(req)
    if req.response_format and req.response_format.get("type") not in (None, "text"):
        raise bad_request("response_format other than text is not supported", "response_format")
    limits = srv.limits
    assert limits is not None
    top = req.top_logprobs
    if top is not None and top != 0 and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
    logprobs = (top or 0) if req.logprobs else None
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    params = build_params(req, max_tokens=max_tokens, logprobs=logprobs, defaults=srv.defaults,
                          limits=limits)
    render = render_call(srv, req)
    prompts = [PromptInput(render=render, add_special_tokens=req.add_special_tokens)]
    rid = new_request_id(request.headers.get("X-Request-Id"), req.request_id)
    gen = Generation(srv, rid, prompts, params)
    await gen.start()
    response_id = f"chatcmpl-{rid}"
    tok = srv.tokenizer.backend_tokenizer
    echo_text = ""
    if req.echo and req.messages[-1].role == "assistant":
        content = req.messages[-1].content
        echo_text = content if isinstance(content, str) else "".join(
            p.text or "" for p in content or [])

    if not req.stream:
        try:
            results = await collect(gen)
        finally:
            gen.retire()
        choices = [
            {
                "index": r.index,
                "message": {"role": "assistant", "content": echo_text + r.text, "refusal": None,
                            "tool_calls": []},
                "logprobs": chat_logprobs(tok, r.logprobs, top or 0) if req.logprobs else None,
                "finish_reason": r.finish_reason,
                "stop_reason": r.stop_reason,
            }
            for r in results
        ]
        return json_response({
            "id": response_id, "object": "chat.completion", "created": gen.created,
            "model": model, "choices": choices, "system_fingerprint": None,
            "usage": usage(gen, sum(r.num_tokens for r in results)),
        })

    opts = req.stream_options
    include_usage = bool(opts and opts.include_usage)

    def base() -> dict[str, Any]:
        return {"id": response_id, "object": "chat.completion.chunk", "created": gen.created,
                "model": model}

    def first_chunks() -> list[dict[str, Any]]:
        return [
            dict(base(), choices=[{"index": i, "delta": {"role": "assistant", "content": echo_text},
                                   "logprobs": None, "finish_reason": None}])
            for i in range(gen.state.num_choices)
        ]

    def chunk_of(u: Any) -> dict[str, Any] | None:
        if not u.text and u.finish_reason is None:
            return None
        delta = {"content": u.text} if u.text else {}
        choice: dict[str, Any] = {"index": u.index, "delta": delta,
                                  "logprobs": chat_logprobs(tok, u.logprobs, top or 0)
                                  if req.logprobs else None,
                                  "finish_reason": u.finish_reason}
        if u.finish_reason is not None:
            choice["stop_reason"] = u.stop_reason
        return dict(base(), choices=[choice])

    def final_chunk(use: dict[str, int]) -> dict[str, Any]:
        return dict(base(), choices=[], usage=use)

    return sse_response(sse_stream(
        gen, first_chunks=first_chunks, chunk_of=chunk_of,
        final_chunk=final_chunk if include_usage else None,
        continuous_usage=include_usage and bool(opts and opts.continuous_usage_stats),
    ))
