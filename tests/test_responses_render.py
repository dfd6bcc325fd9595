"""The Responses API's output builder (server/api/openai/responses_render.py) on scripted
Hermes output the small default model does not write on its own: text and two calls, fed
whole and in random splits. Every event is validated against the openai SDK's own event
models and replayed through the SDK's stream accumulator (the state behind
`client.responses.stream`), which must end with the same items a whole response has."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from server.api.openai.protocol.responses import ResponsesRequest
from server.api.openai.responses import _tool_plan
from server.api.openai.responses_render import EventCounter, OutputBuilder, ResponseShape
from server.config import ServerConfig
from server.frontend.service import Usage

TOOLS = [{"type": "function", "name": "get_weather", "parameters": {
             "type": "object", "properties": {"city": {"type": "string"}}}},
         {"type": "function", "name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"type": "string"}}}}]
TEXT = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris \\"centre\\""}}\n</tool_call>\n<tool_call>\n'
        '{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')
SRV = SimpleNamespace(config=ServerConfig(enable_auto_tool_choice=True,
                                          tool_call_parser="hermes"))
EVENT = TypeAdapter(ResponseStreamEvent)


def builder(**body) -> OutputBuilder:
    req = ResponsesRequest.model_validate({"input": "hi", "tools": TOOLS, **body})
    return OutputBuilder(_tool_plan(SRV, req), None)  # type: ignore[arg-type]


def shape() -> ResponseShape:
    echo = {"parallel_tool_calls": True, "tool_choice": "auto", "tools": TOOLS}
    return ResponseShape(response_id="resp_x", model="m", echo=echo)


def without_ids(items: list[dict]) -> list[dict]:
    """Items as two builders agree on them (item and call ids are fresh per response)."""
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]


def replay(pieces: list[str], reason: str = "stop", **body) -> tuple[list[dict], Response]:
    """The stream's events, checked one by one by the SDK, and the SDK's final response."""
    b, s, counter = builder(**body), shape(), EventCounter()
    events = [{"type": "response.created", "response": s.body("in_progress", [])}]
    for i, piece in enumerate(pieces):
        events += b.feed(piece, [], reason if i == len(pieces) - 1 else None)
    status = "incomplete" if reason == "length" else "completed"
    events.append({"type": f"response.{status}", "response": s.body(status, b.output,
                                                                    Usage(3, 9))})
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in events:
        state.handle_event(EVENT.validate_python(counter.number(event)))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = Response.model_validate(events[-1]["response"])
    return events, final


def splits(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 30)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def test_whole_output_items():
    b = builder()
    b.feed(TEXT, [], "stop")
    msg, weather, time_ = b.output
    assert msg["type"] == "message" and msg["content"][0]["text"].strip() == "Let me check."
    assert (weather["name"], weather["arguments"]) == ("get_weather",
                                                       '{"city": "Paris \\"centre\\""}')
    assert (time_["name"], time_["arguments"]) == ("get_time", '{"zone": "CET"}')
    assert weather["call_id"] != time_["call_id"]
    assert all(item["status"] == "completed" for item in b.output)


@pytest.mark.parametrize("seed", range(8))
def test_streamed_in_random_splits_equals_whole(seed: int):
    whole = builder()
    whole.feed(TEXT, [], "stop")
    events, final = replay(splits(TEXT, random.Random(seed)))
    assert without_ids([o.model_dump(exclude_none=True) for o in final.output]) == \
        without_ids(whole.output)
    added = [e["item"]["id"] for e in events if e["type"] == "response.output_item.added"]
    assert added == [o.id for o in final.output]
    args = "".join(e["delta"] for e in events
                   if e["type"] == "response.function_call_arguments.delta")
    assert args == '{"city": "Paris \\"centre\\""}{"zone": "CET"}'


def test_parallel_tool_calls_false_keeps_the_first_call():
    _, final = replay(splits(TEXT, random.Random(1)), parallel_tool_calls=False)
    assert [o.type for o in final.output] == ["message", "function_call"]
    assert final.output[1].name == "get_weather"


def test_a_cut_leaves_the_last_item_incomplete():
    _, final = replay(["Let me ", "check."], reason="length")
    assert final.status == "incomplete" and final.incomplete_details.reason == \
        "max_output_tokens"
    assert final.output[0].status == "incomplete" and final.output_text == "Let me check."
