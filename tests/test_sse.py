"""server.sse framing: the plain `data:` form the OpenAI APIs stream, and the named `event:`
form the Anthropic Messages and OpenAI Responses APIs need, checked to the byte and read back
by a real client's SSE decoder (the OpenAI SDK's, which also reads event names)."""

from __future__ import annotations

import orjson
import pytest
from openai._streaming import SSEDecoder

from server import sse


def decoded(body: bytes) -> list[tuple[str | None, str]]:
    return [(e.event, e.data) for e in SSEDecoder().iter_bytes(iter([body]))]


def test_plain_event_is_one_data_line():
    payload = {"id": "x", "choices": [{"text": "a\nb", "logprob": -1.5}]}
    body = sse.event(payload)
    assert body == b'data: {"id":"x","choices":[{"text":"a\\nb","logprob":-1.5}]}\n\n'
    assert decoded(body) == [(None, orjson.dumps(payload).decode())]


def test_named_event_precedes_its_data():
    payload = {"type": "message_start", "message": {"id": "msg_1", "content": []}}
    body = sse.event(payload, "message_start")
    assert body == (b"event: message_start\n"
                    b'data: {"type":"message_start","message":{"id":"msg_1","content":[]}}\n\n')
    assert decoded(body) == [("message_start", orjson.dumps(payload).decode())]


def test_a_stream_mixes_named_events_comments_and_done():
    body = b"".join([
        sse.event({"a": 1}, "message_start"),
        sse.KEEPALIVE,
        sse.event({"b": "é"}, "content_block_delta"),
        sse.event({"c": None}),
        sse.error_event(503, "busy", "error"),
        sse.DONE,
    ])
    events = decoded(body)
    assert [name for name, _ in events] == ["message_start", "content_block_delta", None,
                                            "error", None]
    assert orjson.loads(events[1][1]) == {"b": "é"}
    error = orjson.loads(events[3][1])["error"]
    assert error["code"] == 503 and error["message"] == "busy"
    assert events[-1][1] == "[DONE]"


@pytest.mark.parametrize("name", ["", "two\nlines", "cr\r", "\n"])
def test_event_names_that_would_break_the_framing_are_refused(name):
    with pytest.raises(ValueError):
        sse.event({}, name)
