"""vLLM's token-id request fields through `python -m server` and the openai SDK, with the
bodies vLLM's own endpoint tests send (tests/entrypoints/openai/test_return_token_ids.py,
test_return_tokens_as_ids.py, chat_completion/test_logprob_token_ids.py, completion/
test_completion.py) and the shapes they assert.

- return_token_ids: prompt_token_ids and token_ids equal to the tokenizer's (chat: the
  rendered prompt's), on each choice, streamed (the prompt's on the first chunk, each
  delta's ids on its chunk) and whole; null (present) when not asked for.
- return_tokens_as_token_ids (per request, and the server's --return-tokens-as-token-ids):
  every logprob token is "token_id:<id>".
- logprob_token_ids: the sampled token and exactly the listed ids at each position, whose
  values equal the same ids' top-k logprobs where both exist.
"""

from __future__ import annotations

import json
import math

import httpx
import pytest

from server_helpers import ServerProcess, default_tokenizer, sse_data

pytestmark = pytest.mark.slow

CHAT = [{"role": "system", "content": "You like to use emojis in your responses."},
        {"role": "user", "content": "Repeat after me: I love cats 🐱"}]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--return-tokens-as-token-ids").wait_ready()
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    with OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def stream(server, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", server.url + path, json={**body, "stream": True},
                      timeout=120) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(d) for d in sse_data(r.iter_lines()) if d != "[DONE]"]


def ids_of(tokens: list[str]) -> list[int]:
    assert all(t.startswith("token_id:") for t in tokens), tokens
    return [int(t.removeprefix("token_id:")) for t in tokens]


# -- return_token_ids ---------------------------------------------------------------------
@pytest.mark.parametrize("asked", [True, False, None])
def test_completion_token_ids(client, asked):
    prompt = "Complete this sentence with emojis: I love coding 🚀"
    extra = None if asked is None else {"return_token_ids": asked}
    out = client.completions.create(model=None, prompt=prompt, max_tokens=10,
                                    temperature=0, logprobs=1, extra_body=extra)
    choice = out.model_dump()["choices"][0]
    assert "prompt_token_ids" in choice and "token_ids" in choice
    if not asked:
        assert choice["prompt_token_ids"] is None and choice["token_ids"] is None
        return
    tok = default_tokenizer()
    assert choice["prompt_token_ids"] == tok.encode(prompt)
    assert len(choice["token_ids"]) == out.usage.completion_tokens > 0
    assert tok.decode(choice["token_ids"]).startswith(choice["text"])


def test_completion_stream_token_ids_align_with_logprobs(client):
    """vLLM's: the first chunk carries the prompt's ids, every chunk its delta's ids, and
    those are the logprobs' tokens ("token_id:<id>") in order."""
    prompt = "Tell me a short fact about Python:"
    chunks = list(client.completions.create(
        model=None, prompt=prompt, max_tokens=30, temperature=0, stream=True, logprobs=1,
        extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True}))
    first = chunks[0].choices[0]
    assert first.prompt_token_ids == default_tokenizer().encode(prompt)
    assert all(c.choices[0].prompt_token_ids is None for c in chunks[1:])
    streamed = [t for c in chunks for t in c.choices[0].token_ids]
    from_logprobs = [t for c in chunks if c.choices[0].logprobs
                     for t in ids_of(c.choices[0].logprobs.tokens)]
    assert streamed == from_logprobs and len(streamed) == 30
    whole = client.completions.create(model=None, prompt=prompt, max_tokens=30, temperature=0,
                                      extra_body={"return_token_ids": True})
    assert whole.choices[0].token_ids == streamed


def test_completion_echo_with_token_ids(client):
    """vLLM's: with echo and return_token_ids the prompt is in prompt_token_ids, not in
    the text; the logprobs still cover prompt and output."""
    out = client.completions.create(
        model=None, prompt="Hello, world! How are you today?", max_tokens=20, temperature=0,
        echo=True, logprobs=1, extra_body={"return_token_ids": True,
                                          "return_tokens_as_token_ids": True,
                                          "prompt_logprobs": 1})
    c = out.choices[0]
    lp_ids = ids_of(c.logprobs.tokens)
    assert lp_ids == c.prompt_token_ids + c.token_ids
    assert c.prompt_logprobs is not None
    assert default_tokenizer().decode(c.token_ids, skip_special_tokens=True) == c.text


