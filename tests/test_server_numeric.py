"""Every numeric request field across the whole JSON number range, on a real server.

Property: whatever number a client puts in a numeric field of /v1/completions or
/v1/chat/completions (huge ints, negatives, 1e308, subnormals, -0.0, ints where floats go
and floats where ints go), the answer is a 400 naming one of the fields it set, or a normal
200; and the server then still answers a canary with the same greedy text. Numbers beyond
a double's range (|x| > 1.8e308) are not JSON this server parses: a 400 without a field.

Also --max-logprobs as vLLM applies it: the limit's message, -1 as the whole vocabulary.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from server_helpers import ServerProcess, default_tokenizer

pytestmark = pytest.mark.slow

VOCAB = 49152
CONTEXT = 64  # every valid max_tokens is small, so each example stays cheap
ENVELOPE = {"message", "type", "param", "code"}

INTS = st.one_of(
    st.integers(-(2**1000), 2**1000),
    st.integers(-40, 40),
    st.sampled_from([2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, -(2**63),
                     -(2**63) - 1, 2**64 - 1, 2**64, 10**300, VOCAB - 1, VOCAB]),
)
FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),  # subnormals, -0.0 and 1e308 included
    st.floats(-3.0, 3.0),
    st.sampled_from([-0.0, 5e-324, 1e-320, 1e-46, 1e-40, 2.0**-126, 1e-5, 0.01, 1.0000001,
                     2.0000001, 1e308, -1e308, 0.5, 1.0, 2.0]),
)
NUMBERS = st.one_of(INTS, FLOATS)

# Numeric fields: how a number goes into the body, and the field a 400 must name.
SCALARS = ["n", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
           "frequency_penalty", "repetition_penalty", "seed", "min_tokens", "max_tokens",
           "prompt_logprobs", "truncate_prompt_tokens", "priority"]
LISTS = ["stop_token_ids", "allowed_token_ids"]  # [number]
COMPLETION_FIELDS = SCALARS + LISTS + ["logprobs", "best_of", "logit_bias", "logit_bias_key",
                                       "prompt"]
CHAT_FIELDS = SCALARS + LISTS + ["max_completion_tokens", "top_logprobs", "logit_bias",
                                 "logit_bias_key"]


def put(body: dict[str, Any], field: str, value: Any) -> str:
    """Sets `field` to `value` in the body; returns the name a 400 must give."""
    if field in LISTS:
        body[field] = [value]
    elif field == "logit_bias":
        body[field] = {"5": value}
    elif field == "logit_bias_key":
        body["logit_bias"] = {str(value): 1.0}
        return "logit_bias"
    elif field == "prompt":
        body[field] = [value]
    else:
        body[field] = value
        if field == "top_logprobs":
            body["logprobs"] = True
    return field


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--max-model-len", str(CONTEXT)).wait_ready()
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def canary(server) -> dict[str, Any]:
    body = {"prompt": default_tokenizer()("The three primary colours are",
                                          add_special_tokens=False)["input_ids"],
            "max_tokens": 4, "temperature": 0}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200
    return {"body": body, "text": r.json()["choices"][0]["text"]}


def check(server, canary, path: str, base: dict[str, Any], fields: dict[str, Any]) -> None:
    body = dict(base)
    names = {put(body, field, value) for field, value in fields.items()}
    r = httpx.post(server.url + path, json=body, timeout=120)
    assert r.status_code in (200, 400), (body, r.status_code, r.text[:300])
    payload = r.json()
    if r.status_code == 400:
        err = payload["error"]
        assert set(err) == ENVELOPE and err["type"] == "BadRequestError", err
        assert err["param"] in names, (body, err)
    else:
        assert "error" not in payload and payload["choices"], payload
        assert all(c["finish_reason"] in ("stop", "length") for c in payload["choices"])
    again = httpx.post(server.url + "/v1/completions", json=canary["body"], timeout=60)
    assert again.status_code == 200 and again.json()["choices"][0]["text"] == canary["text"]


FEW = settings(max_examples=60, deadline=None, database=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture])


@FEW
@given(fields=st.dictionaries(st.sampled_from(COMPLETION_FIELDS), NUMBERS, min_size=1,
                              max_size=3))
@example(fields={"top_k": 2**31})  # once an int32 overflow inside the step
@example(fields={"top_p": 1e-46, "temperature": 1.0})  # once 0.0 in float32
@example(fields={"repetition_penalty": 1e-46})
@example(fields={"top_p": 1e-40, "temperature": 1.0})  # a float32 subnormal
@example(fields={"temperature": 5e-324, "n": 2})
@example(fields={"logprobs": -1})
@example(fields={"prompt": 2**64})
def test_completions_numbers(server, canary, fields: dict[str, Any]) -> None:
    base = {"prompt": "Hello", "max_tokens": 2}
    check(server, canary, "/v1/completions", base, fields)


@FEW
@given(fields=st.dictionaries(st.sampled_from(CHAT_FIELDS), NUMBERS, min_size=1, max_size=3))
@example(fields={"top_k": 2**31})
@example(fields={"top_p": 1e-46, "temperature": 1.0})
@example(fields={"repetition_penalty": 1e-46})
@example(fields={"top_logprobs": -1})
@example(fields={"top_logprobs": 21})
@example(fields={"max_completion_tokens": 0})
def test_chat_numbers(server, canary, fields: dict[str, Any]) -> None:
    base = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    if "max_completion_tokens" in fields:
        del base["max_tokens"]
    check(server, canary, "/v1/chat/completions", base, fields)


def test_beyond_a_double_is_not_json(server) -> None:
    r = httpx.post(server.url + "/v1/completions", timeout=30, headers={
        "Content-Type": "application/json"},
        content=b'{"prompt": "Hi", "top_k": 1' + b"0" * 400 + b"}")
    assert r.status_code == 400 and set(r.json()["error"]) == ENVELOPE


def test_max_logprobs_as_vllm_refuses(server) -> None:
    cases = [
        ("/v1/completions", {"prompt": "Hi", "logprobs": 21}, "logprobs",
         "Requested sample logprobs of 21, which is greater than max allowed: 20"),
        ("/v1/completions", {"prompt": "Hi", "logprobs": -1}, "logprobs",
         f"Requested sample logprobs of {VOCAB}, which is greater than max allowed: 20"),
        ("/v1/completions", {"prompt": "Hi", "prompt_logprobs": 21}, "prompt_logprobs",
         "Requested prompt logprobs of 21, which is greater than max allowed: 20"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                  "logprobs": True, "top_logprobs": 25}, "top_logprobs",
         "Requested sample logprobs of 25, which is greater than max allowed: 20"),
    ]
    for path, body, param, message in cases:
        r = httpx.post(server.url + path, json=dict(body, max_tokens=2), timeout=30)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert (err["param"], err["message"], err["type"]) == (param, message,
                                                              "BadRequestError")


def test_max_logprobs_minus_one_reaches_the_engine() -> None:
    """--max-logprobs -1 (the vocabulary) passes through to the engine: 25 alternatives on
    either API, and -1 asks for all of them."""
    srv = ServerProcess("--max-model-len", str(CONTEXT), "--max-logprobs", "-1").wait_ready()
    try:
        r = httpx.post(srv.url + "/v1/completions", timeout=60, json={
            "prompt": "Hi", "max_tokens": 2, "logprobs": 25, "prompt_logprobs": 25})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        # Completions: the sampled token and the 25 best (the sampled one may be among them).
        assert all(25 <= len(top) <= 26 for top in choice["logprobs"]["top_logprobs"])
        assert all(len(p) >= 25 for p in choice["prompt_logprobs"][1:])
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "logprobs": True, "top_logprobs": 25})
        assert r.status_code == 200, r.text
        content = r.json()["choices"][0]["logprobs"]["content"]
        assert [len(c["top_logprobs"]) for c in content] == [25, 25]
        for path, body in (("/v1/completions", {"prompt": "Hi", "logprobs": -1}),
                           ("/v1/chat/completions", {
                               "messages": [{"role": "user", "content": "Hi"}],
                               "logprobs": True, "top_logprobs": -1})):
            r = httpx.post(srv.url + path, timeout=120, json=dict(body, max_tokens=1))
            assert r.status_code == 200, r.text
            lp = r.json()["choices"][0]["logprobs"]
            tops = lp["top_logprobs"][0] if "top_logprobs" in lp else \
                lp["content"][0]["top_logprobs"]
            # Every token id of the vocabulary; completions key them by text, so tokens
            # decoding to the same text share one entry.
            assert len(tops) == VOCAB if isinstance(tops, list) else len(tops) > VOCAB // 2
        assert srv.stop() == 0
    finally:
        srv.stop()
