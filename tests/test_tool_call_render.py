"""Tool calls in chat responses (server/frontend/chat/tool_calls.py), the auto path the small
default model does not take on its own: scripted Hermes output goes through the real
ChatCompletionRenderer, streamed in random splits and whole, and both must give the same
calls, ids of the OpenAI shape, vLLM's finish reasons and parallel_tool_calls=false."""

from __future__ import annotations

import json
import random

import pytest
from server.api.common.chat_body import to_chat
from server.api.common.chat_protocol import ChatCompletionRequest
from server.api.openai.render import ChatCompletionRenderer
from server.config import ServerConfig
from server.errors import APIError
from server.frontend.chat.tool_calls import choice_factory
from server.frontend.chat.tools import plan_tools
from server.frontend.service import ChoiceDelta, ChoiceResult, Collected, Usage

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}}}},
]
TWO_CALLS = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
             '{"city": "Paris \\"centre\\""}}\n</tool_call>\n<tool_call>\n'
             '{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call><|im_end|>')
HERMES = ServerConfig(enable_auto_tool_choice=True, tool_call_parser="hermes")


class Gen:
    """The part of a TextGeneration the renderer reads: a plain stand-in, one choice."""

    request_id = "test"
    created = 0
    num_choices = 1

    def choice_usage(self, index: int, tokens: int) -> Usage:
        return Usage(1, tokens)


def renderer(**body) -> ChatCompletionRenderer:
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], **body})
    plan = plan_tools(to_chat(req), HERMES)
    return ChatCompletionRenderer(Gen(), model="m", fingerprint="f", role="assistant",
                                  echoed="", logprobs=False, top_logprobs=0,
                                  new_choice=choice_factory(plan))


def splits(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, min(30, len(text) - 1))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def stream(r: ChatCompletionRenderer, pieces: list[str], reason: str = "stop") -> list[dict]:
    chunks = []
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        chunk = r.chunk(ChoiceDelta(0, piece, [i], [], reason if last else None, None, i + 1))
        if chunk is not None:
            chunks.append(chunk["choices"][0])
    return chunks


def assemble(chunks: list[dict]) -> tuple[str, dict[int, dict], str | None]:
    content, calls = "", {}
    for c in chunks:
        delta = c["delta"]
        content += delta.get("content") or ""
        for tc in delta.get("tool_calls", []):
            if "id" in tc:
                assert tc["index"] not in calls and tc["type"] == "function"
                assert tc["function"]["name"]
                calls[tc["index"]] = {"id": tc["id"], "name": tc["function"]["name"],
                                      "arguments": ""}
            else:
                assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
            calls[tc["index"]]["arguments"] += tc["function"]["arguments"]
    return content, calls, chunks[-1]["finish_reason"]


def whole(r: ChatCompletionRenderer, text: str, reason: str = "stop") -> dict:
    result = Collected([ChoiceResult(0, text, [1], [], reason, None)], [None], Usage(1, 1))
    return r.response(result)["choices"][0]


@pytest.mark.parametrize("seed", range(40))
def test_streamed_calls_match_whole(seed):
    rng = random.Random(seed)
    content, calls, reason = assemble(stream(renderer(tools=TOOLS), splits(TWO_CALLS, rng)))
    choice = whole(renderer(tools=TOOLS), TWO_CALLS)
    message = choice["message"]
    assert reason == choice["finish_reason"] == "tool_calls"
    assert content == message["content"] == "Let me check.\n"
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "get_time"]
    assert [c["name"] for c in calls.values()] == ["get_weather", "get_time"]
    for streamed, call in zip(calls.values(), message["tool_calls"]):
        assert json.loads(streamed["arguments"]) == json.loads(call["function"]["arguments"])
        assert streamed["id"].startswith("chatcmpl-tool-") and call["id"].startswith(
            "chatcmpl-tool-") and call["type"] == "function"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {
        "city": 'Paris "centre"'}


@pytest.mark.parametrize("seed", range(10))
def test_parallel_false_keeps_first_call(seed):
    rng = random.Random(seed)
    body = {"tools": TOOLS, "parallel_tool_calls": False}
    _, calls, reason = assemble(stream(renderer(**body), splits(TWO_CALLS, rng)))
    message = whole(renderer(**body), TWO_CALLS)["message"]
    assert list(calls) == [0] and len(message["tool_calls"]) == 1
    assert reason == "tool_calls"