def test_chat_token_ids_whole_and_streamed(server, client):
    tok = default_tokenizer()
    out = client.chat.completions.create(model=None, messages=CHAT, max_tokens=50,
                                         temperature=0, logprobs=True,
                                         extra_body={"return_token_ids": True})
    body = out.model_dump()
    rendered = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert body["prompt_token_ids"] == tok.encode(rendered, add_special_tokens=False)
    ids = body["choices"][0]["token_ids"]
    assert len(ids) == out.usage.completion_tokens
    assert tok.decode(ids, skip_special_tokens=True) == out.choices[0].message.content

    chunks = stream(server, "/v1/chat/completions", {
        "messages": CHAT, "max_tokens": 50, "temperature": 0, "return_token_ids": True})
    assert chunks[0]["prompt_token_ids"] == body["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    streamed = [t for c in chunks[1:] for t in c["choices"][0]["token_ids"]]
    assert streamed == ids

    without = client.chat.completions.create(model=None, messages=CHAT, max_tokens=5,
                                             temperature=0,
                                             extra_body={"return_token_ids": False})
    assert without.choices[0].token_ids is None and without.prompt_token_ids is None


def test_null_fields_as_vllm_writes_them(server):
    """Which token-id fields are null on each shape when nobody asks (vLLM's serialiser:
    whole responses write every field; chunks the fields vLLM sets)."""
    cmpl = post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2}).json()
    assert list(cmpl["choices"][0]) == [
        "index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids",
        "prompt_logprobs", "prompt_token_ids", "routed_experts", "weight_versions"]
    chunks = stream(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    for c in chunks:
        assert list(c["choices"][0]) == [
            "index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids",
            "token_ids", "weight_versions"]
        assert c["choices"][0]["token_ids"] is None
    chat = post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}).json()
    assert list(chat["choices"][0]) == [
        "index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids",
        "routed_experts", "weight_versions"]
    assert chat["prompt_token_ids"] is None
    chunks = stream(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2})
    assert chunks[0]["prompt_token_ids"] is None and "token_ids" not in chunks[0]["choices"][0]
    assert [list(c["choices"][0]) for c in chunks[1:]][-1] == [
        "index", "delta", "logprobs", "finish_reason", "stop_reason", "token_ids",
        "weight_versions"]
    assert all(c["choices"][0]["token_ids"] is None for c in chunks[1:])


# -- return_tokens_as_token_ids -------------------------------------------------------------
def test_tokens_as_ids_by_server_flag_and_request(client):
    """The server runs with --return-tokens-as-token-ids; a request's false wins."""
    tok = default_tokenizer()
    out = client.chat.completions.create(model=None, messages=CHAT, max_tokens=8,
                                         temperature=0, logprobs=True, top_logprobs=2)
    content = out.choices[0].logprobs.content
    sampled = ids_of([e.token for e in content])
    assert tok.decode(sampled, skip_special_tokens=True) == out.choices[0].message.content
    for e in content:
        assert all(t.token.startswith("token_id:") for t in e.top_logprobs)
    plain = client.chat.completions.create(
        model=None, messages=CHAT, max_tokens=8, temperature=0, logprobs=True,
        extra_body={"return_tokens_as_token_ids": False})
    # the texts (an emoji's bytes split over tokens show as U+FFFD: why the ids help)
    texts = [e.token for e in plain.choices[0].logprobs.content]
    assert "".join(texts).startswith("I love cats ") and "\ufffd" in "".join(texts)
    assert not any(t.startswith("token_id:") for t in texts)
    cmpl = client.completions.create(model=None, prompt="Hi there", max_tokens=5,
                                     temperature=0, logprobs=2)
    lp = cmpl.choices[0].logprobs
    ids_of(lp.tokens)
    # text offsets count the "token_id:<id>" strings, as vLLM counts them
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(lp.tokens))]


# -- logprob_token_ids ----------------------------------------------------------------------
@pytest.mark.parametrize(("requested", "top", "sampled"), [
    ([5000], 5, 42), ([100, 1000, 5000], 3, 42), ([100, 1000, 5000], 3, 5000)])
