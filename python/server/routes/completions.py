"""POST /v1/completions."""

from __future__ import annotations

from typing import Any

from quart import Response, request

from actors.runtime.request import PromptInput
from server.errors import bad_request
from server.generation import Generation, new_request_id
from server.protocol.completions import CompletionRequest
from server.routes.common import check_model, json_response, sse_response
from server.routes.stream import collect, completion_logprobs, sse_stream, usage
from server.sampling import MAX_PROMPTS, build_params, check_stream_options
from server.state import ServerState


def prompts_of(req: CompletionRequest, vocab_size: int) -> list[PromptInput]:
    p = req.prompt
    if p is None or p == "" or p == []:
        raise bad_request("prompt must be provided and non-empty", "prompt")
    if isinstance(p, str):
        items: list[Any] = [p]
    elif all(isinstance(x, int) for x in p):
        items = [p]
    else:
        items = list(p)
    if len(items) > MAX_PROMPTS:
        raise bad_request(f"at most {MAX_PROMPTS} prompts per request", "prompt")
    out = []
    for item in items:
        if isinstance(item, str):
            if not item:
                raise bad_request("prompt must not contain empty strings", "prompt")
            out.append(PromptInput(text=item, add_special_tokens=req.add_special_tokens))
        else:
            if not item:
                raise bad_request("a token-id prompt must not be empty", "prompt")
            for t in item:
                if not 0 <= t < vocab_size:
                    raise bad_request(f"Token id {t} is out of vocabulary", "prompt")
            out.append(PromptInput(token_ids=list(item)))
    return out


async def handle(srv: ServerState, req: CompletionRequest) -> Response:
    model = check_model(srv, req.model)
    if req.suffix is not None:
        raise bad_request("suffix is not supported by this model", "suffix")
    check_stream_options(req)
    limits = srv.limits
    assert limits is not None
    prompts = prompts_of(req, limits.vocab_size)
    params = build_params(
        req, max_tokens=req.max_tokens, logprobs=req.logprobs, defaults=srv.defaults,
        limits=limits,
    )
    rid = new_request_id(request.headers.get("X-Request-Id"), req.request_id)
    gen = Generation(srv, rid, prompts, params)
    await gen.start()
    response_id = f"cmpl-{rid}"
    tok = srv.tokenizer.backend_tokenizer
    n = params.n

    def prompt_text(index: int) -> str:
        return gen.state.prompt_results[index // n].text

    if not req.stream:
        try:
            results = await collect(gen)
        finally:
            gen.retire()
        choices = []
        for r in results:
            text = (prompt_text(r.index) if req.echo else "") + r.text
            lp = None
            if req.logprobs is not None:
                lp = completion_logprobs(tok, r.logprobs, len(prompt_text(r.index)) if req.echo else 0)
            choices.append({"index": r.index, "text": text, "logprobs": lp,
                            "finish_reason": r.finish_reason, "stop_reason": r.stop_reason})
        return json_response({
            "id": response_id, "object": "text_completion", "created": gen.created,
            "model": model, "choices": choices, "system_fingerprint": None,
            "usage": usage(gen, sum(r.num_tokens for r in results)),
        })

    opts = req.stream_options
    include_usage = bool(opts and opts.include_usage)
    offsets = [len(prompt_text(i)) if req.echo else 0 for i in range(gen.state.num_choices)]

    def base() -> dict[str, Any]:
        return {"id": response_id, "object": "text_completion", "created": gen.created,
                "model": model}

    def first_chunks() -> list[dict[str, Any]]:
        if not req.echo:
            return []
        return [dict(base(), choices=[{"index": i, "text": prompt_text(i), "logprobs": None,
                                       "finish_reason": None, "stop_reason": None}])
                for i in range(gen.state.num_choices)]

    def chunk_of(u: Any) -> dict[str, Any] | None:
        if not u.text and u.finish_reason is None:
            return None
        lp = None
        if req.logprobs is not None:
            lp = completion_logprobs(tok, u.logprobs, offsets[u.index])
            offsets[u.index] += sum(len(t) for t in lp["tokens"])
        return dict(base(), choices=[{"index": u.index, "text": u.text, "logprobs": lp,
                                      "finish_reason": u.finish_reason,
                                      "stop_reason": u.stop_reason}])

    def final_chunk(use: dict[str, int]) -> dict[str, Any]:
        return dict(base(), choices=[], usage=use)

    return sse_response(sse_stream(
        gen, first_chunks=first_chunks, chunk_of=chunk_of,
        final_chunk=final_chunk if include_usage else None,
        continuous_usage=include_usage and bool(opts and opts.continuous_usage_stats),
    ))
