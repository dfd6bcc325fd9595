"""POST /v1/completions: the body's prompts and checks (server.api.common.completion_body;
its prompt_embeds: server.api.common.embeds), and the handler that hands them to the
generation service and its output to CompletionRenderer."""

from __future__ import annotations

from actors.runtime.request import PromptInput
from quart import Quart, Response, request

from server.api.common import embeds
from server.api.common.completion_body import checked, echo_only
from server.api.common.completion_protocol import CompletionRequest
from server.api.common.render_json import logprob_style
from server.api.common.stream import sse_body
from server.api.http_io import accepts, built_json_response, parse, read_json
from server.api.openai.render import CompletionRenderer
from server.frontend import service
from server.frontend.context import context_of
from server.frontend.generation import new_request_id
from server.sse import sse_response
from server.state import ServerState


async def handle(srv: ServerState, req: CompletionRequest) -> Response:
    model, prompts, params = checked(srv, req)
    assert srv.limits is not None
    # As vLLM: the prompts given as embeddings come first, then the text prompts.
    prompts = [PromptInput(embeds=e) for e in await embeds.decoded_prompts(
        req, width=srv.limits.prompt_embeds_width,
        max_model_len=srv.limits.max_model_len or 0)] + prompts
    rid = new_request_id(request.headers.get("X-Request-Id"), req.request_id)
    gen = await service.start(context_of(srv), rid, prompts, params)
    opts = req.stream_options
    renderer = CompletionRenderer(
        gen, model=model, fingerprint=srv.fingerprint, echo=req.echo,
        echo_only=echo_only(req), logprobs=req.logprobs,
        include_usage=bool(opts and opts.include_usage),
        continuous_usage=bool(opts and opts.continuous_usage_stats),
        metrics=srv.config.enable_per_request_metrics,
        return_token_ids=bool(req.return_token_ids),
        return_weight_versions=bool(req.return_weight_versions),
        style=logprob_style(req.return_tokens_as_token_ids,
                            srv.config.return_tokens_as_token_ids, req.logprob_token_ids))
    if req.stream:
        return sse_response(sse_body(gen, renderer))
    result = await gen.collect()
    return await built_json_response(
        lambda: renderer.response(result),
        off_loop=req.logprobs is not None or params.prompt_logprobs is not None)


def register(app: Quart, srv: ServerState) -> None:
    @app.post("/v1/completions")
    @accepts(CompletionRequest)
    async def v1_completions() -> Response:
        return await handle(srv, parse(CompletionRequest, await read_json()))
