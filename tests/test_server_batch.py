"""POST /v1/chat/completions/batch and POST /invocations on a real `python -m server`.

A batch of N conversations must give, choice by choice, what N single chat requests give
at temperature 0 (text and token count), with usage summed over the conversations as vLLM
sums it; its N prompts enter the engine together (one step computes them all); vLLM's
refusals come back as 400s naming the field, and the server keeps serving.
"""

from __future__ import annotations

import json

import httpx
import pytest

from server_helpers import metric

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
TOPICS = ("the sea", "a cat", "bread", "winter", "a clock", "rivers", "the moon", "chess")
CONVERSATIONS = [[{"role": "user", "content": f"Write one sentence about {t}."}]
                 for t in TOPICS]
GREEDY = {"temperature": 0, "max_tokens": 12, "logprobs": True, "top_logprobs": 1}


@pytest.fixture(scope="module")
def server(plain_server):
    return plain_server.url


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=300)


def steps(url: str) -> float:
    value = metric(httpx.get(url + "/metrics").text, "vllm:iteration_tokens_total_count",
                   model_name=MODEL)
    assert value is not None
    return value


def test_batch_equals_single_requests_and_sums_usage(server):
    singles = []
    for conversation in CONVERSATIONS:
        r = post(server, "/v1/chat/completions", {"messages": conversation, **GREEDY})
        assert r.status_code == 200, r.text
        singles.append(r.json())
    r = post(server, "/v1/chat/completions/batch", {"messages": CONVERSATIONS, **GREEDY})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert [c["index"] for c in body["choices"]] == list(range(len(CONVERSATIONS)))
    for choice, single in zip(body["choices"], singles, strict=True):
        expected = single["choices"][0]
        assert choice["message"] == expected["message"]
        assert choice["finish_reason"] == expected["finish_reason"]
        # token by token: the same ids' texts and as many tokens as the single request
        assert [t["token"] for t in choice["logprobs"]["content"]] == \
            [t["token"] for t in expected["logprobs"]["content"]]
        assert len(choice["logprobs"]["content"]) == single["usage"]["completion_tokens"]
    prompt = sum(s["usage"]["prompt_tokens"] for s in singles)
    completion = sum(s["usage"]["completion_tokens"] for s in singles)
    assert body["usage"] == {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion,
                             "prompt_tokens_details": None}
    assert body["prompt_logprobs"] is None


def test_batch_prompts_enter_the_engine_together(server):
    # Every choice runs max_tokens tokens: admitted together, that takes max_tokens
    # steps (the first computes all 8 prompts); a prompt admitted later would add steps.
    max_tokens = 6
    before = steps(server)
    r = post(server, "/v1/chat/completions/batch", {
        "messages": CONVERSATIONS, "temperature": 0, "max_tokens": max_tokens,
        "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == max_tokens * len(CONVERSATIONS)
    assert steps(server) - before == max_tokens


def test_batch_structured_outputs_constrain_every_choice(server):
    schema = {"type": "object", "properties": {"answer": {"type": "string",
                                                          "enum": ["yes", "no"]}},
              "required": ["answer"]}
    r = post(server, "/v1/chat/completions/batch", {
        "messages": [[{"role": "user", "content": "Is the sky blue? Answer in JSON."}],
                     [{"role": "user", "content": "Is fire cold? Answer in JSON."}]],
        "temperature": 0, "max_tokens": 40,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "answer", "schema": schema}}})
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        assert json.loads(choice["message"]["content"])["answer"] in ("yes", "no")


def test_batch_echo_and_role_are_per_conversation(server):
    r = post(server, "/v1/chat/completions/batch", {
        "messages": [[{"role": "user", "content": "Name a color."}],
                     [{"role": "user", "content": "Name a color."},
                      {"role": "assistant", "content": "My favourite color is"}]],
        "echo": True, "add_generation_prompt": False, "continue_final_message": False,
        "temperature": 0, "max_tokens": 4})
    assert r.status_code == 200, r.text
    first, second = r.json()["choices"]
    # The first conversation ends with the user: that is the response's role, and echo
    # repeats that last message; the second continues the assistant's.
    assert first["message"]["role"] == "user"
    assert first["message"]["content"].startswith("Name a color.")
    assert second["message"]["role"] == "assistant"
    assert second["message"]["content"].startswith("My favourite color is")


