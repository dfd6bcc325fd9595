"""vLLM's tokenizer routes: POST /tokenize (a prompt, or chat messages through the chat
template), POST /detokenize and GET /tokenizer_info.

The work runs in worker threads, TOKENIZE_THREADS at a time, with at most TOKENIZE_QUEUE
more waiting; beyond that 503 + Retry-After, as a full generation queue answers (each
waiting request holds its body, up to --max-body-bytes).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import trio
from quart import Quart, Response

from server.api.http_io import accepts, check_model, json_response, parse, read_json
from server.api.openai.chat import render_call
from server.api.openai.protocol.tokenize import DetokenizeRequest, TokenizeRequest
from server.errors import bad_request, overloaded
from server.state import ServerState

TOKENIZE_THREADS = 2
TOKENIZE_QUEUE = 16
_TOKENIZE_LIMITER = trio.CapacityLimiter(TOKENIZE_THREADS)


async def _in_tokenizer_thread(fn: Any) -> Any:
    if _TOKENIZE_LIMITER.statistics().tasks_waiting >= TOKENIZE_QUEUE:
        raise overloaded()
    return await trio.to_thread.run_sync(fn, limiter=_TOKENIZE_LIMITER)


async def token_ids_of(srv: ServerState, render: Callable[[], str],
                       add_special_tokens: bool) -> list[int]:
    """What /tokenize gives: the rendered text (a chat template's, or a prompt as it is)
    tokenized in a tokenizer thread; text that cannot fit the context is refused
    untokenized, as generation refuses it."""
    tok = srv.tokenizer

    def work() -> list[int]:
        text = render()
        too_long = srv.prompt_bound.error(text, srv.limits.max_model_len)
        if too_long is not None:
            raise bad_request(too_long, "prompt")
        return tok.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    return await _in_tokenizer_thread(work)


def register(app: Quart, srv: ServerState) -> None:
    @app.post("/tokenize")
    @accepts(TokenizeRequest)
    async def tokenize() -> Response:
        req = parse(TokenizeRequest, await read_json())
        check_model(srv, req.model)
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("give exactly one of prompt or messages")
        if req.messages is not None:
            render = render_call(srv, req)
            add_special = bool(req.add_special_tokens)
        else:
            prompt = req.prompt
            render = lambda: prompt
            add_special = req.add_special_tokens is not False
        ids = await token_ids_of(srv, render, add_special)
        out: dict[str, Any] = {"count": len(ids), "max_model_len": srv.limits.max_model_len,
                               "tokens": ids, "token_strs": None}
        if req.return_token_strs:
            out["token_strs"] = srv.tokenizer.convert_ids_to_tokens(ids)
        return json_response(out)

    @app.post("/detokenize")
    @accepts(DetokenizeRequest)
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
