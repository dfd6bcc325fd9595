"""Reasoning in chat responses (server/frontend/chat/reasoning_plan.py) through the real
ChatCompletionRenderer: scripted outputs streamed in random splits and whole give the same
reasoning, content, tool calls and reasoning-token count; no marker reaches a field; the
tool-call parser never sees the reasoning; the key order, include_reasoning,
--reasoning-content-field and usage details; the template kwargs the parser reads; and
the history's reasoning as the template receives it."""

from __future__ import annotations

import dataclasses
import random

import pytest
from actors.params.sampling import SamplingParams
from server.api.common.chat_body import to_chat
from server.api.common.chat_protocol import ChatCompletionRequest
from server.api.openai.render import ChatCompletionRenderer
from server.config import ServerConfig
from server.frontend.chat.reasoning_plan import (
    apply_reasoning,
    markers_are_special,
    plan_reasoning,
    reasoning_factory,
)
from server.frontend.chat.render import render_call, template_kwargs
from server.frontend.chat.tool_calls import choice_factory
from server.frontend.chat.tools import history_messages, plan_tools
from server.frontend.chat_template import ChatRenderer
from server.frontend.service import ChoiceDelta, ChoiceResult, Collected, Usage
from server_helpers import default_tokenizer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
R1 = "<think>Paris is in France.\nCheck the weather.</think>It is sunny."
# a tool call inside the reasoning is not a call; the one in the content is
R1_CALL = ('<think>maybe <tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
           '</think>Checking.<tool_call>\n{"name": "get_weather", "arguments": '
           '{"city": "Paris"}}\n</tool_call>')


class Gen:
    request_id = "test"
    created = 0
    num_choices = 1

    def choice_usage(self, index: int, tokens: int) -> Usage:
        return Usage(1, tokens)


def renderer(config: ServerConfig, defaults=None, **body) -> ChatCompletionRenderer:
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], **body})
    chat = to_chat(req)
    plan = plan_tools(chat, config)
    thinking = plan_reasoning(chat, config, default_kwargs=defaults, tokenizer=None,
                              include_reasoning=req.include_reasoning,
                              tool_parser=plan.auto_parser)
    opts = req.stream_options
    return ChatCompletionRenderer(
        Gen(), model="m", fingerprint="f", role="assistant", echoed="", logprobs=False,
        top_logprobs=0, include_usage=bool(opts and opts.include_usage),
        continuous_usage=bool(opts and opts.continuous_usage_stats),
        new_choice=reasoning_factory(thinking, choice_factory(plan), "<|im_start|>user\nhi"),
        reasoning_usage=thinking is not None)


def splits(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, min(30, len(text) - 1))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def stream(r: ChatCompletionRenderer, pieces: list[str]) -> list[dict]:
    chunks = []
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        chunk = r.chunk(ChoiceDelta(0, piece, [i], [], "stop" if last else None, None, i + 1))
        if chunk is not None:
            chunks.append(chunk)
    return chunks


def joined(chunks: list[dict], key: str) -> str:
    return "".join(c["choices"][0]["delta"].get(key) or "" for c in chunks)


def whole(r: ChatCompletionRenderer, pieces: list[str]) -> dict:
    text = "".join(pieces)
    result = Collected([ChoiceResult(0, text, list(range(len(pieces))), [], "stop", None,
                                     [(p, 1) for p in pieces])], [None], Usage(1, len(pieces)))
    return r.response(result)


R1_SERVER = ServerConfig(reasoning_parser="deepseek_r1")


@pytest.mark.parametrize("seed", range(30))
def test_streamed_and_whole_agree_and_no_marker_leaks(seed):
    pieces = splits(R1, random.Random(seed))
    chunks = stream(renderer(R1_SERVER), pieces)
    body = whole(renderer(R1_SERVER), pieces)
    message = body["choices"][0]["message"]
    assert joined(chunks, "reasoning") == message["reasoning"] == (
        "Paris is in France.\nCheck the weather.")
    assert joined(chunks, "content") == message["content"] == "It is sunny."
    for c in chunks:
        delta = c["choices"][0]["delta"]
        assert all("<" not in (delta.get(k) or "") for k in ("content", "reasoning"))
        assert list(delta) == [k for k in ("content", "reasoning") if k in delta]
        assert "reasoning_content" not in delta
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
    assert list(message) == ["role", "content", "refusal", "annotations", "audio",
                             "function_call", "reasoning"]


