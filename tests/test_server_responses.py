"""The Responses API against the real server, the real default model and the real openai SDK:
string and item input with instructions, the max_output_tokens cut, the SDK's stream helper
(typed events, sequence numbers, the same text as a whole response), retrieve, a
conversation by previous_response_id (its prompt checked token for token against /tokenize
of the same chat), function calling with required and named tool choice and a
function_call_output turn, text.format json_schema, background runs and cancel (the engine
left idle), a stored stream its client left (stored incomplete), the SQLite store across a
restart, its count and byte bounds and each API key's share, two servers on one store file,
the error envelopes, then a canary."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time

import httpx
import jsonschema
import openai
import pytest
from server_helpers import ROOT, ServerProcess, metric

MODEL = "SmolLM2-135M-Instruct"
TEMPLATE = str(ROOT / "examples" / "tool_chat_template_chatml_hermes.jinja")
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather in a city",
          "parameters": WEATHER},
         {"type": "function", "name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC"]}},
             "required": ["zone"], "additionalProperties": False}}]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
ASK = "What is the weather like in Paris?"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store = tmp_path_factory.mktemp("responses") / "store.sqlite"
    proc = ServerProcess("--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                         "--chat-template", TEMPLATE, "--responses-store", str(store)
                         ).wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def create(client, **kw):
    kw.setdefault("max_output_tokens", 40)
    return client.responses.create(model=MODEL, temperature=0, **kw)


def prompt_tokens(server, messages, tools=None) -> int:
    """The prompt length of a chat, rendered by the same template through /tokenize."""
    body = {"model": MODEL, "messages": messages}
    if tools:
        body["tools"] = [{"type": "function", "function": {k: v for k, v in t.items()
                                                           if k != "type"}} for t in tools]
    r = httpx.post(server.url + "/tokenize", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["count"]


def test_string_input_and_items_with_instructions(server, client):
    r = create(client, input="Say hello.")
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.model == MODEL and r.error is None and r.incomplete_details is None
    (msg,) = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.status == "completed"
    assert msg.content[0].type == "output_text" and msg.content[0].annotations == []
    assert r.output_text.strip()
    assert r.usage.input_tokens == prompt_tokens(server, [{"role": "user",
                                                           "content": "Say hello."}])
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.temperature == 0 and r.tool_choice == "auto" and r.tools == []

    items = [{"role": "user", "content": [{"type": "input_text", "text": "Name a color."}]}]
    r2 = create(client, input=items, instructions="Answer in one word.",
                metadata={"k": "v"})
    assert r2.status in ("completed", "incomplete") and r2.output_text
    assert r2.instructions == "Answer in one word." and r2.metadata == {"k": "v"}
    assert r2.usage.input_tokens == prompt_tokens(server, [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Name a color."}])
    assert client.responses.retrieve(r2.id).model_dump() == r2.model_dump()


def test_max_output_tokens_cut_is_incomplete(client):
    r = create(client, input="Write a long poem about the sea.", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"
    assert r.max_output_tokens == 3


def test_output_logprobs_and_truncation(client):
    kw = dict(input="Say hello.", max_output_tokens=5, include=["message.output_text.logprobs"],
              top_logprobs=2)
    whole = create(client, **kw)
    lps = whole.output[0].content[0].logprobs
    assert len(lps) == whole.usage.output_tokens == 5
    assert "".join(lp.token for lp in lps) == whole.output_text
    assert all(len(lp.top_logprobs) == 2 and lp.top_logprobs[0].logprob >= lp.logprob - 1e-4
               for lp in lps)  # temperature 0: the sampled token is the most likely
    with client.responses.stream(model=MODEL, temperature=0, **kw) as stream:
        deltas = [e for e in stream if e.type == "response.output_text.delta"]
    assert [lp.token for e in deltas for lp in e.logprobs] == [lp.token for lp in lps]
    # A prompt longer than the context: a 400 naming input, unless truncation is "auto".
    long = "word " * 1500
    with pytest.raises(openai.BadRequestError) as err:
        create(client, input=long, max_output_tokens=2)
    assert err.value.body["param"] == "input"
    cut = create(client, input=long, max_output_tokens=1, truncation="auto",
                 reasoning={"effort": "low"})
    assert cut.usage.input_tokens == 1023 and cut.truncation == "auto"
    assert cut.reasoning.effort == "low"


def test_stream_helper_matches_whole_response(server, client):
    kw = dict(input="Say hello.", max_output_tokens=200)
    whole = create(client, **kw)
    assert whole.status == "completed", whole
    with client.responses.stream(model=MODEL, temperature=0, **kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == final.output_text == whole.output_text
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.id == final.output[0].id and final.id == events[0].response.id
    assert client.responses.retrieve(final.id).output_text == whole.output_text
    # On the wire: each record is `event: <type>` then `data: <json>` of that type.
    with httpx.stream("POST", server.url + "/v1/responses", timeout=60, json=dict(
            kw, model=MODEL, temperature=0, max_output_tokens=5, stream=True)) as r:
        lines = [line for line in r.iter_lines() if line]
    names = [line[7:] for line in lines if line.startswith("event: ")]
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert names == [d["type"] for d in data] and names[-1] == "response.incomplete"
    assert all(lines[i].startswith("event: ") == (i % 2 == 0) for i in range(len(lines)))
    # A client that leaves mid-stream aborts its generation, as on chat.
    with httpx.stream("POST", server.url + "/v1/responses", timeout=60, json=dict(
            input="Write a very long story.", model=MODEL, max_output_tokens=900,
            stream=True)) as r:
        for line in r.iter_lines():
            if "response.output_text.delta" in line:
                break
    assert wait_until(lambda: idle(server))


def test_conversation_by_previous_response_id(server, client):
    first = create(client, input="My name is Ada. Say hi.", max_output_tokens=20)
    second = create(client, input="What is my name?", previous_response_id=first.id,
                    instructions="Be brief.", max_output_tokens=20)
    assert second.previous_response_id == first.id
    # The second prompt is the first turn (input and output), then the new input; the
    # first turn's instructions would not carry over, this one's lead.
    assert second.usage.input_tokens == prompt_tokens(server, [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "My name is Ada. Say hi."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}])
    third = create(client, input="Thanks.", previous_response_id=second.id,
                   max_output_tokens=5)
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens
    # store: false keeps nothing: neither GET nor a later turn finds it.
    gone = create(client, input="Forget this.", store=False, max_output_tokens=5)
    for call in (lambda: client.responses.retrieve(gone.id),
                 lambda: create(client, input="x", previous_response_id=gone.id)):
        with pytest.raises(openai.NotFoundError):
            call()


def test_function_calling_required_named_and_output_turn(server, client):
    r = create(client, input=ASK, tools=TOOLS, tool_choice="required",
               parallel_tool_calls=False, max_output_tokens=80)
    assert r.status == "completed", r
    (call,) = r.output
    assert call.type == "function_call" and call.status == "completed"
    assert call.name in ("get_weather", "get_time") and call.id.startswith("fc_")
    assert call.call_id
    jsonschema.validate(json.loads(call.arguments),
                        WEATHER if call.name == "get_weather" else TOOLS[1]["parameters"])

    named = {"type": "function", "name": "get_weather"}
    with client.responses.stream(model=MODEL, temperature=0, input=ASK, tools=TOOLS,
                                 tool_choice=named, max_output_tokens=80) as stream:
        events = list(stream)
        final = stream.get_final_response()
    (fc,) = final.output
    assert fc.name == "get_weather" and final.tool_choice.name == "get_weather"
    jsonschema.validate(json.loads(fc.arguments), WEATHER)
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    streamed = "".join(e.delta for e in events
                       if e.type == "response.function_call_arguments.delta")
    assert done.arguments == streamed == fc.arguments and done.item_id == fc.id

    history = [{"role": "user", "content": ASK},
               {"type": "function_call", "call_id": fc.call_id, "name": fc.name,
                "arguments": fc.arguments},
               {"type": "function_call_output", "call_id": fc.call_id,
                "output": "Sunny, 21 C"}]
    answer = create(client, input=history, tools=TOOLS, tool_choice="none")
    assert answer.output[0].type == "message" and answer.output_text
    assert answer.usage.input_tokens == prompt_tokens(server, [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": fc.call_id, "type": "function",
             "function": {"name": fc.name, "arguments": fc.arguments}}]},
        {"role": "tool", "content": "Sunny, 21 C", "tool_call_id": fc.call_id}], TOOLS)
    # The same turn through previous_response_id: the stored call, then its output.
    follow = create(client, previous_response_id=final.id, tools=TOOLS, tool_choice="none",
                    input=[history[2]])
    assert follow.usage.input_tokens == answer.usage.input_tokens


def test_text_format_json_schema(client):
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    r = create(client, input="Describe a person as JSON.", text={"format": fmt},
               max_output_tokens=100)
    assert r.status == "completed", r
    jsonschema.validate(json.loads(r.output_text), PERSON)
    assert r.text.format.type == "json_schema"
    # json_object: any object (the small model may go on past the budget, inside it).
    obj = create(client, input="A JSON object, please.", text={"format": {
        "type": "json_object"}}, max_output_tokens=20)
    assert obj.output_text.lstrip().startswith("{") and obj.text.format.type == "json_object"


def idle(server, headers=None) -> bool:
    text = httpx.get(server.url + "/metrics", headers=headers).text
    return (metric(text, "vllm:num_requests_running", model_name=MODEL) == 0.0
            and metric(text, "vllm:kv_cache_usage_perc", model_name=MODEL) == 0.0)


def wait_until(check, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_background_runs_polls_and_cancels(server, client):
    done = create(client, input="Say hi.", background=True, max_output_tokens=10)
    assert done.status == "in_progress" and done.background and done.output == []
    assert wait_until(lambda: client.responses.retrieve(done.id).status != "in_progress")
    polled = client.responses.retrieve(done.id)
    assert polled.status in ("completed", "incomplete") and polled.output_text
    assert polled.usage.output_tokens > 0

    long = create(client, input="Write a very long story about dragons.", background=True,
                  max_output_tokens=900)
    def running() -> bool:
        text = httpx.get(server.url + "/metrics").text
        return (metric(text, "vllm:num_requests_running", model_name=MODEL) == 1.0
                and metric(text, "vllm:kv_cache_usage_perc", model_name=MODEL) > 0)

    assert wait_until(running)
    assert client.responses.retrieve(long.id).status == "in_progress"
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == "cancelled" and cancelled.id == long.id
    assert client.responses.retrieve(long.id).status == "cancelled"
    assert wait_until(lambda: idle(server)), httpx.get(server.url + "/metrics").text
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
        client.responses.cancel(long.id)


def retrieved(client, response_id):
    """The stored response, or None (404)."""
    try:
        return client.responses.retrieve(response_id)
    except openai.NotFoundError:
        return None


def test_abandoned_stream_is_stored_incomplete(server, client):
    """A client that leaves a stored stream before its end: what was generated is stored,
    incomplete, and a later turn can continue it."""
    with httpx.stream("POST", server.url + "/v1/responses", timeout=60, json={
            "input": "Write a very long story.", "model": MODEL, "max_output_tokens": 900,
            "ignore_eos": True, "stream": True}) as r:
        rid, read = None, ""
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "response.created":
                rid = event["response"]["id"]
            elif event["type"] == "response.output_text.delta":
                read += event["delta"]
                if len(read) > 20:
                    break
    assert rid and read
    assert wait_until(lambda: retrieved(client, rid) is not None)
    got = client.responses.retrieve(rid)
    assert got.status == "incomplete" and got.incomplete_details.reason == "client_disconnected"
    (msg,) = got.output
    assert msg.status == "incomplete" and got.output_text.startswith(read)
    assert 0 < got.usage.output_tokens < 900
    assert got.usage.input_tokens == prompt_tokens(server, [
        {"role": "user", "content": "Write a very long story."}])
    later = create(client, input="Go on.", previous_response_id=rid, max_output_tokens=3)
    assert later.usage.input_tokens > got.usage.total_tokens
    assert wait_until(lambda: idle(server))
    assert httpx.get(server.url + "/health").status_code == 200
    canary = create(client, input="Say hello.")
    assert canary.status == "completed" and canary.output_text


def test_store_shares_bytes_running_rows_and_two_replicas(tmp_path):
    """Two servers on one store file, two API keys: key a floods its share (3 rows, 40 KiB)
    and key b's rows stay; a's running background row is never evicted, and the second
    server's first use of the file leaves it running; cancel and retrieve work from
    either server; the file is private."""
    path = tmp_path / "made" / "store.sqlite"
    args = ("--api-key", "ka", "kb", "--responses-store", str(path),
            "--responses-store-max-count", "6", "--responses-store-max-bytes", "80k")
    first, second = ServerProcess(*args), ServerProcess(*args)
    clients = contextlib.ExitStack()
    try:
        first.wait_ready()
        second.wait_ready()
        a1, b1, a2 = (clients.enter_context(openai.OpenAI(
            base_url=srv.url + "/v1", api_key=key, max_retries=0))
            for srv, key in ((first, "ka"), (first, "kb"), (second, "ka")))
        kept = [create(b1, input=f"Name a fruit ({i}).", max_output_tokens=4)
                for i in range(2)]
        running = create(a1, input="Write a very long story about dragons.",
                         background=True, max_output_tokens=900,
                         extra_body={"ignore_eos": True})
        started = time.monotonic()
        # The second server opens the file now: the first's running row stays running.
        assert a2.responses.retrieve(running.id).status == "in_progress"
        flood = [create(a1, input=f"Count to {i}.", max_output_tokens=2) for i in range(4)]
        # a's share is 3 rows: its running row and its two newest; b's rows stay.
        assert [retrieved(a1, r.id) is not None for r in flood] == [False, False, True, True]
        assert all(retrieved(b1, r.id).output_text == r.output_text for r in kept)
        # The byte bound: two rows of ~26 KB leave room for one within a's 40 KiB share,
        # though its count (2 of 3) would keep both.
        big = [create(a1, input=f"{i} " + "word " * 5000, max_output_tokens=1,
                      truncation="auto") for i in range(2)]
        assert [retrieved(a1, r.id) is not None for r in big] == [False, True]
        assert [retrieved(a1, r.id) is not None for r in flood] == [False] * 4
        assert all(retrieved(a2, r.id) is not None for r in kept)  # from either server
        assert a1.responses.retrieve(running.id).status == "in_progress", (
            time.monotonic() - started)
        # Cancel from the server that does not run it: the one that does stops it.
        cancelled = a2.responses.cancel(running.id)
        assert cancelled.status == "cancelled" and cancelled.id == running.id
        assert a1.responses.retrieve(running.id).status == "cancelled"
        key = {"Authorization": "Bearer ka"}
        assert wait_until(lambda: idle(first, key)), httpx.get(first.url + "/metrics",
                                                               headers=key).text
        with pytest.raises(openai.BadRequestError, match="Cannot cancel"):
            a1.responses.cancel(running.id)
        for srv, c in ((first, b1), (second, a2)):
            assert httpx.get(srv.url + "/health").status_code == 200
            canary = create(c, input="Say hello.")
            assert canary.status == "completed" and canary.output_text
    finally:
        clients.close()
        assert first.stop() == 0
        assert second.stop() == 0
    assert os.listdir(path.with_name(path.name + ".owners")) == []  # closed at shutdown
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def envelope(r: httpx.Response) -> tuple[int, str, str | None, str]:
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["code"] == r.status_code
    return r.status_code, e["message"], e["param"], e["type"]


BAD = [
    ({"input": "x", "background": True, "store": False}, 400,
     "background can only be used when `store` is true", "background"),
    ({"input": "x", "background": True, "stream": True}, 400,
     "background responses cannot be streamed by this server; poll GET "
     "/v1/responses/{id} instead", "stream"),
    ({"input": "x", "previous_response_id": "resp_missing"}, 404,
     "Response with id 'resp_missing' not found.", "previous_response_id"),
    ({"input": "x", "tools": [{"type": "web_search_preview"}]}, 400,
     "tools of type 'web_search_preview' are not supported by this server; only "
     "'function' tools are", "tools.0.type"),
    ({"input": "x", "tools": TOOLS, "tool_choice": {"type": "file_search"}}, 400,
     "tool_choice of type 'file_search' is not supported by this server; use none, auto, "
     'required or {"type": "function", "name": ...}', "tool_choice"),
    ({"input": "x", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, 400,
     "The tool specified in `tool_choice` does not match any of the specified `tools`",
     "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, 400,
     "text.format.type 'yaml' is not one of text, json_object, json_schema",
     "text.format.type"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}, 400,
     "text.format of type json_schema needs a `schema` object", "text.format.schema"),
    ({"input": "x", "text": {"format": {"type": "json_object"}},
      "structured_outputs": {"regex": "a+"}}, 400,
     "Cannot specify both structured_outputs and text.format", "structured_outputs"),
    ({"input": [{"type": "computer_call", "call_id": "c"}]}, 400,
     "Unsupported input item type: computer_call", "input"),
    ({"input": [{"role": "tool", "content": "x"}]}, 400,
     "Unsupported input message role: 'tool' (one of user, assistant, system, developer)",
     "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     400, "content parts of type 'input_image' are not supported; only input_text and "
     "output_text are", "input"),
    ({"input": []}, 400, "input must not be empty", "input"),
    ({"input": "x", "chat_template": "{{ messages }}"}, 400,
     "a request-supplied chat_template is not allowed on this server (start it with "
     "--trust-request-chat-template)", "chat_template"),
    ({"input": "x", "chat_template_kwargs": {"chat_template": "{{ messages }}"}}, 400,
     "a request-supplied chat_template is not allowed on this server (start it with "
     "--trust-request-chat-template)", "chat_template"),
    ({"input": "x", "metadata": {f"k{i}": "v" for i in range(17)}}, 400,
     "metadata holds at most 16 pairs, keys of at most 64 and values of at most 512 "
     "characters", "metadata"),
    ({"input": "x", "prompt": {"id": "p"}}, 400, "prompt template is not supported", "prompt"),
    ({"input": "x", "reasoning": {"effort": "extreme"}}, 400,
     "1 validation error(s): reasoning.effort: Input should be 'none', 'minimal', 'low', "
     "'medium', 'high', 'xhigh' or 'max'", "reasoning"),
    ({"input": "x", "model": "gpt-9"}, 404,
     f"The model `gpt-9` does not exist. Valid models: {MODEL}.", "model"),
]


def test_error_envelopes_then_canary(server, client):
    url = server.url + "/v1/responses"
    for body, status, message, param in BAD:
        r = httpx.post(url, json=body, timeout=30)
        assert envelope(r)[:3] == (status, message, param), (body, r.text)
    r = httpx.post(url, json={"input": "x", "max_output_tokens": 0}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_output_tokens", r.text
    r = httpx.post(url, json={"input": 5}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("input"), r.text
    assert envelope(httpx.get(url + "/resp_missing")) == (
        404, "Response with id 'resp_missing' not found.", "response_id", "NotFoundError")
    assert envelope(httpx.post(url + "/resp_missing/cancel")) == (
        404, "Response with id 'resp_missing' not found.", "response_id", "NotFoundError")
    finished = create(client, input="Hi.", max_output_tokens=3)
    assert envelope(httpx.post(url + f"/{finished.id}/cancel")) == (
        400, "Cannot cancel a synchronous response.", "response_id", "BadRequestError")
    assert envelope(httpx.get(url + f"/{finished.id}", params={"stream": "true"})) == (
        400, "streaming a stored response is not supported by this server", "stream",
        "BadRequestError")
    canary = create(client, input="Say hello.")
    assert canary.status == "completed" and canary.output_text
    assert wait_until(lambda: idle(server))


def test_store_survives_restart_and_is_bounded(tmp_path):
    # The default store: responses.sqlite in $LLMSERVE_STATE_DIR.
    def run(*extra: str) -> ServerProcess:
        return ServerProcess("--responses-store-max-count", "3", *extra,
                             env={"LLMSERVE_STATE_DIR": str(tmp_path)}).wait_ready()

    srv = run()
    try:
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as c:
            made = [create(c, input=f"Count to {i}.", max_output_tokens=4) for i in range(4)]
            with pytest.raises(openai.NotFoundError):
                c.responses.retrieve(made[0].id)  # the oldest, evicted by the fourth
            kept = {r.id: c.responses.retrieve(r.id).model_dump() for r in made[1:]}
    finally:
        assert srv.stop() == 0
    assert (tmp_path / "responses.sqlite").is_file()
    # A background response still running at SIGTERM outlasts the drain: aborted, it is
    # stored failed (or, cut off before that, marked failed when the store is reopened),
    # never left in progress.
    srv = run("--responses-store-max-count", "10", "--drain-timeout", "2")
    try:
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as c:
            running = create(c, input="Write a long story.", background=True,
                             max_output_tokens=900)
    finally:
        assert srv.stop() == 0
    assert os.listdir(tmp_path / "responses.sqlite.owners") == []  # closed at shutdown
    srv = run()
    try:
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as c:
            assert {i: c.responses.retrieve(i).model_dump() for i in kept} == kept
            lost = c.responses.retrieve(running.id)
            assert lost.status == "failed" and lost.error.code == "server_error"
            with pytest.raises(openai.NotFoundError):
                c.responses.retrieve(made[0].id)
            later = create(c, input="And then?", previous_response_id=made[3].id,
                           max_output_tokens=4)
            assert later.usage.input_tokens > made[3].usage.total_tokens
    finally:
        assert srv.stop() == 0
    srv = run("--no-responses-store", "--api-key", "k")
    try:
        # Every route of the API needs the key.
        for method, path in (("POST", ""), ("GET", "/resp_x"), ("POST", "/resp_x/cancel")):
            r = httpx.request(method, f"{srv.url}/v1/responses{path}", json={"input": "x"})
            assert r.status_code == 401, (method, path, r.text)
        key = {"Authorization": "Bearer k"}
        r = httpx.get(f"{srv.url}/v1/responses/{made[3].id}", headers=key)
        assert envelope(r)[:3] == (404, f"Response with id '{made[3].id}' not found.",
                                   "response_id")
        r = httpx.post(srv.url + "/v1/responses", headers=key,
                       json={"input": "x", "background": True})
        assert envelope(r)[:3] == (400, "background mode needs the response store, which "
                                   "this server runs without (--no-responses-store)",
                                   "background")
        r = httpx.post(srv.url + "/v1/responses", timeout=60, headers=key,
                       json={"input": "Hi.", "max_output_tokens": 3})
        assert r.status_code == 200 and r.json()["store"] is False
    finally:
        assert srv.stop() == 0
