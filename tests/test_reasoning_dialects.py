"""Reasoning on the Anthropic and Responses dialects, through their real renderers and
request translations, on scripted DeepSeek-R1 output (reasoning, text, a Hermes tool call)
cut at random points: the thinking / reasoning blocks and items the SDKs' own stream
accumulators build equal the whole response's; the history's thinking blocks and reasoning
items reach the chat template as the assistant's reasoning (interleaved between tool
calls); thinking.budget_tokens, thinking disabled and --reasoning-effort-map land where
vLLM puts them."""

from __future__ import annotations

import argparse
import json
import random
from types import SimpleNamespace

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from server import flag_types
from server.api.anthropic.render import MessageStream, message_body
from server.api.common.chat_body import to_chat
from server.api.common.messages_body import chat_request
from server.api.common.messages_protocol import AnthropicMessagesRequest
from server.api.openai.protocol.responses import ResponsesRequest
from server.api.openai.responses import _tool_plan
from server.api.openai.responses_input import items_to_messages
from server.api.openai.responses_render import EventCounter, OutputBuilder, ResponseShape
from server.config import ServerConfig
from server.errors import APIError
from server.frontend.chat.reasoning_plan import plan_reasoning, reasoning_factory
from server.frontend.chat.render import render_call, template_kwargs
from server.frontend.chat.request import ChatRequest
from server.frontend.chat.tool_calls import choice_factory
from server.frontend.chat.tools import plan_tools
from server.frontend.chat_template import ChatRenderer
from server.frontend.service import (
    ChoiceDelta,
    ChoiceResult,
    Collected,
    Logprobs,
    Prompt,
    Usage,
)

CONFIG = ServerConfig(enable_auto_tool_choice=True, tool_call_parser="hermes",
                      reasoning_parser="deepseek_r1")
