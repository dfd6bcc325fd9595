"""POST /v1/completions."""

from __future__ import annotations

from typing import Any

from quart import Quart, Response, request

from actors.runtime.request import PromptInput
from server.errors import bad_request
from server.generation import Generation, new_request_id
from server.api.http_io import accepts, built_json_response, check_model, parse, read_json
from server.api.openai.protocol.completions import CompletionRequest
from server.api.openai.stream import collect, completion_logprobs, echo_logprobs
from server.api.openai.stream import echo_prompt_logprobs, prompt_logprobs_json
from server.api.openai.stream import prompt_logprobs_of, response_usage, sse_stream
from server.api.openai.params import MAX_PROMPTS, build_params, check_stream_options
from server.sse import sse_response
from server.state import ServerState
from server.unsupported import check_unsupported


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
    check_unsupported(req)
    echo_lps = req.echo and req.logprobs is not None
    if echo_lps and req.stream:
        # vLLM streams the prompt's logprobs in front of the first chunk; not done here yet.
        raise bad_request("echo with logprobs is not supported with stream=true by this "
                          "server yet", "echo")
    limits = srv.limits
    assert limits is not None
    prompts = prompts_of(req, limits.vocab_size)
    # As vLLM: echo with max_tokens=0 returns the prompt alone (one token is generated and
    # dropped, and counted in usage as vLLM counts it).
    echo_only = req.echo and req.max_tokens == 0
    # As vLLM: echo with logprobs scores the prompt with as many alternatives, unless
    # prompt_logprobs says otherwise; a stream computes none (build_params refuses k > 0).
    prompt_lps = req.prompt_logprobs
    if prompt_lps is None and echo_lps:
        prompt_lps = req.logprobs
    params = build_params(
        req, max_tokens=1 if echo_only else req.max_tokens, logprobs=req.logprobs,
        defaults=srv.defaults, limits=limits,
        prompt_logprobs=None if req.stream else prompt_lps,
    )
    rid = new_request_id(request.headers.get("X-Request-Id"), req.request_id)
    gen = Generation(srv, rid, prompts, params)
    await gen.start()
    response_id = f"cmpl-{rid}"
    texts = srv.token_texts
    n = params.n
    num_logprobs = -1 if req.logprobs is None else req.logprobs

    def prompt_text(index: int) -> str:
        return gen.state.prompt_results[index // n].text

    if not req.stream:
        try:
            results = await collect(gen)
        finally:
            gen.retire()

        def build() -> dict[str, Any]:
            choices = []
            # Per prompt, shared by its n choices: prompt_logprobs and the echoed part.
            prompt_json: dict[int, Any] = {}
            echo_part: dict[int, dict[str, Any]] = {}
            for r in results:
                p = r.index // n
                text = "" if echo_only else r.text
                if req.echo:
                    text = prompt_text(r.index) + text
                prompt_items = prompt_logprobs_of(results, r.index, n)
                if p not in prompt_json:
                    prompt_json[p] = prompt_logprobs_json(texts, prompt_items)
                lp = None
                if echo_lps:
                    if prompt_items is None:
                        raise RuntimeError("the engine returned no prompt logprobs")
                    if p not in echo_part:
                        echo_part[p] = echo_prompt_logprobs(
                            texts, gen.state.prompt_results[p].token_ids, prompt_items,
                            num_logprobs)
                    lp = echo_logprobs(texts, echo_part[p], [] if echo_only else r.logprobs,
                                       num_logprobs)
                elif req.logprobs is not None:
                    lp = completion_logprobs(texts, r.logprobs, 0, num_logprobs)
                choices.append({"index": r.index, "text": text, "logprobs": lp,
                                "finish_reason": r.finish_reason, "stop_reason": r.stop_reason,
                                "prompt_logprobs": prompt_json.get(p)})
            return {
                "id": response_id, "object": "text_completion", "created": gen.created,
                "model": model, "choices": choices, "service_tier": None,
                "system_fingerprint": srv.fingerprint,
                "usage": response_usage(gen, sum(r.num_tokens for r in results)),
            }

        return await built_json_response(
            build, off_loop=req.logprobs is not None or params.prompt_logprobs is not None)

    opts = req.stream_options
    include_usage = bool(opts and opts.include_usage)
    offsets = [0] * gen.state.num_choices
    # The echoed prompt goes out in front of each choice's first chunk, as vLLM sends it.
    pending_echo = [req.echo] * gen.state.num_choices

    def base() -> dict[str, Any]:
        return {"id": response_id, "object": "text_completion", "created": gen.created,
                "model": model}

    def chunk_of(u: Any) -> dict[str, Any] | None:
        text = "" if echo_only else u.text
        if pending_echo[u.index]:
            pending_echo[u.index] = False
            text = prompt_text(u.index) + text
        elif not text and not u.token_ids and u.finish_reason is None:
            return None  # nothing happened; a token with held-back text still goes out
        lp = None
        if req.logprobs is not None:
            lp = completion_logprobs(texts, u.logprobs, offsets[u.index], num_logprobs)
            offsets[u.index] += sum(len(t) for t in lp["tokens"])
        chunk = dict(base(), choices=[{"index": u.index, "text": text, "logprobs": lp,
                                       "finish_reason": u.finish_reason,
                                       "stop_reason": u.stop_reason}])
        if u.finish_reason is not None and not include_usage:
            chunk["system_fingerprint"] = srv.fingerprint
        return chunk

    def final_chunk(use: dict[str, int]) -> dict[str, Any]:
        return dict(base(), choices=[], usage=use, system_fingerprint=srv.fingerprint)

    return sse_response(sse_stream(
        gen, first_chunks=list, chunk_of=chunk_of,
        final_chunk=final_chunk if include_usage else None,
        continuous_usage=include_usage and bool(opts and opts.continuous_usage_stats),
    ))


def register(app: Quart, srv: ServerState) -> None:
    @app.post("/v1/completions")
    @accepts(CompletionRequest)
    async def v1_completions() -> Response:
        return await handle(srv, parse(CompletionRequest, await read_json()))
