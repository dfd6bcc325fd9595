"""Reasoning on /v1/chat/completions through `python -m server --reasoning-parser
deepseek_r1` and the real openai SDK, with the real model.

The default model does not think, so a regex constrains its whole output to a
`<think>…</think>` block followed by an answer (`--structured-outputs-config
enable_in_reasoning=true` binds the constraint from the first token, not after the
reasoning). The reasoning and the content must
come apart, streamed (`delta.reasoning`, read as the SDK's extra field) and whole
(`message.reasoning`), equal to each other and to the constrained text, with no marker in
either, and usage must count reasoning tokens. The server also answers the older name
(`--reasoning-content-field`). Without a constraint the output never closes its
reasoning, so all of it is reasoning, as DeepSeek-R1's parser reads it.
"""

from __future__ import annotations

import re

import openai
import pytest
from server_helpers import ServerProcess

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
REGEX = "<think>[a-z ]{1,40}</think>[A-Z][a-z ]{1,40}"
ASK = [{"role": "user", "content": "Think first, then name a colour."}]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--reasoning-parser", "deepseek_r1", "--reasoning-content-field",
                        "--structured-outputs-config", "enable_in_reasoning=true").wait_ready()
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def extra(obj, name: str):
    """A field the SDK's model does not declare (vLLM's `reasoning`)."""
    value = getattr(obj, name, None)
    return value if value is not None else (obj.model_extra or {}).get(name)


def create(client, body=None, **kw):
    kw.setdefault("messages", ASK)
    return client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=60,
        extra_body={"structured_outputs": {"regex": REGEX}, **(body or {})}, **kw)


def check_split(reasoning: str, content: str) -> None:
    assert re.fullmatch(REGEX, f"<think>{reasoning}</think>{content}"), (reasoning, content)
    assert "<" not in reasoning + content


def test_whole_and_streamed_split_alike(client):
    r = create(client)
    choice = r.choices[0]
    reasoning, content = extra(choice.message, "reasoning"), choice.message.content
    check_split(reasoning, content)
    assert extra(choice.message, "reasoning_content") == reasoning
    details = r.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < r.usage.completion_tokens

    streamed = {"reasoning": "", "content": "", "reasoning_content": ""}
    usage = None
    for chunk in create(client, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            streamed["content"] += c.delta.content or ""
            streamed["reasoning"] += extra(c.delta, "reasoning") or ""
            streamed["reasoning_content"] += extra(c.delta, "reasoning_content") or ""
    assert streamed == {"reasoning": reasoning, "content": content,
                        "reasoning_content": reasoning}
    assert usage.completion_tokens_details.reasoning_tokens == details.reasoning_tokens


def test_unclosed_reasoning_is_all_reasoning(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0,
                                       max_tokens=8)
    message = r.choices[0].message
    assert message.content is None and extra(message, "reasoning")
    assert r.usage.completion_tokens_details.reasoning_tokens > 0


def test_include_reasoning_false_and_history_reasoning(client):
    r = create(client, {"include_reasoning": False})
    message = r.choices[0].message
    assert extra(message, "reasoning") is None and re.fullmatch("[A-Z][a-z ]{1,40}",
                                                                message.content)
    history = ASK + [{"role": "assistant", "content": "Blue",
                      "reasoning_content": "a calm colour"},
                     {"role": "user", "content": "Another?"}]
    r = create(client, messages=history)
    check_split(extra(r.choices[0].message, "reasoning"), r.choices[0].message.content)


def test_include_reasoning_false_leaves_out_logprobs_and_token_ids(client):
    """As vLLM: a whole response that hides the reasoning carries neither logprobs nor the
    output's token ids (both would hold the reasoning); the prompt's ids stay."""
    asks = {"logprobs": True, "top_logprobs": 2, "return_token_ids": True}
    shown = create(client, {**asks, "include_reasoning": True})
    assert shown.choices[0].logprobs is not None
    assert extra(shown.choices[0], "token_ids")
    hidden = create(client, {**asks, "include_reasoning": False})
    assert hidden.choices[0].logprobs is None
    assert extra(hidden.choices[0], "token_ids") is None
    assert extra(hidden, "prompt_token_ids") == extra(shown, "prompt_token_ids")
    assert hidden.choices[0].message.content == shown.choices[0].message.content