def test_usage_counts_match_streamed_and_whole():
    pieces = ["<think>", "Paris", " is", " far", "</think>", "Yes", "."]
    r = renderer(R1_SERVER, stream_options={"include_usage": True,
                                            "continuous_usage_stats": True})
    chunks = stream(r, pieces)
    streamed = r.final(Usage(1, len(pieces)))["usage"]["completion_tokens_details"]
    assert streamed == {"reasoning_tokens": 3}  # " is" ... the tokens inside, no marker
    assert chunks[-1]["usage"]["completion_tokens_details"] == streamed
    body = whole(renderer(R1_SERVER), pieces)
    assert body["usage"]["completion_tokens_details"] == streamed
    assert list(body["usage"]) == ["prompt_tokens", "completion_tokens", "total_tokens",
                                   "prompt_tokens_details", "completion_tokens_details"]


def test_without_a_parser_nothing_changes():
    r = renderer(ServerConfig(), stream_options={"include_usage": True})
    chunks = stream(r, ["<think>a", "</think>b"])
    assert joined(chunks, "content") == "<think>a</think>b"
    assert "completion_tokens_details" not in r.final(Usage(1, 2))["usage"]
    body = whole(renderer(ServerConfig()), ["<think>a</think>b"])
    assert body["choices"][0]["message"]["reasoning"] is None
    assert "completion_tokens_details" not in body["usage"]


def test_tool_calls_are_read_after_the_reasoning_is_split_off():
    config = ServerConfig(reasoning_parser="deepseek_r1", enable_auto_tool_choice=True,
                          tool_call_parser="hermes")
    for seed in range(10):
        pieces = splits(R1_CALL, random.Random(seed))
        chunks = stream(renderer(config, tools=TOOLS), pieces)
        message = whole(renderer(config, tools=TOOLS), pieces)["choices"][0]["message"]
        assert message["reasoning"] == joined(chunks, "reasoning") == (
            'maybe <tool_call>{"name": "get_weather", "arguments": {}}</tool_call>')
        assert message["content"] == joined(chunks, "content") == "Checking."
        (call,) = message["tool_calls"]
        assert call["function"]["arguments"] == '{"city": "Paris"}'
        streamed = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
        assert "".join(tc["function"]["arguments"] for tc in streamed) == '{"city": "Paris"}'
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
        assert list(message) == ["role", "content", "refusal", "annotations", "audio",
                                 "function_call", "tool_calls", "reasoning"]


def test_all_reasoning_leaves_content_null():
    message = whole(renderer(R1_SERVER), ["<think>only thinking"])["choices"][0]["message"]
    assert message["content"] is None and message["reasoning"] == "only thinking"


def test_include_reasoning_false_drops_it_and_the_old_name_is_opt_in():
    chunks = stream(renderer(R1_SERVER, include_reasoning=False), ["<think>x</think>y"])
    assert joined(chunks, "reasoning") == "" and joined(chunks, "content") == "y"
    old = ServerConfig(reasoning_parser="deepseek_r1", reasoning_content_field=True)
    chunks = stream(renderer(old), ["<think>x", "</think>y"])
    assert chunks[0]["choices"][0]["delta"] == {"reasoning": "x", "reasoning_content": "x"}
    message = whole(renderer(old), ["<think>x</think>y"])["choices"][0]["message"]
    assert (message["reasoning"], message["reasoning_content"]) == ("x", "x")
    assert list(message)[-2:] == ["reasoning", "reasoning_content"]


def test_the_parser_reads_the_kwargs_the_template_got():
    qwen = ServerConfig(reasoning_parser="qwen3")
    off = {"enable_thinking": False}
    text = "<think>a</think>b"
    for kw in ({"defaults": off}, {"chat_template_kwargs": off},
               {"reasoning_effort": "none"}):
        message = whole(renderer(qwen, **kw), [text])["choices"][0]["message"]
        assert message == dict(message, content=text, reasoning=None), kw
    # the request's own kwargs win over the server's
    message = whole(renderer(qwen, defaults=off, chat_template_kwargs={"enable_thinking": True}),
                    [text])["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == ("a", "b")
    chat = to_chat(ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "high"}))
    assert template_kwargs(chat, off) == {"enable_thinking": True, "reasoning_effort": "high"}


