"""Reasoning on /v1/messages and /v1/responses through `python -m server --reasoning-parser
deepseek_r1`, the real model and the official clients: the anthropic SDK reads thinking
blocks (whole and streamed, with their signature), the openai SDK reads Responses
reasoning items (whole and streamed, with reasoning_tokens), LangChain's ChatOpenAI reads
what it exposes of them, the history's reasoning reaches the template on both dialects
(stored responses included), and --reasoning-effort-map rewrites the effort the template
receives on all three dialects.

The default model does not think. On /v1/responses a regex constrains its whole output to
a `<think>…</think>` block and an answer (the constraint applies from the first token).
/v1/messages has no constraint field, so an assistant prefill of three
"<think>…</think>Blue." lines ending in an open `<think>` makes the model (greedy) copy the
pattern: its output is reasoning, `</think>`, then text, cut by the "\\n" stop sequence.
DeepSeek-R1's parser reads text before a `</think>` as reasoning, as the template opens it.
"""

from __future__ import annotations

import json
import re

import anthropic
import openai
import pytest
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from server_helpers import ServerProcess

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
REGEX = "<think>[a-z ]{1,40}</think>[A-Z][a-z ]{1,40}"
ASK = "Think first, then name a colour."
SHOT = "<think>the sky is blue</think>Blue.\n"
PREFILL = [{"role": "user", "content": ASK},
           {"role": "assistant", "content": SHOT * 3 + "<think>"}]
LONG_EFFORT = "one two three four five six seven eight nine ten"
# Prints what the template receives: each message's reasoning, and the effort.
TEMPLATE = ("{% for m in messages %}{{ m.role }}({{ m.reasoning or '' }})"
            "{% if m.content is string %}{{ m.content }}{% endif %}\n{% endfor %}"
            "effort={{ reasoning_effort }}\n")


@pytest.fixture(scope="module")
def server():
    # a longer context than the tests' default: Anthropic's thinking budget is >= 1024
    srv = ServerProcess("--max-model-len", "2048",
                        "--reasoning-parser", "deepseek_r1", "--trust-request-chat-template",
                        "--reasoning-effort-map", json.dumps({"high": LONG_EFFORT}),
                        # the regexes that make the model write <think> bind from its first token
                        "--structured-outputs-config", "enable_in_reasoning=true",
                        ).wait_ready()
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def claude(server):
    with anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


# -- /v1/messages ---------------------------------------------------------------------------
def prefilled(**kw):
    return dict({"model": MODEL, "max_tokens": 40, "stop_sequences": ["\n"],
                 "messages": PREFILL, "extra_body": {"temperature": 0}}, **kw)


def test_anthropic_sdk_reads_thinking_blocks_whole_and_streamed(claude):
    r = claude.messages.create(**prefilled())
    thinking, text = r.content
    assert (thinking.type, thinking.thinking) == ("thinking", "the sky is blue")
    assert re.fullmatch("[0-9a-f]{32}", thinking.signature)
    assert (text.type, text.text) == ("text", "Blue.")
    assert r.stop_reason == "stop_sequence" and r.usage.output_tokens > 0

    with claude.messages.stream(**prefilled()) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None))
            for b in final.content] == [("thinking", "the sky is blue"), ("text", "Blue.")]
    assert re.fullmatch("[0-9a-f]{32}", final.content[0].signature)
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert deltas[0] == "thinking_delta" and "signature_delta" in deltas
    assert deltas.index("signature_delta") < deltas.index("text_delta")
    assert final.usage.output_tokens == r.usage.output_tokens


def test_anthropic_unclosed_thinking_and_history_thinking(claude):
    # Without the pattern the model never closes its reasoning: all of it is thinking.
    r = claude.messages.create(model=MODEL, max_tokens=8, messages=[
        {"role": "user", "content": ASK}], extra_body={"temperature": 0})
    assert [b.type for b in r.content] == ["thinking"] and r.stop_reason == "max_tokens"
    # Thinking blocks sent back (interleaved with tool_use) reach the template as the
    # assistant's reasoning: the prompt grows by exactly their text's tokens.
    turn = [{"type": "thinking", "thinking": "look it up", "signature": "a"},
            {"type": "tool_use", "id": "t1", "name": "weather", "input": {}},
            {"type": "thinking", "thinking": " and the time", "signature": "b"},
            {"type": "tool_use", "id": "t2", "name": "time", "input": {}}]
    results = [{"type": "tool_result", "tool_use_id": t, "content": "ok"} for t in ("t1", "t2")]

    def count(blocks):
        return claude.messages.count_tokens(
            model=MODEL, messages=[{"role": "user", "content": "hi"},
                                   {"role": "assistant", "content": blocks},
                                   {"role": "user", "content": results}],
            extra_body={"chat_template_kwargs": {"chat_template": TEMPLATE}}).input_tokens

    bare = [b for b in turn if b["type"] == "tool_use"]
    assert count(turn) > count(bare)
    # thinking enabled (budget_tokens below max_tokens, as vLLM checks) with a thinking
    # block in the history, then the prefilled pattern
    r = claude.messages.create(**prefilled(max_tokens=1100, messages=[
        {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "blue is calm", "signature": "s"},
            {"type": "text", "text": "Blue."}]}, *PREFILL],
        thinking={"type": "enabled", "budget_tokens": 1024}))
    assert [b.type for b in r.content] == ["thinking", "text"]


