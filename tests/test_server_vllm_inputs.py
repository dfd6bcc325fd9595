"""Bodies written for vLLM, through `python -m server` (the shared plain server): the
coercions vLLM's pydantic models make (lax mode), custom chat roles, and the error texts
clients match on.

- A JSON string or number where vLLM's model reads a bool or an int is coerced exactly as
  vLLM coerces it ("logprobs": "true", "n": 2.0, "max_tokens": "5"); the counts vLLM checks
  on the body as sent (completions' logprobs, chat's top_logprobs) are refused as strings.
  The answer equals the one for the typed body.
- Any chat role reaches the template; string content and [{"type": "text"}] content render
  the same prompt.
- An out-of-int64 seed is pydantic's greater_than_equal / less_than_equal; an empty prompt
  is "Either prompt or prompt_embeds must be provided and non-empty."
"""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def server(plain_server):
    return plain_server.url


def post(server: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(server + path, json=body, timeout=120)


def answer(r: httpx.Response) -> tuple:
    assert r.status_code == 200, r.text
    body = r.json()
    return tuple((c.get("text") or c["message"]["content"], c["logprobs"])
                 for c in body["choices"]), body["usage"]


@pytest.mark.parametrize(("path", "typed", "lax"), [
    ("/v1/chat/completions", {"messages": HI, "logprobs": True, "max_tokens": 4},
     {"messages": HI, "logprobs": "true", "max_tokens": "4"}),
    ("/v1/chat/completions", {"messages": HI, "logprobs": False, "max_tokens": 4},
     {"messages": HI, "logprobs": "no", "max_tokens": 4.0}),
    ("/v1/completions", {"prompt": "Red, green", "n": 2, "seed": 7, "max_tokens": 3,
                         "temperature": 1.0, "echo": True},
     {"prompt": "Red, green", "n": 2.0, "seed": "7", "max_tokens": "3", "temperature": "1",
      "echo": 1}),
    ("/v1/completions", {"prompt": "Red", "max_tokens": 3, "logprobs": 2,
                         "stop_token_ids": [2], "logit_bias": {"11": 1.5}},
     {"prompt": "Red", "max_tokens": 3, "logprobs": 2.0, "stop_token_ids": ["2"],
      "logit_bias": {"11": "1.5"}}),
])
def test_lax_bodies_answer_as_typed_ones(server, path, typed, lax):
    temperature = {"temperature": 0} if "temperature" not in typed else {}
    assert answer(post(server, path, {**typed, **temperature})) == \
        answer(post(server, path, {**lax, **temperature}))


@pytest.mark.parametrize(("path", "body", "param", "words"), [
    # vLLM checks these counts on the body as sent: a string is not a number there
    ("/v1/completions", {"prompt": "x", "logprobs": "2"}, "logprobs",
     "`logprobs` must be an integer."),
    ("/v1/completions", {"prompt": "x", "prompt_logprobs": "1"}, "prompt_logprobs",
     "`prompt_logprobs` must be an integer."),
    ("/v1/chat/completions", {"messages": HI, "logprobs": True, "top_logprobs": "2"},
     "top_logprobs", "`top_logprobs` must be an integer."),
    # what lax mode does not coerce either
    ("/v1/chat/completions", {"messages": HI, "logprobs": "sure"}, "logprobs", "boolean"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 2.5}, "max_tokens", "integer"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages",
     "string"),
    ("/v1/chat/completions", {"messages": [{"role": 7, "content": "hi"}]}, "messages",
     "string"),
    # a coerced value meets the same ranges
    ("/v1/completions", {"prompt": "x", "temperature": "nan"}, "temperature", "finite"),
    ("/v1/completions", {"prompt": "x", "n": "17", "temperature": 1}, "n", "at most"),
])
def test_what_vllm_refuses_is_refused(server, path, body, param, words):
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


def test_custom_roles_reach_the_template(server):
    def prompt(messages: list[dict]) -> list[int]:
        r = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1,
                                                  "return_token_ids": True})
        assert r.status_code == 200, r.text
        return r.json()["prompt_token_ids"]

    def text_of(ids: list[int]) -> str:
        return post(server, "/detokenize", {"tokens": ids}).json()["prompt"]

    narrated = text_of(prompt([{"role": "narrator", "content": "Once upon a time"},
                               {"role": "user", "content": "Go on."}]))
    assert "narrator\nOnce upon a time" in narrated
    as_string = prompt([{"role": "critic", "content": "Be brief."}, *HI])
    as_parts = prompt([{"role": "critic", "content": [{"type": "text", "text": "Be brief."}]},
                       *HI])
    assert as_string == as_parts
    # the response reports a continued message's own role, as vLLM does
    r = post(server, "/v1/chat/completions", {
        "messages": [*HI, {"role": "poet", "content": "Blue"}], "max_tokens": 2,
        "add_generation_prompt": False})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "poet"


@pytest.mark.parametrize("seed", [-(2**63) - 1, 2**63])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_out_of_range_seed_names_the_bound(server, path, seed):
    body = {"prompt": "x"} if path == "/v1/completions" else {"messages": HI}
    r = post(server, path, {**body, "seed": seed})
    assert r.status_code == 400
    err = r.json()["error"]
    kind = "greater_than_equal" if seed < 0 else "less_than_equal"
    assert err["param"] == "seed" and kind in err["message"], err


@pytest.mark.parametrize("prompt", ["", None, []])
def test_empty_prompt_says_what_vllm_says(server, prompt):
    body = {} if prompt is None else {"prompt": prompt}
    r = post(server, "/v1/completions", body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "prompt"
    assert err["message"] == "Either prompt or prompt_embeds must be provided and non-empty."