def test_chat_logprob_token_ids(client, requested, top, sampled):
    out = client.chat.completions.create(
        model=None, messages=[{"role": "user", "content": "Hello"}], max_tokens=1,
        temperature=0, logprobs=True, top_logprobs=top,
        extra_body={"logprob_token_ids": requested, "allowed_token_ids": [sampled],
                    "return_tokens_as_token_ids": True})
    entry = out.choices[0].logprobs.content[0]
    assert ids_of([entry.token]) == [sampled]
    returned = ids_of([e.token for e in entry.top_logprobs])
    assert returned[0] == sampled and set(returned) == {*requested, sampled}
    assert len(returned) == len(set(returned))
    assert all(not math.isinf(e.logprob) and not math.isnan(e.logprob)
               for e in entry.top_logprobs)


def test_listed_logprobs_equal_top_k_logprobs(server):
    """At each position, a listed id's logprob equals its top-k logprob where both exist."""
    body = {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0,
            "logprobs": 20, "return_tokens_as_token_ids": True}
    top = post(server, "/v1/completions", body).json()["choices"][0]["logprobs"]
    listed_ids = sorted({i for pos in top["top_logprobs"] for i in ids_of(list(pos))[:4]})
    listed_ids.append(7)  # most likely in no position's top 20
    listed = post(server, "/v1/completions", {**body, "logprob_token_ids": listed_ids}).json()
    lp = listed["choices"][0]["logprobs"]
    assert lp["tokens"] == top["tokens"]  # the same greedy draws
    both = 0
    for want, got in zip(top["top_logprobs"], lp["top_logprobs"], strict=True):
        assert set(got) == {f"token_id:{i}" for i in listed_ids} | {next(iter(got))}
        for name, value in got.items():
            if name in want:
                assert value == want[name], name
                both += 1
    assert both >= 6
    streamed = stream(server, "/v1/completions", {**body, "logprob_token_ids": listed_ids})
    assert [p for c in streamed if c["choices"][0]["logprobs"]
            for p in c["choices"][0]["logprobs"]["top_logprobs"]] == lp["top_logprobs"]


def test_completion_logprob_token_ids_shapes(client):
    out = client.completions.create(model=None, prompt="Hello", max_tokens=1, temperature=0,
                                    logprobs=5, extra_body={"logprob_token_ids": [5000],
                                                            "allowed_token_ids": [42],
                                                            "return_tokens_as_token_ids": True})
    lp = out.choices[0].logprobs
    assert lp.tokens == ["token_id:42"]
    assert set(lp.top_logprobs[0]) == {"token_id:42", "token_id:5000"}
    chunks = list(client.completions.create(
        model=None, prompt="Hello", max_tokens=1, temperature=0, logprobs=5, stream=True,
        extra_body={"logprob_token_ids": [5000], "allowed_token_ids": [42],
                    "return_tokens_as_token_ids": True}))
    tops = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.top_logprobs]
    assert len(tops) == 1 and set(tops[0]) == {"token_id:42", "token_id:5000"}


@pytest.mark.parametrize(("path", "body", "words"), [
    ("/v1/completions", {"prompt": "x", "logprob_token_ids": [5]},
     "when using `logprob_token_ids`, `logprobs` must be set."),
    ("/v1/completions", {"prompt": "x", "logprobs": 1, "logprob_token_ids": [5], "echo": True,
                         "max_tokens": 0}, "no output tokens are generated"),
    ("/v1/completions", {"prompt": "x", "logprobs": 1, "logprob_token_ids": [1, 49152]},
     "token_id(s) [49152] in logprob_token_ids contain out-of-vocab token ids"),
    ("/v1/completions", {"prompt": "x", "logprobs": 1, "logprob_token_ids": [-1]},
     "token_id(s) [-1] in logprob_token_ids"),
    ("/v1/completions", {"prompt": "x", "logprobs": 1, "logprob_token_ids": list(range(129))},
     "Requested logprob_token_ids of length 129, which is greater than max allowed: 128"),
    ("/v1/chat/completions", {"messages": CHAT, "logprob_token_ids": [5]},
     "when using `logprob_token_ids`, `logprobs` must be set to true."),
])
def test_logprob_token_ids_refusals(server, path, body, words):
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "logprob_token_ids" and words in err["message"], err