@pytest.mark.parametrize("extra,param,words", [
    ({"n": 2}, "n", "Batch chat completions do not support `n > 1`. Please set `n` to 1."),
    ({"use_beam_search": True}, "use_beam_search", "do not support beam search"),
    ({"stream": True}, "stream", "do not support streaming"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools",
     "do not support tool use"),
    ({"tool_choice": "auto"}, "tool_choice", "do not support tool use"),
    ({"prompt_logprobs": 1}, "prompt_logprobs", "do not support prompt logprobs"),
    ({"messages": [[]]}, "messages.0", "at least one message"),
    ({"messages": []}, "messages", None),
    ({"messages": [{"role": "user", "content": "hi"}]}, "messages", "messages.0"),
    ({"temperature": "hot"}, "temperature", None),
])
def test_batch_refusals(server, extra, param, words):
    r = post(server, "/v1/chat/completions/batch",
             {"messages": CONVERSATIONS[:2], "max_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "BadRequestError" and err["code"] == 400
    assert err["param"] == param, err
    if words is not None:
        assert words in err["message"]
    canary = post(server, "/v1/chat/completions/batch",
                  {"messages": CONVERSATIONS[:1], "max_tokens": 2})
    assert canary.status_code == 200, canary.text


def test_invocations_dispatch_every_kind(server):
    batch = {"messages": CONVERSATIONS[:3], "temperature": 0, "max_tokens": 6}
    direct = post(server, "/v1/chat/completions/batch", batch).json()
    via = post(server, "/invocations", batch).json()
    assert via["object"] == "chat.completion"
    assert [c["message"] for c in via["choices"]] == [c["message"] for c in direct["choices"]]

    chat = {"messages": CONVERSATIONS[0], "temperature": 0, "max_tokens": 6}
    assert post(server, "/invocations", chat).json()["choices"][0]["message"] == \
        post(server, "/v1/chat/completions", chat).json()["choices"][0]["message"]

    cmpl = {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 6}
    via = post(server, "/invocations", cmpl).json()
    assert via["object"] == "text_completion"
    assert via["choices"][0]["text"] == \
        post(server, "/v1/completions", cmpl).json()["choices"][0]["text"]

    # A malformed body of a known kind gets that kind's own 400.
    r = post(server, "/invocations", {**batch, "n": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    r = post(server, "/invocations", {"text": "hello"})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert message.startswith("Cannot find suitable handler for request. Expected one of: [")
    assert "/v1/chat/completions/batch, /v1/messages, /v1/chat/completions" in message
    # not mounted on a generative model without --pooler-config: never offered
    assert "/v1/embeddings" not in message and "/rerank" not in message


def test_invocations_dispatch_messages_and_responses(server):
    # beyond vLLM: the Anthropic and Responses bodies are served here too
    msg = {"model": "SmolLM2-135M-Instruct", "max_tokens": 6, "temperature": 0,
           "messages": [{"role": "user", "content": "Say hi."}]}
    direct = post(server, "/v1/messages", msg).json()
    for headers in ({"anthropic-version": "2023-06-01"}, {}):
        body = msg if headers else {**msg, "system": "Be brief."}
        r = httpx.post(server + "/invocations", json=body, headers=headers, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["type"] == "message"
    r = httpx.post(server + "/invocations", json=msg,
                   headers={"anthropic-version": "2023-06-01"}, timeout=120)
    assert r.json()["content"] == direct["content"]
    # a chat body with max_tokens stays chat
    chat = {"messages": msg["messages"], "max_tokens": 6, "temperature": 0}
    assert post(server, "/invocations", chat).json()["object"] == "chat.completion"

    resp = {"model": "SmolLM2-135M-Instruct", "input": "Say hi.", "max_output_tokens": 6,
            "temperature": 0, "store": False}
    via = post(server, "/invocations", resp).json()
    assert via["object"] == "response" and via["status"] in ("completed", "incomplete")
    assert via["output"] == [] or via["output"][0]["type"] == "message"
    bare = post(server, "/invocations", {"input": "Say hi.", "store": False}).json()
    assert bare["object"] == "response"  # no embeddings here: `input` is a Responses turn
    # its own route's 400, in OpenAI's envelope
    r = post(server, "/invocations", {"input": "x", "max_output_tokens": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_output_tokens", r.text


@pytest.mark.parametrize("path", [
    "/v1/chat/completions/render", "/v1/completions/render", "/v1/chat/completions/derender",
    "/v1/completions/derender", "/inference/v1/generate", "/inference/v1/abort_requests"])
def test_scale_out_routes_are_refused_without_the_flag(server, path):
    # As vLLM: 403 before the body is even parsed; the legacy /abort_requests is not there.
    r = httpx.post(server + path, content=b"not JSON", timeout=30)
    assert r.status_code == 403, r.text
    err = r.json()["error"]
    assert err["type"] == "PermissionDeniedError" and "--enable-scale-out" in err["message"]
    assert httpx.post(server + "/abort_requests", json={"request_ids": []}).status_code == 404
    assert path not in httpx.get(server + "/openapi.json").json()["paths"]