# -- /v1/responses --------------------------------------------------------------------------
def constrained(**kw):
    return dict(model=MODEL, input=ASK, temperature=0, max_output_tokens=60,
                extra_body={"structured_outputs": {"regex": REGEX}, **kw.pop("extra", {})},
                **kw)


def test_openai_sdk_reads_reasoning_items_whole_and_streamed(oai):
    r = oai.responses.create(**constrained())
    reasoning, message = r.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    (part,) = reasoning.content
    assert part.type == "reasoning_text"
    assert re.fullmatch(REGEX, f"<think>{part.text}</think>{r.output_text}")
    assert message.type == "message" and "<" not in r.output_text + part.text
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens

    with oai.responses.stream(**constrained()) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output[0].content[0].text == part.text
    assert final.output_text == r.output_text
    assert "".join(e.delta for e in events
                   if e.type == "response.reasoning_text.delta") == part.text
    done = [e for e in events if e.type == "response.reasoning_text.done"]
    assert [e.text for e in done] == [part.text]
    assert final.usage.output_tokens_details.reasoning_tokens == \
        r.usage.output_tokens_details.reasoning_tokens

    hidden = oai.responses.create(**constrained(extra={"include_reasoning": False}))
    assert [i.type for i in hidden.output] == ["message"]


def test_responses_history_keeps_the_reasoning(oai):
    first = oai.responses.create(**constrained())
    thought = first.output[0].content[0].text
    follow = [{"role": "user", "content": "Another?"}]
    later = oai.responses.create(model=MODEL, previous_response_id=first.id, input=follow,
                                 max_output_tokens=1, extra_body={"chat_template": TEMPLATE})
    as_items = [{"role": "user", "content": ASK},
                *[i.model_dump(exclude_none=True) for i in first.output], *follow]
    sent = oai.responses.create(model=MODEL, input=as_items, max_output_tokens=1,
                                store=False, extra_body={"chat_template": TEMPLATE})
    without = oai.responses.create(model=MODEL, input=as_items[:1] + as_items[2:],
                                   max_output_tokens=1, store=False,
                                   extra_body={"chat_template": TEMPLATE})
    # the stored reasoning and the input reasoning item render alike; without it, shorter
    assert later.usage.input_tokens == sent.usage.input_tokens > without.usage.input_tokens
    assert thought


# -- LangChain ------------------------------------------------------------------------------
def test_langchain_reads_the_reasoning_it_exposes(server):
    kw = {"model": MODEL, "base_url": server.url + "/v1", "api_key": "x", "temperature": 0,
          "max_tokens": 60, "extra_body": {"structured_outputs": {"regex": REGEX}}}
    # Chat completions: langchain-openai keeps only OpenAI's own fields, so the reasoning
    # text is not exposed; the content comes without it and usage counts it.
    streamed = None
    for chunk in ChatOpenAI(stream_usage=True, **kw).stream(ASK):
        streamed = chunk if streamed is None else streamed + chunk
    assert re.fullmatch("[A-Z][a-z ]{1,40}", streamed.content)
    assert streamed.usage_metadata["output_token_details"]["reasoning"] > 0
    # Responses: the reasoning item is a content block with its text (whole), and streamed
    # its block (LangChain reads streamed text only from summary events, which vLLM and
    # this server do not send).
    responses = ChatOpenAI(use_responses_api=True, **kw)
    message = responses.invoke(ASK)
    reasoning, text = message.content
    assert reasoning["type"] == "reasoning" and reasoning["content"][0]["text"]
    assert text["text"] == streamed.content
    chunked = None
    for chunk in responses.stream(ASK):
        chunked = chunk if chunked is None else chunked + chunk
    kinds = [b["type"] for b in chunked.content]
    assert kinds == ["reasoning", "text"] and chunked.content[0]["id"].startswith("rs_")
    assert chunked.usage_metadata["output_token_details"]["reasoning"] > 0
    # LangChain sends the reasoning item back in the history; the server takes it.
    again = responses.invoke([HumanMessage(ASK), message, HumanMessage("Another?")])
    assert again.content[0]["type"] == "reasoning"


# -- --reasoning-effort-map -----------------------------------------------------------------
def test_effort_map_reaches_the_template_on_every_dialect(server, oai, claude):
    """"high" is mapped to a ten-word effort: the rendered prompt grows by it."""
    def chat(effort):
        return oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=1,
            reasoning_effort=effort,
            extra_body={"chat_template": TEMPLATE}).usage.prompt_tokens

    def responses(effort):
        return oai.responses.create(model=MODEL, input="x", max_output_tokens=1, store=False,
                                    reasoning={"effort": effort},
                                    extra_body={"chat_template": TEMPLATE}).usage.input_tokens

    def messages(effort):
        return claude.messages.count_tokens(
            model=MODEL, messages=[{"role": "user", "content": "x"}],
            extra_body={"output_config": {"effort": effort},
                        "chat_template_kwargs": {"chat_template": TEMPLATE}}).input_tokens

    for count in (chat, responses, messages):
        assert count("high") >= count("low") + 8, count
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                    max_tokens=1, reasoning_effort="huge")
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                     extra_body={"output_config": {"effort": "none"}})
