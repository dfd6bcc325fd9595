"""The new tool-call parsers and strict tool calls through the real server and the openai
SDK, default model:

- per parser (qwen3_coder, deepseek_v3, granite, openai), a server started with
  `--tool-call-parser NAME --enable-auto-tool-choice`; a structured_outputs regex makes the
  model write one call in the parser's format under tool_choice "auto": the whole response
  and the stream both carry that call, its arguments valid against the tool's schema;
- hermes with a `strict: true` tool under "auto": the few-shot history makes the small
  model call the tool again, and the structural tag holds its arguments to a schema the
  model would not follow on its own (an enum of city codes); with parallel_tool_calls
  false the output ends after the one call."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from server_helpers import ROOT, ServerProcess

TEMPLATE = str(ROOT / "examples" / "tool_chat_template_chatml_hermes.jinja")
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Rome"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]
CITY = "(Paris|Rome)"
REGEX = {
    "qwen3_coder": (r"I will check\.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                    + CITY + r"\n</parameter>\n<parameter=days>\n[1-9]\n</parameter>\n"
                    r"</function>\n</tool_call>"),
    "deepseek_v3": (r"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
                    r'get_weather\n```json\n\{"city": "' + CITY + r'", "days": [1-9]\}\n```'
                    r"<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "granite": (r'<\|tool_call\|>\[\{"name": "get_weather", "arguments": \{"city": "' + CITY
                + r'"\}\}\]'),
    "openai": (r"<\|channel\|>analysis<\|message\|>[a-z ]{1,20}<\|end\|><\|start\|>assistant"
               r"<\|channel\|>commentary to=functions\.get_weather <\|constrain\|>json"
               r'<\|message\|>\{"city": "' + CITY + r'"\}'),
}


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def streamed(client: openai.OpenAI, **kw) -> tuple[dict[int, dict], str | None, str]:
    calls: dict[int, dict] = {}
    reason, content = None, ""
    for chunk in client.chat.completions.create(stream=True, **kw):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for tc in choice.delta.tool_calls or []:
            if tc.id is not None:
                calls[tc.index] = {"name": tc.function.name, "arguments": ""}
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        reason = choice.finish_reason or reason
    return calls, reason, content


@pytest.fixture(scope="module", params=sorted(REGEX))
def parser_server(request):
    proc = ServerProcess("--enable-auto-tool-choice", "--tool-call-parser",
                         request.param).wait_ready()
    yield request.param, proc.url
    proc.stop()


def test_parser_reads_its_format_whole_and_streamed(parser_server):
    name, url = parser_server
    kw = {"model": "SmolLM2-135M-Instruct", "messages": ASK, "tools": TOOLS,
          "tool_choice": "auto", "temperature": 0, "max_tokens": 200,
          "extra_body": {"structured_outputs": {"regex": REGEX[name]}}}
    with sdk(url) as client:
        whole = client.chat.completions.create(**kw).choices[0]
        assert whole.finish_reason == "tool_calls", whole
        (call,) = whole.message.tool_calls
        assert call.function.name == "get_weather" and call.id.startswith("chatcmpl-tool-")
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, WEATHER)
        if name == "qwen3_coder":
            assert isinstance(arguments["days"], int)  # typed by the schema
            assert whole.message.content == "I will check.\n"
        else:
            assert not whole.message.content
        calls, reason, content = streamed(client, **kw)
    assert reason == "tool_calls" and list(calls) == [0]
    assert calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == arguments
    assert content == (whole.message.content or "")


STRICT_WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["FR-PAR", "IT-ROM"]}},
    "required": ["city"], "additionalProperties": False}


def _turn(number: int, city: str, answer: str) -> list[dict]:
    """A question, the call it got and the tool's result."""
    call_id = f"call{number}"
    return [{"role": "user", "content": f"What is the weather like in {city}?"},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": call_id, "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]},
            {"role": "tool", "tool_call_id": call_id, "content": answer}]


HISTORY = [*_turn(1, "Rome", "18 C"), *_turn(2, "Oslo", "3 C"), *_turn(3, "Madrid", "25 C"),
           {"role": "user", "content": "What is the weather like in Paris?"}]


@pytest.fixture(scope="module")
def hermes_url():
    proc = ServerProcess("--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                         "--chat-template", TEMPLATE).wait_ready()
    yield proc.url
    proc.stop()


def strict_tools(strict: bool) -> list[dict]:
    return [{"type": "function", "function": {"name": "get_weather", "strict": strict,
                                              "parameters": STRICT_WEATHER}}]


def test_strict_tool_under_auto_holds_the_arguments(hermes_url):
    kw = {"model": "SmolLM2-135M-Instruct", "messages": HISTORY, "tool_choice": "auto",
          "temperature": 0, "max_tokens": 60}
    with sdk(hermes_url) as client:
        free = client.chat.completions.create(tools=strict_tools(False), **kw).choices[0]
        strict = client.chat.completions.create(tools=strict_tools(True), **kw).choices[0]
        calls, reason, _ = streamed(client, tools=strict_tools(True), **kw)
        single = client.chat.completions.create(tools=strict_tools(True),
                                                parallel_tool_calls=False, **kw).choices[0]
    # Left alone, the model copies the history's plain city name, which the schema refuses.
    assert free.message.tool_calls, free
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(free.message.tool_calls[0].function.arguments),
                            STRICT_WEATHER)
    assert strict.finish_reason == "tool_calls" and strict.message.tool_calls, strict
    for call in strict.message.tool_calls:
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), STRICT_WEATHER)
    assert reason == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        (c.function.name, json.loads(c.function.arguments)) for c in strict.message.tool_calls]
    assert single.finish_reason == "tool_calls" and len(single.message.tool_calls) == 1
    jsonschema.validate(json.loads(single.message.tool_calls[0].function.arguments),
                        STRICT_WEATHER)
