"""Models, tokenizer, health, info, metrics, docs and /invocations."""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import trio
from quart import Quart, Response

from server import __version__
from server.errors import APIError, bad_request, overloaded
from server.openapi import DOCS_HTML, openapi_document
from server.protocol.chat import ChatCompletionRequest
from server.protocol.completions import CompletionRequest
from server.protocol.models import model_card
from server.protocol.tokenize import DetokenizeRequest, TokenizeRequest
from server.routes import chat, completions
from server.routes.common import check_model, json_response, parse, read_json
from server.state import ServerState

# /tokenize and /detokenize work in worker threads, TOKENIZE_THREADS at a time, with at
# most TOKENIZE_QUEUE more waiting; beyond that 503 + Retry-After, as a full generation
# queue answers (each waiting request holds its body, up to --max-body-bytes).
TOKENIZE_THREADS = 2
TOKENIZE_QUEUE = 16
_TOKENIZE_LIMITER = trio.CapacityLimiter(TOKENIZE_THREADS)


async def _in_tokenizer_thread(fn: Any) -> Any:
    if _TOKENIZE_LIMITER.statistics().tasks_waiting >= TOKENIZE_QUEUE:
        raise overloaded()
    return await trio.to_thread.run_sync(fn, limiter=_TOKENIZE_LIMITER)


# Until the model is loaded the metrics actor does not exist; scrapers still get a 200.
LOADING_METRICS = (b"# HELP llmserve_model_loading 1 while the model loads (the other metrics "
                   b"appear once it has loaded)\n# TYPE llmserve_model_loading gauge\n"
                   b"llmserve_model_loading 1.0\n")


def register(app: Quart, srv: ServerState) -> None:
    @app.get("/health")
    async def health() -> Response:
        if srv.health.serving:
            return Response(b"", status=200)
        state = "loading" if srv.health.loading else "draining" if srv.health.draining else "failed"
        raise APIError(503, f"The server is {state}.")

    @app.route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:
        return await health()

    @app.get("/version")
    async def version() -> Response:
        return json_response({"version": __version__})

    @app.get("/load")
    async def load() -> Response:
        return json_response({"server_load": len(srv.registry or ())})

    @app.get("/server_info")
    async def server_info() -> Response:
        cfg = dataclasses.asdict(srv.config)
        cfg.pop("api_keys", None)  # never disclosed
        return json_response({"config": cfg, "version": __version__})

    @app.get("/metrics")
    async def metrics() -> Response:
        body = LOADING_METRICS if srv.metrics is None else srv.metrics.exposition()
        return Response(body, mimetype="text/plain; version=0.0.4")

    @app.get("/openapi.json")
    async def openapi() -> Response:
        return json_response(openapi_document(app))

    @app.get("/docs")
    async def docs() -> Response:
        return Response(DOCS_HTML, mimetype="text/html")

    @app.get("/v1/models")
    async def models() -> Response:
        limits = srv.limits
        assert limits is not None
        cards = [model_card(name, srv.model_root, int(srv.started_at), limits.max_model_len)
                 for name in srv.config.served_model_names]
        return json_response({"object": "list", "data": cards})

    @app.post("/v1/completions")
    async def v1_completions() -> Response:
        return await completions.handle(srv, parse(CompletionRequest, await read_json()))

    @app.post("/v1/chat/completions")
    async def v1_chat() -> Response:
        return await chat.handle(srv, parse(ChatCompletionRequest, await read_json()))

    @app.post("/invocations")
    async def invocations() -> Response:
        body = await read_json()
        if "messages" in body:
            return await chat.handle(srv, parse(ChatCompletionRequest, body))
        if "prompt" in body:
            return await completions.handle(srv, parse(CompletionRequest, body))
        raise bad_request("cannot route this body: expected `messages` (chat) or `prompt` "
                          "(completions)")

    @app.post("/tokenize")
    async def tokenize() -> Response:
        req = parse(TokenizeRequest, await read_json())
        check_model(srv, req.model)
        tok = srv.tokenizer
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("give exactly one of prompt or messages")
        if req.messages is not None:
            render = chat.render_call(srv, req)
            add_special = bool(req.add_special_tokens)
        else:
            prompt = req.prompt
            render = lambda: prompt  # noqa: E731
            add_special = req.add_special_tokens is not False

        def work() -> list[int]:
            text = render()
            # The bound generation has: text that cannot fit the context is not tokenized.
            too_long = srv.prompt_bound.error(text, srv.limits.max_model_len)
            if too_long is not None:
                raise bad_request(too_long, "prompt")
            return tok.backend_tokenizer.encode(text, add_special_tokens=add_special).ids

        ids = await _in_tokenizer_thread(work)
        out: dict[str, Any] = {"count": len(ids), "max_model_len": srv.limits.max_model_len,
                               "tokens": ids, "token_strs": None}
        if req.return_token_strs:
            out["token_strs"] = tok.convert_ids_to_tokens(ids)
        return json_response(out)

    @app.post("/detokenize")
    async def detokenize() -> Response:
        req = parse(DetokenizeRequest, await read_json())
        check_model(srv, req.model)
        vocab, limit = srv.limits.vocab_size, srv.limits.max_model_len
        if len(req.tokens) > limit:  # as a token-id prompt: no more than the context
            raise bad_request(f"at most {limit} tokens (the model's context) can be "
                              f"detokenized at once; got {len(req.tokens)}", "tokens")
        for t in req.tokens:
            if not 0 <= t < vocab:
                raise bad_request(f"Token id {t} is out of vocabulary", "tokens")
        text = await _in_tokenizer_thread(
            partial(srv.tokenizer.backend_tokenizer.decode, req.tokens, skip_special_tokens=False)
        )
        return json_response({"prompt": text})

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> Response:
        tok = srv.tokenizer
        info: dict[str, Any] = {
            "tokenizer_class": type(tok).__name__,
            "vocab_size": srv.limits.vocab_size,
            "model_max_length": srv.limits.max_model_len,
            "bos_token": tok.bos_token,
            "eos_token": tok.eos_token,
            "pad_token": tok.pad_token,
            "unk_token": tok.unk_token,
            "added_special_tokens": list(tok.all_special_tokens),
        }
        if srv.renderer is not None and srv.renderer.template is not None:
            info["chat_template"] = srv.renderer.template
        return json_response(info)