def test_plain_answer_is_content():
    text = "Paris is sunny today."
    content, calls, reason = assemble(stream(renderer(tools=TOOLS), splits(text, random.Random(1))))
    choice = whole(renderer(tools=TOOLS), text)
    assert content == choice["message"]["content"] == text and not calls
    assert "tool_calls" not in choice["message"] and reason == choice["finish_reason"] == "stop"


def test_length_cut_keeps_length_and_no_half_call():
    text = TWO_CALLS[:TWO_CALLS.index('"Paris') + 3]
    choice = whole(renderer(tools=TOOLS), text, reason="length")
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
    named = {"tools": TOOLS, "tool_choice": {"type": "function",
                                             "function": {"name": "get_weather"}}}
    choice = whole(renderer(**named), '{"city": "Pa', reason="length")
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == ""


def test_named_finishes_stop_and_required_tool_calls():
    named = {"tools": TOOLS, "tool_choice": {"type": "function",
                                             "function": {"name": "get_time"}}}
    choice = whole(renderer(**named), '{"zone": "UTC"}')
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == ""
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "get_time",
                                                             "arguments": '{"zone": "UTC"}'}
    text = '[{"name": "get_time", "parameters": {"zone": "UTC"}}]'
    choice = whole(renderer(tools=TOOLS, tool_choice="required"), text)
    assert choice["finish_reason"] == "tool_calls"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {
        "zone": "UTC"}


def test_auto_needs_the_flags():
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS})
    with pytest.raises(APIError) as err:
        plan_tools(to_chat(req), ServerConfig())
    assert err.value.param == "tool_choice" and "--enable-auto-tool-choice" in err.value.message
    assert plan_tools(to_chat(req), HERMES).choice == "auto"


def test_required_and_named_need_the_parser_only():
    # as vLLM: --tool-call-parser alone serves "required" and named functions; "auto" also
    # needs --enable-auto-tool-choice
    parser_only = ServerConfig(tool_call_parser="hermes")
    named = {"type": "function", "function": {"name": "get_time"}}
    for choice, kind in (("required", "required"), (named, "named")):
        req = ChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
             "tool_choice": choice})
        assert plan_tools(to_chat(req), parser_only).choice == kind
        with pytest.raises(APIError) as err:
            plan_tools(to_chat(req), ServerConfig())
        assert err.value.param == "tool_choice" and "--tool-call-parser" in err.value.message
    auto = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS})
    with pytest.raises(APIError) as err:
        plan_tools(to_chat(auto), parser_only)
    assert "--enable-auto-tool-choice" in err.value.message


REPEATED = ('[{"name": "get_time", "parameters": {"zone": "UTC"}}, '
            '{"name": "get_weather", "parameters": {"city": "Paris"}}, '
            '{"name": "get_time", "parameters": {"zo')


@pytest.mark.parametrize("seed", range(8))
def test_required_cut_by_length_keeps_its_complete_calls(seed):
    """A required reply that repeats calls until max_tokens: the complete calls come back
    with finish_reason length, the cut one is dropped, streamed and whole."""
    body = {"tools": TOOLS, "tool_choice": "required"}
    choice = whole(renderer(**body), REPEATED, reason="length")
    assert choice["finish_reason"] == "length" and choice["message"]["content"] == ""
    calls = choice["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_time", {"zone": "UTC"}), ("get_weather", {"city": "Paris"})]
    content, streamed, reason = assemble(
        stream(renderer(**body), splits(REPEATED, random.Random(seed)), reason="length"))
    assert reason == "length" and content == ""
    complete = [c for c in streamed.values() if _decodes(c["arguments"])]
    assert [(c["name"], json.loads(c["arguments"])) for c in complete] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_required_cut_before_any_complete_call_has_none():
    body = {"tools": TOOLS, "tool_choice": "required"}
    choice = whole(renderer(**body), '[{"name": "get_time", "parameters": {"zo', "length")
    assert choice["finish_reason"] == "length" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == ""


def _decodes(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
