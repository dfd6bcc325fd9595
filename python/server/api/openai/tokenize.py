"""vLLM's tokenizer routes: POST /tokenize (a prompt, or chat messages through the chat
template), POST /detokenize and GET /tokenizer_info. The work runs in the bounded worker
threads of server.api.common.tokens."""

from __future__ import annotations

from functools import partial
from typing import Any

from quart import Quart, Response

from server.api.common.tokens import in_tokenizer_thread, token_ids_of
from server.api.http_io import accepts, check_model, json_response, parse, read_json
from server.api.openai.protocol.tokenize import DetokenizeRequest, TokenizeRequest
from server.errors import bad_request
from server.frontend.chat.render import render_call
from server.frontend.chat.request import ChatRequest
from server.state import ServerState


def to_chat(req: TokenizeRequest) -> ChatRequest:
    """The chat request whose prompt /tokenize counts (no tool plan: tools go to the
    template as sent)."""
    assert req.messages is not None
    return ChatRequest(
        messages=tuple(m.model_dump(exclude_none=True) for m in req.messages),
        tools=req.tools, chat_template=req.chat_template,
        chat_template_kwargs=req.chat_template_kwargs,
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message)


def register(app: Quart, srv: ServerState) -> None:
    @app.post("/tokenize")
    @accepts(TokenizeRequest)
    async def tokenize() -> Response:
        req = parse(TokenizeRequest, await read_json())
        check_model(srv, req.model)
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("give exactly one of prompt or messages")
        if req.messages is not None:
            assert srv.renderer is not None
            render = render_call(srv.renderer, to_chat(req))
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
        text = await in_tokenizer_thread(
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
