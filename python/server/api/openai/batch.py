"""POST /v1/chat/completions/batch (vLLM's): N conversations in one body, one choice per
conversation, in order.

The body is a chat body whose `messages` is a list of conversations. Everything but the
conversations is checked once, by chat's own checks (`chat_body.checked`), and the N prompts
go to the generation service as one request: the tokenizer renders them together and
admits them back to back, so the engine schedules them in the same step, and the
admission slots are taken for all N or for none.

vLLM's limits: no n > 1 and no beam search (its 400s); `tool_choice` only "none". vLLM
ignores `stream` and `tools` on this route (the answer is whole, the tools never reach the
template); a client that sets them gets an answer it did not ask for, so this server
refuses both with a 400 in vLLM's wording.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from actors.runtime.request import PromptInput
from pydantic import Field
from quart import Quart, Response, request

from server.api.common.chat_body import checked, echo_text, response_role, to_chat
from server.api.common.chat_protocol import ChatCompletionRequest, ChatMessage
from server.api.common.params import MAX_PROMPTS
from server.api.common.render_json import logprob_style
from server.api.http_io import accepts, built_json_response, parse, read_json
from server.api.openai.render import ChatCompletionRenderer
from server.errors import bad_request
from server.frontend import service
from server.frontend.chat.render import render_call
from server.frontend.context import context_of
from server.frontend.generation import new_request_id
from server.state import ServerState


class BatchChatCompletionRequest(ChatCompletionRequest):
    messages: list[list[ChatMessage]] = Field(  # type: ignore[assignment]
        min_length=1, max_length=MAX_PROMPTS)


def _refuse(what: str, fix: str, param: str) -> None:
    raise bad_request(f"Batch chat completions do not support {what}. {fix}", param)


def check_batch(req: BatchChatCompletionRequest) -> None:
    """What a batch cannot do, in vLLM's order, before any other check."""
    if req.use_beam_search:
        _refuse("beam search", "Please set `use_beam_search` to False.", "use_beam_search")
    if req.n is not None and req.n != 1:
        _refuse("`n > 1`", "Please set `n` to 1.", "n")
    if req.stream:
        _refuse("streaming", "Please set `stream` to False.", "stream")
    if req.tools is not None:
        _refuse("tool use", "Please remove `tools`.", "tools")
    if req.tool_choice not in (None, "none"):
        _refuse("tool use", 'Please set `tool_choice` to "none".', "tool_choice")
    if req.prompt_logprobs is not None:
        # vLLM computes them and leaves them out of the response.
        _refuse("prompt logprobs", "Please remove `prompt_logprobs`.", "prompt_logprobs")
    for i, conversation in enumerate(req.messages):
        if not conversation:
            raise bad_request("a conversation must hold at least one message",
                              f"messages.{i}")


def is_batch(body: dict[str, Any]) -> bool:
    """A body whose `messages` is a list of conversations (lists), not of messages."""
    messages = body.get("messages")
    return isinstance(messages, list) and bool(messages) and all(
        isinstance(m, list) for m in messages)


def conversations(req: BatchChatCompletionRequest) -> list[ChatCompletionRequest]:
    """One chat request per conversation, each with the batch's other fields."""
    return [req.model_copy(update={"messages": conversation}) for conversation in req.messages]


async def handle(srv: ServerState, req: BatchChatCompletionRequest) -> Response:
    check_batch(req)
    singles = conversations(req)
    model, _, plan, params = checked(srv, singles[0])
    # echo scores each prompt in chat; the batch response has no place for those scores.
    params = dataclasses.replace(params, prompt_logprobs=None)
    assert srv.renderer is not None
    prompts = [PromptInput(render=render_call(srv.renderer, to_chat(single), plan.tools),
                           add_special_tokens=req.add_special_tokens) for single in singles]
    rid = new_request_id(request.headers.get("X-Request-Id"), req.request_id)
    gen = await service.start(context_of(srv), rid, prompts, params)
    per_prompt = [(role, echo_text(single, role))
                  for single in singles for role in (response_role(single),)]
    renderer = ChatCompletionRenderer(
        gen, model=model, fingerprint=srv.fingerprint, role=per_prompt[0][0], echoed="",
        logprobs=bool(req.logprobs), top_logprobs=req.top_logprobs or 0,
        per_prompt=per_prompt, return_token_ids=bool(req.return_token_ids),
        style=logprob_style(req.return_tokens_as_token_ids,
                            srv.config.return_tokens_as_token_ids, req.logprob_token_ids))
    result = await gen.collect()
    return await built_json_response(lambda: renderer.response(result),
                                     off_loop=bool(req.logprobs))


def register(app: Quart, srv: ServerState) -> None:
    @app.post("/v1/chat/completions/batch")
    @accepts(BatchChatCompletionRequest)
    async def v1_chat_batch() -> Response:
        return await handle(srv, parse(BatchChatCompletionRequest, await read_json()))