def test_special_markers_keep_special_tokens():
    tok = default_tokenizer()  # SmolLM2's: ChatML's tokens are special, <think> is text
    assert not markers_are_special(("<think>", "</think>"), tok)
    assert markers_are_special(("<|im_start|>", "</think>"), tok)
    chat = to_chat(ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}]}))
    plan = plan_reasoning(chat, R1_SERVER, default_kwargs=None, tokenizer=tok)
    assert plan is not None and not plan.keep_special_tokens
    assert apply_reasoning(SamplingParams(), plan).skip_special_tokens is True
    kept = dataclasses.replace(plan, keep_special_tokens=True)
    assert apply_reasoning(SamplingParams(), kept).skip_special_tokens is False
    assert plan_reasoning(chat, ServerConfig(), default_kwargs=None, tokenizer=tok) is None


def test_history_reasoning_reaches_the_template_under_both_names():
    req = ChatCompletionRequest.model_validate({"messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "a", "reasoning_content": "old"},
        {"role": "assistant", "content": "b", "reasoning": "new", "reasoning_content": "x"},
        {"role": "user", "content": "more"}]})
    out = history_messages([dict(m) for m in to_chat(req).messages])
    assert (out[1]["reasoning"], out[1]["reasoning_content"]) == ("old", "old")
    assert (out[2]["reasoning"], out[2]["reasoning_content"]) == ("new", "new")
    assert "reasoning" not in out[0] and "reasoning" not in out[3]


def test_the_template_gets_the_server_kwargs_under_the_requests_and_the_history():
    template = ("{% for m in messages %}{{ m.role }}:{{ m.reasoning_content or '' }}|"
                "{% endfor %}thinking={{ enable_thinking }}")
    renderer_ = ChatRenderer(object(), template=template,
                             default_kwargs={"enable_thinking": False})
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "a", "reasoning": "because"},
                {"role": "user", "content": "more"}]
    for body, thinking in (({}, "False"), ({"chat_template_kwargs": {"enable_thinking": True}},
                                           "True"), ({"reasoning_effort": "low"}, "True")):
        chat = to_chat(ChatCompletionRequest.model_validate({"messages": messages, **body}))
        assert render_call(renderer_, chat)() == (
            f"user:|assistant:because|user:|thinking={thinking}")


HARMONY_CALL = ("<|channel|>analysis<|message|>Need the weather.<|end|>"
                "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
                "<|start|>assistant<|channel|>commentary to=functions.get_weather "
                '<|constrain|>json<|message|>{"city": "Paris"}<|call|>')


@pytest.mark.parametrize("tool_parser", ["openai", "gpt_oss"])
def test_harmony_reasoning_leaves_the_calls_to_the_harmony_tool_parser(tool_parser):
    config = ServerConfig(reasoning_parser="openai_gptoss", enable_auto_tool_choice=True,
                          tool_call_parser=tool_parser)
    for seed in range(15):
        pieces = splits(HARMONY_CALL, random.Random(seed))
        chunks = stream(renderer(config, tools=TOOLS), pieces)
        message = whole(renderer(config, tools=TOOLS), pieces)["choices"][0]["message"]
        assert message["reasoning"] == joined(chunks, "reasoning") == "Need the weather."
        assert message["content"] == joined(chunks, "content") == "Checking."
        (call,) = message["tool_calls"]
        assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
        streamed = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
        assert "".join(tc["function"]["arguments"] for tc in streamed) == '{"city": "Paris"}'
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_harmony_without_tools_keeps_no_framing_in_the_content():
    config = ServerConfig(reasoning_parser="openai_gptoss", enable_auto_tool_choice=True,
                          tool_call_parser="openai")
    message = whole(renderer(config), [HARMONY_CALL])["choices"][0]["message"]
    assert message["reasoning"] == "Need the weather." and message["content"] == "Checking."
    assert "tool_calls" not in message or not message["tool_calls"]
