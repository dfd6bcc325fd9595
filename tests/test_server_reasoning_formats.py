"""Every reasoning parser end to end through the server, on chat: the default model (which
does not think) writes each format under a regex constraint that binds from the first
token (`enable_in_reasoning`), and the answer must come apart into reasoning and content
with no marker on either side, streamed as whole. deepseek_r1 has its own tests
(test_server_reasoning.py, test_server_reasoning_gate.py, the dialect tests)."""

from __future__ import annotations

import re

import openai
import pytest
from server_helpers import ServerProcess

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "Think first, then name a colour."}]
THOUGHT, ANSWER = "[a-z][a-z ]{0,29}", "[A-Z][a-z ]{1,30}"
# parser -> (the output's regex, every marker that must never reach either side)
FORMATS = {
    "qwen3": (f"<think>{THOUGHT}</think>{ANSWER}", ("<think>", "</think>")),
    "mistral": (rf"\[THINK\]{THOUGHT}\[/THINK\]{ANSWER}", ("[THINK]", "[/THINK]")),
    "granite": (f"Here is my thought process:{THOUGHT}Here is my response:{ANSWER}",
                ("thought process:", "my response:")),
    "openai_gptoss": (r"<\|channel\|>analysis<\|message\|>" + THOUGHT
                      + r"<\|end\|><\|start\|>assistant<\|channel\|>final<\|message\|>"
                      + ANSWER, ("<|", "|>")),
}


@pytest.fixture(scope="module", params=sorted(FORMATS))
def served(request):
    srv = ServerProcess("--reasoning-parser", request.param, "--structured-outputs-config",
                        "enable_in_reasoning=true").wait_ready()
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as client:
        yield request.param, client
    assert srv.stop() == 0, srv.log()


def extra(obj, name: str):
    value = getattr(obj, name, None)
    return value if value is not None else (obj.model_extra or {}).get(name)


def test_each_format_comes_apart_streamed_as_whole(served) -> None:
    parser, client = served
    regex, markers = FORMATS[parser]
    body = {"structured_outputs": {"regex": regex}}
    whole = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0,
                                           max_tokens=120, extra_body=body)
    message = whole.choices[0].message
    reasoning, content = extra(message, "reasoning"), message.content
    assert reasoning and content, (parser, reasoning, content)
    assert re.fullmatch("[a-z ]+", reasoning) and re.fullmatch(ANSWER, content.strip())
    assert not any(m in reasoning + content for m in markers)
    assert whole.usage.completion_tokens_details.reasoning_tokens > 0
    streamed = {"reasoning": "", "content": ""}
    for chunk in client.chat.completions.create(model=MODEL, messages=ASK, temperature=0,
                                                max_tokens=120, extra_body=body, stream=True):
        for c in chunk.choices:
            streamed["content"] += c.delta.content or ""
            streamed["reasoning"] += extra(c.delta, "reasoning") or ""
    assert streamed == {"reasoning": reasoning, "content": content}, parser