THOUGHT = "Paris is in France.\nI should check the weather."
TEXT = (f"<think>{THOUGHT}</think>Let me check.<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}
EVENT = TypeAdapter(ResponseStreamEvent)


def splits(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 30)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def deltas(pieces: list[str], reason: str = "stop") -> list[ChoiceDelta]:
    return [ChoiceDelta(0, p, [i], Logprobs([]), reason if i == len(pieces) - 1 else None,
                        None, i + 1) for i, p in enumerate(pieces)]


def whole(pieces: list[str], reason: str = "stop") -> ChoiceResult:
    return ChoiceResult(0, "".join(pieces), list(range(len(pieces))), Logprobs([]), reason,
                        None, pieces=[(p, 1) for p in pieces])


# -- Anthropic /v1/messages -----------------------------------------------------------------
class _Gen:
    request_id = "test"
    prompts = (Prompt("p", [1, 2, 3], "p"),)


def anthropic_choice(config: ServerConfig = CONFIG, **body):
    req = AnthropicMessagesRequest.model_validate({
        "model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "get_weather", "input_schema": WEATHER}], **body})
    chat = to_chat(chat_request(req))
    thinking = plan_reasoning(chat, config, default_kwargs=None, tokenizer=None)
    return reasoning_factory(thinking, choice_factory(plan_tools(chat, config)), "p")()


def anthropic_events(pieces: list[str], **body) -> list[dict]:
    s = MessageStream(_Gen(), model="m", choice=anthropic_choice(**body))
    raw = s.start()
    for d in deltas(pieces):
        raw += s.delta(d)
    raw += s.finish(Usage(3, len(pieces)))
    records = []
    for r in raw:
        head, data = r.decode().strip().split("\n")
        record = json.loads(data.removeprefix("data: "))
        assert head.removeprefix("event: ") == record["type"]
        records.append(record)
    return records


@pytest.mark.parametrize("seed", range(8))
def test_anthropic_thinking_blocks_streamed_and_whole_agree(seed):
    pieces = splits(TEXT, random.Random(seed))
    events = anthropic_events(pieces)
    snapshot, json_bufs = None, {}
    for event in events:
        if event["type"] != "ping":
            snapshot = accumulate_event(event=event, current_snapshot=snapshot,
                                        json_bufs=json_bufs)
    blocks = [b.to_dict() for b in snapshot.content]
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    thinking, text, call = blocks
    assert thinking["thinking"] == THOUGHT and len(thinking["signature"]) == 32
    assert text["text"] == "Let me check." and call["input"] == {"city": "Paris"}
    # The thinking block opens first, empty, and its signature comes just before its stop.
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert starts[0] == {"type": "content_block_start", "index": 0,
                         "content_block": {"type": "thinking", "thinking": ""}}
    stop = events.index({"type": "content_block_stop", "index": 0})
    assert events[stop - 1]["delta"]["type"] == "signature_delta"
    assert sum(e.get("delta", {}).get("type") == "signature_delta" for e in events) == 1

    body = message_body(_Gen(), Collected([whole(pieces)], [None], Usage(3, 9)), model="m",
                        choice=anthropic_choice())
    assert [{k: v for k, v in b.items() if k not in ("id", "signature")}
            for b in body["content"]] == [
        {"type": "thinking", "thinking": THOUGHT}, {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "name": "get_weather", "input": {"city": "Paris"}}]
    assert len(body["content"][0]["signature"]) == 32
    assert body["usage"] == {"input_tokens": 3, "output_tokens": 9}


def test_anthropic_without_a_parser_has_no_thinking_and_unclosed_is_all_thinking():
    plain = ServerConfig(enable_auto_tool_choice=True, tool_call_parser="hermes")
    body = message_body(_Gen(), Collected([whole(["<think>a</think>b"])], [None],
                                          Usage(3, 1)), model="m",
                        choice=anthropic_choice(plain))
    assert body["content"] == [{"type": "text", "text": "<think>a</think>b"}]
    events = anthropic_events(["<think>still ", "thinking"])
    blocks = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert blocks == ["thinking"]  # no empty text block after a thinking one


def test_anthropic_history_thinking_is_the_turns_reasoning_and_reaches_the_template():
    turn = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "first I look", "signature": "s1"},
        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "thinking", "thinking": ", then the time", "signature": "s2"},
        {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {"city": "Rome"}}]}
    results = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
        {"type": "tool_result", "tool_use_id": "t2", "content": "rain"}]}
    req = AnthropicMessagesRequest.model_validate({
        "model": "m", "max_tokens": 2000, "messages": [
            {"role": "user", "content": "weather?"}, turn, results],
        "thinking": {"type": "enabled", "budget_tokens": 1024}})
    body = chat_request(req)
    assistant = body.messages[1]
    assert assistant.reasoning == "first I look, then the time"
    assert [c["id"] for c in assistant.tool_calls] == ["t1", "t2"]
    assert body.thinking_token_budget == 1024 and body.reasoning_effort is None
    template = ("{% for m in messages %}{{ m.role }}[{{ m.reasoning or '' }}]"
                "{% for c in m.tool_calls or [] %}{{ c.function.arguments.city }};{% endfor %}|"
                "{% endfor %}")
    rendered = render_call(ChatRenderer(object(), template=template), to_chat(body))()
    assert rendered == ("user[]|assistant[first I look, then the time]Paris;Rome;|"
                        "tool[]|tool[]|")
    with pytest.raises(APIError, match="thinking blocks may only appear in assistant"):
        chat_request(AnthropicMessagesRequest.model_validate({
            "model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "thinking", "thinking": "x"}]}]}))


@pytest.mark.parametrize(("thinking", "expected"), [
    ({"type": "disabled"}, "none"), ({"type": "between_tools"}, "none"),
    ({"type": "adaptive"}, "high"), (None, "high")])
def test_anthropic_thinking_config_applies_after_output_config_effort(thinking, expected):
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
            "output_config": {"effort": "high"}}
    if thinking is not None:
        body["thinking"] = thinking
    chat = chat_request(AnthropicMessagesRequest.model_validate(body))
    assert chat.reasoning_effort == expected and chat.thinking_token_budget is None


# -- Responses ------------------------------------------------------------------------------
def responses_builder(config: ServerConfig = CONFIG, **body) -> OutputBuilder:
    req = ResponsesRequest.model_validate({"input": "hi", "tools": [
        {"type": "function", "name": "get_weather", "parameters": WEATHER}], **body})
    thinking = plan_reasoning(ChatRequest(messages=()), config, default_kwargs=None,
                              tokenizer=None, include_reasoning=req.include_reasoning)
    return OutputBuilder(_tool_plan(SimpleNamespace(config=config), req), None,  # type: ignore[arg-type]
                         thinking, "p")


def responses_stream(pieces: list[str], **body) -> tuple[list[dict], Response, OutputBuilder]:
    b, counter = responses_builder(**body), EventCounter()
    s = ResponseShape(response_id="resp_x", model="m", echo={
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": []})
    events = [{"type": "response.created", "response": s.body("in_progress", [])}]
    for d in deltas(pieces):
        events += b.feed(d.text, d.logprobs, d.finish_reason, d.token_ids)
    events.append({"type": "response.completed", "response": s.body(
        "completed", b.output, Usage(3, 9), reasoning_tokens=b.reasoning_tokens)})
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in events:
        state.handle_event(EVENT.validate_python(counter.number(event)))
    return events, Response.model_validate(events[-1]["response"]), b


@pytest.mark.parametrize("seed", range(8))
def test_responses_reasoning_item_streamed_and_whole_agree(seed):
    pieces = splits(TEXT, random.Random(seed))
    events, final, streamed = responses_stream(pieces)
    reasoning, message, call = final.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert [(c.type, c.text) for c in reasoning.content] == [("reasoning_text", THOUGHT)]
    assert message.content[0].text == "Let me check."
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    kinds = [e["type"] for e in events if e.get("item_id") == reasoning.id
             or e.get("item", {}).get("id") == reasoning.id]
    assert kinds[:2] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-3:] == ["response.reasoning_text.done", "response.content_part.done",
                          "response.output_item.done"]
    assert "".join(e["delta"] for e in events
                   if e["type"] == "response.reasoning_text.delta") == THOUGHT
    # every token of a delta wholly inside the reasoning is counted
    assert 0 < streamed.reasoning_tokens < len(pieces)
    assert final.usage.output_tokens_details.reasoning_tokens == streamed.reasoning_tokens

    b = responses_builder()
    b.feed_whole(whole(pieces))

    def strip(items: list[dict]) -> list[dict]:
        return [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in items]

    assert strip(b.output) == strip(streamed.output)
    assert b.reasoning_tokens == streamed.reasoning_tokens


def test_responses_include_reasoning_false_and_no_parser():
    _, final, hidden = responses_stream(["<think>hidden</think>Shown"],
                                        include_reasoning=False)
    assert hidden.reasoning_tokens == 0  # one delta crossing both markers counts as neither
    assert [i.type for i in final.output] == ["message"]
    assert final.output[0].content[0].text == "Shown"
    plain = responses_builder(ServerConfig(enable_auto_tool_choice=True,
                                           tool_call_parser="hermes"))
    plain.feed("<think>a</think>b", [], "stop")
    assert [i["type"] for i in plain.output] == ["message"] and plain.reasoning_tokens == 0


def test_responses_reasoning_items_in_the_input_are_the_assistants_reasoning():
    def reasoning(text: str) -> dict:
        return {"type": "reasoning", "id": "rs_1", "summary": [],
                "content": [{"type": "reasoning_text", "text": text}]}

    call = {"type": "function_call", "call_id": "c1", "name": "get_weather",
            "arguments": '{"city": "Paris"}'}
    answer = {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "Sunny."}]}
    messages = items_to_messages([
        {"role": "user", "content": "weather?"}, reasoning("look it up"), call,
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        reasoning("it is sunny"), answer])
    assert messages == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "reasoning": "look it up",
         "tool_calls": [{"id": "c1", "type": "function", "function": {
             "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        {"role": "assistant", "content": [{"type": "text", "text": "Sunny."}],
         "reasoning": "it is sunny"}]
    summary = {"type": "reasoning", "id": "rs_2", "content": None,
               "summary": [{"type": "summary_text", "text": "short"}]}
    assert items_to_messages([summary])[0]["reasoning"] == "short"
    with pytest.raises(APIError, match="Encrypted content is not supported"):
        items_to_messages([dict(summary, encrypted_content="gAAA")])
    # A stored response's output items come back the same way (previous_response_id).
    b = responses_builder()
    b.feed_whole(whole([TEXT]))
    (turn,) = items_to_messages(b.output)
    assert turn["reasoning"] == THOUGHT and turn["content"][0]["text"] == "Let me check."
    assert turn["tool_calls"][0]["function"]["name"] == "get_weather"


# -- reasoning_effort and --reasoning-effort-map ----------------------------------------------
def test_effort_map_rewrites_the_effort_the_template_receives():
    effort_map = {"medium": "low", "low": "none"}
    for effort, kwargs in (("medium", {"reasoning_effort": "low", "enable_thinking": True}),
                           ("low", {"reasoning_effort": "none", "enable_thinking": False}),
                           ("high", {"reasoning_effort": "high", "enable_thinking": True})):
        chat = ChatRequest(messages=(), reasoning_effort=effort)
        assert template_kwargs(chat, None, effort_map) == kwargs
    renderer = ChatRenderer(object(), template="{{ reasoning_effort }}/{{ enable_thinking }}",
                            effort_map=effort_map)
    chat = ChatRequest(messages=({"role": "user", "content": "x"},), reasoning_effort="medium")
    assert render_call(renderer, chat)() == "low/True"
    # the reasoning parser reads the kwargs the template got: "none" means no reasoning
    config = ServerConfig(reasoning_parser="qwen3", reasoning_effort_map=effort_map)
    plan = plan_reasoning(ChatRequest(messages=(), reasoning_effort="low"), config,
                          default_kwargs=None, tokenizer=None)
    assert plan.template_kwargs["enable_thinking"] is False
    assert plan.new_parser("").split("<think>a</think>b") == (None, "<think>a</think>b")


@pytest.mark.parametrize(("text", "error"), [
    ('{"medium": "low"}', None),
    ('["low"]', "must be a JSON object mapping reasoning efforts to strings"),
    ('{"low": 1}', "must be a JSON object mapping reasoning efforts to strings"),
    ('{"huge": "max"}', ("unknown efforts ['huge']; keys must be one of ['none', 'minimal', "
                         "'low', 'medium', 'high', 'xhigh', 'max']")),
    ("{", "not JSON")])
def test_effort_map_flag_is_checked_as_vllm_checks_it(text, error):
    if error is None:
        assert flag_types.effort_map(text) == {"medium": "low"}
        return
    with pytest.raises(argparse.ArgumentTypeError) as info:
        flag_types.effort_map(text)
    assert error in str(info.value)
