"""`python -m server` with the real default model, through the openai SDK (sync and async).

One server for the module. Greedy outputs are checked against the offline engine
(actors.LLM) on the same token ids, so "right text" means the same text the engine makes
without the server in between.
"""

from __future__ import annotations

import httpx
import orjson
import pytest

from server_helpers import ServerProcess, offline_greedy, sse_data

pytestmark = pytest.mark.slow

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--trust-request-chat-template").wait_ready()
    yield srv.url
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    with OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def model(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["SmolLM2-135M-Instruct"]
    return models[0].id


def tokenize(server: str, text: str) -> list[int]:
    r = httpx.post(server + "/tokenize", json={"prompt": text, "add_special_tokens": False})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_greedy_matches_offline_engine(server, client, model):
    ids = tokenize(server, "The capital of France is")
    want_ids, want_text = offline_greedy(ids, 8)
    r = client.completions.create(model=model, prompt=ids, max_tokens=8, temperature=0)
    assert r.choices[0].text == want_text and want_text
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == len(want_ids)
    # The same through a stream, in pieces.
    stream = client.completions.create(model=model, prompt=ids, max_tokens=8, temperature=0,
                                       stream=True)
    pieces = [c.choices[0].text for c in stream if c.choices]
    assert "".join(pieces) == want_text and len([p for p in pieces if p]) > 1


def test_stream_n_logprobs_usage(client, model):
    stream = client.completions.create(model=model, prompt="Once upon a time", max_tokens=6,
                                       n=2, temperature=0.8, seed=1, logprobs=2, stream=True,
                                       extra_body={"ignore_eos": True}, stream_options={"include_usage": True})
    finishes, usage, tokens = {}, None, {0: 0, 1: 0}
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            assert c.index not in finishes, "text after the finish_reason"
            tokens[c.index] += len(c.logprobs.tokens)
            # The sampled token and the 2 most likely: 3 entries at most, the sampled first.
            for tok, top in zip(c.logprobs.tokens, c.logprobs.top_logprobs):
                assert 2 <= len(top) <= 3 and next(iter(top)) == tok
            assert all(lp <= 0 for lp in c.logprobs.token_logprobs)
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert finishes == {0: "length", 1: "length"} and tokens == {0: 6, 1: 6}
    assert usage.completion_tokens == 12 and usage.prompt_tokens > 0


def test_seed_repeats_and_differs(client, model):
    def text(seed: int) -> str:
        return client.completions.create(model=model, prompt="My favourite animal is",
                                         max_tokens=10, temperature=1.0, seed=seed,
                                         extra_body={"ignore_eos": True}).choices[0].text

    a, b = text(7), text(7)
    assert a == b and a
    assert len({a, text(8), text(9)}) > 1


def test_n_choices_stop_per_choice(client, model):
    r = client.completions.create(model=model, prompt="List three colours:", max_tokens=24,
                                  n=3, temperature=1.0, seed=3, stop=[" "],
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    for c in r.choices:
        assert " " not in c.text
        assert c.finish_reason == "stop"
    # include_stop_str_in_output keeps the stop string at the end of each choice.
    r = client.completions.create(model=model, prompt="List three colours:", max_tokens=24,
                                  n=3, temperature=1.0, seed=3, stop=[" "],
                                  extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    for c in r.choices:
        assert c.text.endswith(" ") and " " not in c.text[:-1] and c.finish_reason == "stop"


def test_stop_string_across_tokens_streamed(client, model):
    prompt = "1, 2, 3, 4,"
    full = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = full.strip()[2:6]  # spans tokens ("5, 6" -> "6, 7"...)
    assert len(stop) == 4
    cut = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0,
                                    stop=[stop], extra_body={"ignore_eos": True}).choices[0]
    assert cut.finish_reason == "stop" and full.startswith(cut.text) and stop not in cut.text
    assert full[len(cut.text):].startswith(stop)
    chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=12,
                                            temperature=0, stop=[stop], extra_body={"ignore_eos": True},
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == cut.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_token_id_prompts_and_echo(server, client, model):
    ids = tokenize(server, "Hello there")
    r = client.completions.create(model=model, prompt=[ids, ids + ids[:1]], max_tokens=4,
                                  temperature=0, echo=True, logprobs=1)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].text.startswith("Hello there") and len(r.choices[0].text) > 11
    assert r.usage.prompt_tokens == 2 * len(ids) + 1
    # echo + logprobs: each choice's own prompt scored first (first token unscored), then
    # its 4 generated tokens, offsets from the start of the echoed prompt.
    for c, prompt in zip(r.choices, [ids, ids + ids[:1]]):
        lp = c.logprobs
        assert len(lp.tokens) == len(prompt) + 4 == len(lp.token_logprobs)
        assert lp.token_logprobs[0] is None and lp.text_offset[0] == 0
        assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    # Two text prompts, streamed with echo: the prompt comes first in each choice.
    texts = {0: "", 1: ""}
    for chunk in client.completions.create(model=model, prompt=["Hi", "Bye"], max_tokens=3,
                                           temperature=0, echo=True, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts[0].startswith("Hi") and texts[1].startswith("Bye")


def test_chat_sync_and_stream(client, model):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Say hi"}]}]
    r = client.chat.completions.create(model=model, max_tokens=8, temperature=0,
                                       messages=messages, logprobs=True, top_logprobs=2)
    msg = r.choices[0].message
    assert msg.role == "assistant" and msg.content
    assert len(r.choices[0].logprobs.content) == r.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 for t in r.choices[0].logprobs.content)
    chunks = list(client.chat.completions.create(
        model=model, max_tokens=8, temperature=0, stream=True, messages=messages,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices].count(None) == \
        len([c for c in chunks if c.choices]) - 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == msg.content
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_chat_templates(server, client, model):
    messages = [{"role": "user", "content": "Name a fruit."}]
    # The model's own template (ChatML for SmolLM2), rendered by /tokenize.
    r = httpx.post(server + "/tokenize", json={"messages": messages,
                                              "add_generation_prompt": True})
    text = httpx.post(server + "/detokenize", json={"tokens": r.json()["tokens"]}).json()
    assert "<|im_start|>user\nName a fruit.<|im_end|>" in text["prompt"]
    assert text["prompt"].endswith("<|im_start|>assistant\n")
    # A request template (allowed by --trust-request-chat-template).
    r = httpx.post(server + "/tokenize", json={"messages": messages, "chat_template": TEMPLATE,
                                              "add_generation_prompt": True})
    text = httpx.post(server + "/detokenize", json={"tokens": r.json()["tokens"]}).json()
    assert text["prompt"] == "<user>Name a fruit.\n<assistant>"
    out = client.chat.completions.create(model=model, messages=messages, max_tokens=4,
                                         temperature=0, extra_body={"chat_template": TEMPLATE})
    assert out.usage.prompt_tokens == len(r.json()["tokens"])
    # continue_final_message: the assistant's partial answer is continued, not closed.
    out = client.chat.completions.create(
        model=model, max_tokens=6, temperature=0,
        messages=messages + [{"role": "assistant", "content": "My answer is"}],
        extra_body={"continue_final_message": True, "add_generation_prompt": False,
                    "echo": True})
    assert out.choices[0].message.content.startswith("My answer is")
    assert len(out.choices[0].message.content) > len("My answer is")


def test_async_64_streams(server, model):
    """64 concurrent streams through AsyncOpenAI, on asyncio (the SDK's usual loop; under
    Trio its unexhausted httpx generators are finalized with ResourceWarnings)."""
    import asyncio

    from openai import AsyncOpenAI

    counts, texts, errors = [], [], []

    async def one(client, i):
        try:
            stream = await client.completions.create(
                model=model, prompt=f"Count to {i}:", max_tokens=8, stream=True,
                temperature=0.7, seed=i, extra_body={"ignore_eos": True},
                stream_options={"include_usage": True})
            text, finishes = "", []
            async with stream:
                async for chunk in stream:
                    if chunk.usage:
                        counts.append(chunk.usage.completion_tokens)
                    for c in chunk.choices:
                        text += c.text
                        if c.finish_reason:
                            finishes.append(c.finish_reason)
            assert finishes == ["length"]
            texts.append(text)
        except Exception as exc:  # collected: one failure must not hide the others
            errors.append(repr(exc))

    async def main():
        async with AsyncOpenAI(base_url=server + "/v1", api_key="unused", max_retries=0,
                               timeout=120) as client:
            await asyncio.gather(*(one(client, i) for i in range(64)))

    asyncio.run(main())
    assert errors == [] and counts == [8] * 64 and len(texts) == 64


def test_raw_http_shapes(server):
    r = httpx.post(server + "/v1/completions",
                   json={"prompt": "Hi", "max_tokens": 3, "stream": True, "ignore_eos": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    data = sse_data(r.text.splitlines())
    assert data[-1] == "[DONE]"
    chunks = [orjson.loads(d) for d in data[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert httpx.get(server + "/version").json()["version"]
    assert httpx.get(server + "/openapi.json").json()["paths"]["/v1/completions"]


def test_stop_prefix_held_back_is_flushed_at_length(client, model):
    """Text held back because it might begin a stop string is sent when the sequence ends
    for another reason (length): nothing is lost, streamed or not."""
    kw = dict(model=model, prompt="1, 2, 3, 4,", max_tokens=10, temperature=0,
              extra_body={"ignore_eos": True})
    full = client.completions.create(**kw).choices[0].text
    stop = full[-3:] + "@#%"  # its prefix is the end of the output; it never matches
    r = client.completions.create(stop=[stop], **kw).choices[0]
    assert (r.text, r.finish_reason) == (full, "length")
    chunks = [c.choices[0] for c in client.completions.create(stop=[stop], stream=True, **kw)
              if c.choices]
    assert "".join(c.text for c in chunks) == full and chunks[-1].finish_reason == "length"


def test_stop_on_first_token_with_logprobs(client, model):
    kw = dict(model=model, prompt="1, 2, 3,", max_tokens=5, temperature=0, logprobs=2)
    first = client.completions.create(**dict(kw, max_tokens=1)).choices[0].text
    assert first
    r = client.completions.create(stop=[first], **kw).choices[0]
    assert (r.text, r.finish_reason, r.stop_reason) == ("", "stop", first)
    assert len(r.logprobs.tokens) == len(r.logprobs.token_logprobs) == len(
        r.logprobs.text_offset)
    chunks = [c.choices[0] for c in client.completions.create(stop=[first], stream=True, **kw)
              if c.choices]
    assert "".join(c.text for c in chunks) == "" and chunks[-1].finish_reason == "stop"
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hi"}], max_tokens=4,
        temperature=0, logprobs=True, top_logprobs=2)
    word = out.choices[0].message.content[:2]
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hi"}], max_tokens=4,
        temperature=0, logprobs=True, top_logprobs=2, stop=[word])
    assert out.choices[0].finish_reason == "stop" and word not in out.choices[0].message.content


def test_multibyte_characters_stream_whole(server, client, model):
    """Emoji span several byte-level tokens: a stream never shows half a character, and a
    prompt that ends inside one does not make the stream repeat the prompt."""
    ids = tokenize(server, "I love emoji: " + "\N{SLIGHTLY SMILING FACE}" * 6)
    kw = dict(model=model, max_tokens=8, temperature=0)
    whole = client.completions.create(prompt=ids, **kw).choices[0].text
    assert "\N{SLIGHTLY SMILING FACE}" in whole and "\ufffd" not in whole
    pieces = [c.choices[0].text for c in client.completions.create(prompt=ids, stream=True, **kw)
              if c.choices]
    assert "".join(pieces) == whole and not any("\ufffd" in p for p in pieces)
    # The last emoji's first token only: the prompt ends inside a character.
    cut = ids[:-1]
    whole = client.completions.create(prompt=cut, **kw).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        prompt=cut, stream=True, **kw) if c.choices)
    assert streamed == whole and "emoji" not in whole


def test_request_template_sandbox(client, model):
    """Request templates run sandboxed: no Python internals, and the failure is a 400 that
    does not echo internals either."""
    import openai

    for template in ("{{ ''.__class__.__mro__[1].__subclasses__() }}",
                     "{{ messages.__class__.__init__.__globals__ }}",
                     "{{ cycler.__init__.__globals__.os.popen('id').read() }}"):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                extra_body={"chat_template": template})
        err = info.value.body
        assert err["code"] == 400 and "Traceback" not in err["message"], err
        assert "uid=" not in err["message"] and "object at 0x" not in err["message"]


def test_request_template_bounded(client, model):
    """A trusted request template still cannot wedge or exhaust the server: rendering is
    bounded in time and output, and huge strings or numbers are refused before they are
    built (each case below runs for minutes or allocates gigabytes when unbounded)."""
    import time

    import openai

    def render_fails(template: str) -> float:
        started = time.monotonic()
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                extra_body={"chat_template": template}, timeout=30)
        assert info.value.body["code"] == 400
        return time.monotonic() - started

    nested = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    assert render_fails(nested) < 15
    for template in ("{{ 'a' * 1000000000 }}", "{{ [0] * 1000000000 }}", "{{ 9 ** 999999999 }}",
                     "{% for i in range(100000) %}{{ 'a' * 4000000 }}{% endfor %}",
                     # built, then measured rather than printed: the output cap never sees them
                     "{{ 'a'.center(10000000000)|length }}", "{{ 'a'.ljust(10**10)|length }}",
                     "{{ '{:>10000000000}'.format('a')|length }}",
                     "{{ ('%10000000000s' % 'a')|length }}", "{{ 'a'|center(10**10)|length }}"):
        assert render_fails(template) < 5, template
    # Long digit runs in content are content, not sizes.
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "account 123456789012"}], max_tokens=2,
        extra_body={"chat_template": "{% for m in messages %}{{ m['content'].strip() }}"
                                     "{{ '{:>4}'.format('|') }}{% endfor %}"})
    assert r.usage.prompt_tokens > 3
    r = client.completions.create(model=model, prompt="Hi", max_tokens=2)
    assert r.usage.completion_tokens >= 1


def _stream(server: str, path: str, body: dict) -> list[dict]:
    r = httpx.post(server + path, json=dict(body, stream=True), timeout=60)
    assert r.status_code == 200, r.text
    data = sse_data(r.text.splitlines())
    assert data[-1] == "[DONE]"
    return [orjson.loads(d) for d in data[:-1]]


def test_completion_logprobs_layout(server, client, model):
    """vLLM's legacy layout: top_logprobs holds the sampled token first, then the most likely
    ones, logprobs + 1 entries at most; logprobs=0 still names the sampled token."""
    ids = tokenize(server, "The capital of France is")
    r = client.completions.create(model=model, prompt=ids, max_tokens=4, temperature=0,
                                  logprobs=0)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4 and "".join(lp.tokens) == r.choices[0].text
    assert lp.top_logprobs == [{t: v} for t, v in zip(lp.tokens, lp.token_logprobs)]
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]
    r = client.completions.create(model=model, prompt=ids, max_tokens=6, temperature=1.5,
                                  seed=5, logprobs=2, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    for tok, val, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 2 <= len(top) <= 3 and next(iter(top.items())) == (tok, val)
        assert sorted(list(top.values())[1:], reverse=True) == list(top.values())[1:]


def test_fingerprint_and_response_shapes(server):
    """A system_fingerprint string on every whole response and on the last chunk of a stream
    (the usage chunk when there is one); usage details null; no empty tool_calls."""
    comp = {"prompt": "Hi", "max_tokens": 2, "ignore_eos": True}
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    a = httpx.post(server + "/v1/completions", json=comp).json()
    b = httpx.post(server + "/v1/chat/completions", json=chat).json()
    fp = a["system_fingerprint"]
    assert fp.startswith("llmserve-") and b["system_fingerprint"] == fp
    assert a["usage"]["prompt_tokens_details"] is None and a["service_tier"] is None
    assert a["choices"][0]["prompt_logprobs"] is None
    msg = b["choices"][0]["message"]
    assert msg["role"] == "assistant" and "tool_calls" not in msg
    assert msg["reasoning"] is None and msg["refusal"] is None
    assert b["usage"]["prompt_tokens_details"] is None and b["prompt_logprobs"] is None
    for path, body in (("/v1/completions", comp), ("/v1/chat/completions", chat)):
        chunks = _stream(server, path, body)
        finished = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert [c.get("system_fingerprint") for c in chunks] == \
            [fp if c in finished else None for c in chunks]
        chunks = _stream(server, path, dict(body, stream_options={"include_usage": True}))
        assert chunks[-1]["choices"] == [] and chunks[-1]["system_fingerprint"] == fp
        assert set(chunks[-1]["usage"]) == {"prompt_tokens", "completion_tokens",
                                            "total_tokens"}
        assert all("system_fingerprint" not in c for c in chunks[:-1])
    # An empty stream_options is no error without stream, as in vLLM.
    r = httpx.post(server + "/v1/completions", json=dict(comp, stream_options={}))
    assert r.status_code == 200, r.text


def test_continuous_usage_is_per_choice(server):
    """continuous_usage_stats: each chunk reports its own choice's prompt and tokens so far
    (vLLM's numbers), the chat role chunk included (0 completion tokens)."""
    body = {"prompt": ["Once upon a time", "The sky is"], "max_tokens": 3, "n": 2,
            "temperature": 1, "seed": 3, "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    prompt_lens = [len(tokenize(server, p)) for p in body["prompt"]]
    chunks = _stream(server, "/v1/completions", body)
    seen = [0, 0, 0, 0]
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        i = choice["index"]
        seen[i] += 1  # one token per chunk here: no stop strings, ASCII text
        assert c["usage"] == {"prompt_tokens": prompt_lens[i // 2], "completion_tokens": seen[i],
                              "total_tokens": prompt_lens[i // 2] + seen[i]}
    assert seen == [3, 3, 3, 3]
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    assert chunks[-1]["usage"]["prompt_tokens"] == sum(prompt_lens)  # once per prompt
    chunks = _stream(server, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "n": 2,
        "temperature": 1, "seed": 1, "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    roles = [c for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]]
    assert [c["choices"][0]["index"] for c in roles] == [0, 1]
    prompt = chunks[-1]["usage"]["prompt_tokens"]
    for c in roles:
        assert c["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert c["usage"] == {"prompt_tokens": prompt, "completion_tokens": 0,
                              "total_tokens": prompt}
    assert all(c["usage"]["completion_tokens"] <= 2 for c in chunks[:-1])


def test_echo_without_generation(server, client, model):
    """vLLM: echo with max_tokens=0 returns the prompt alone (streamed or not)."""
    r = client.completions.create(model=model, prompt="Hello there", max_tokens=0, echo=True)
    assert r.choices[0].text == "Hello there" and r.choices[0].finish_reason == "length"
    chunks = _stream(server, "/v1/completions", {"prompt": "Hello there", "max_tokens": 0,
                                                 "echo": True})
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hello there"
    # Streamed echo: the prompt leads the first chunk of each choice, not a chunk of its own.
    chunks = _stream(server, "/v1/completions", {"prompt": "Hello there", "max_tokens": 3,
                                                 "echo": True, "ignore_eos": True})
    first = chunks[0]["choices"][0]["text"]
    assert first.startswith("Hello there") and len(first) > len("Hello there")


def test_truncate_prompt_tokens(server, client, model):
    ids = tokenize(server, "One two three four five six seven eight nine ten")
    _, want_text = offline_greedy(ids[-4:], 5)
    r = client.completions.create(model=model, prompt=ids, max_tokens=5, temperature=0,
                                  extra_body={"truncate_prompt_tokens": 4})
    assert r.usage.prompt_tokens == 4 and r.choices[0].text == want_text
    r = client.completions.create(model=model, prompt=ids, max_tokens=5, temperature=0,
                                  extra_body={"truncate_prompt_tokens": 4,
                                              "truncation_side": "right"})
    assert r.usage.prompt_tokens == 4 and r.choices[0].text == offline_greedy(ids[:4], 5)[1]
    # -1: as much as the context holds, one position left to generate.
    long = ids * 120
    r = client.completions.create(model=model, prompt=long, max_tokens=5,
                                  extra_body={"truncate_prompt_tokens": -1})
    assert r.usage.prompt_tokens == 1023 and r.usage.completion_tokens == 1
    # Chat prompts are truncated after the template.
    out = client.chat.completions.create(model=model, messages=[{"role": "user",
                                                                 "content": "hi " * 2000}],
                                         max_tokens=2, extra_body={"truncate_prompt_tokens": 100})
    assert out.usage.prompt_tokens == 100


def test_allowed_token_ids(server, client, model):
    (x,) = tokenize(server, " banana")[:1]
    r = client.completions.create(model=model, prompt="I like", max_tokens=3, temperature=1,
                                  seed=0, logprobs=0, extra_body={"allowed_token_ids": [x],
                                                                  "ignore_eos": True})
    assert r.choices[0].logprobs.tokens == [httpx.post(server + "/detokenize", json={
        "tokens": [x]}).json()["prompt"]] * 3


def test_chat_role_without_generation_prompt(server):
    """vLLM: without a generation prompt the model continues the last message, and the
    response (and its echo) carries that message's role."""
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Tell me"},
                                                      {"type": "text", "text": "a story"}]}],
            "add_generation_prompt": False, "echo": True, "max_tokens": 3, "ignore_eos": True}
    r = httpx.post(server + "/v1/chat/completions", json=body).json()
    msg = r["choices"][0]["message"]
    assert msg["role"] == "user" and msg["content"].startswith("Tell me\na story")
    # As vLLM: echo scores the prompt (top_logprobs alternatives, 0 here).
    pl = r["prompt_logprobs"]
    assert len(pl) == r["usage"]["prompt_tokens"] and pl[0] is None
    assert all(len(e) == 1 for e in pl[1:])
    chunks = _stream(server, "/v1/chat/completions", body)
    assert chunks[0]["choices"][0]["delta"] == {"role": "user", "content": ""}
    assert chunks[1]["choices"][0]["delta"] == {"content": "Tell me\na story"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text.startswith("Tell me\na story")


def test_streamed_logprobs_cover_every_token(server):
    """A token whose text is held back (half a character, a possible stop string) still
    sends its chunk, with empty text and its logprobs, as vLLM does: streamed logprobs
    cover every generated token."""
    ids = tokenize(server, "I love emoji: " + "\N{SLIGHTLY SMILING FACE}" * 6)
    for path, body, count in (
            ("/v1/completions", {"prompt": ids, "logprobs": 0},
             lambda c: len(c["logprobs"]["tokens"])),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Reply with "
                                                    + "\N{SLIGHTLY SMILING FACE}" * 4}],
                                      "logprobs": True},
             lambda c: len((c["logprobs"] or {"content": []})["content"]))):
        chunks = _stream(server, path, dict(body, max_tokens=8, temperature=0,
                                            stream_options={"include_usage": True}))
        total = sum(count(c["choices"][0]) for c in chunks if c["choices"])
        assert total == chunks[-1]["usage"]["completion_tokens"], path
        whole = httpx.post(server + path, json=dict(body, max_tokens=8, temperature=0)).json()
        assert total == whole["usage"]["completion_tokens"], path


def test_echo_logprobs_scores_the_prompt(server, client, model):
    """lm-eval's loglikelihood call: echo, logprobs, max_tokens=0. The prompt comes back with
    its tokens' logprobs (the first null), matching the offline engine's prompt logprobs."""
    from actors import SamplingParams
    from server_helpers import offline_llm

    prompt = "The capital of France is Paris"
    ids = tokenize(server, prompt)
    r = client.completions.create(model=model, prompt=prompt, echo=True, logprobs=2,
                                  max_tokens=0, temperature=0)
    c = r.choices[0]
    assert c.text == prompt and c.finish_reason == "length"
    lp = c.logprobs
    assert "".join(lp.tokens) == prompt and len(lp.tokens) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(ids))]
    ref = offline_llm().generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=2))[0]
    want = [e.logprob for e in ref.prompt_logprobs[1:]]
    assert lp.token_logprobs[1:] == pytest.approx(want, abs=1e-2)
    for tok, top in zip(lp.tokens[1:], lp.top_logprobs[1:]):
        assert tok in top and 2 <= len(top) <= 3  # the prompt token first, then the top 2
        assert next(iter(top)) == tok
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    # Per choice, vLLM's prompt_logprobs field too: token id -> {logprob, rank, decoded_token}.
    pl = c.model_extra["prompt_logprobs"]
    assert pl[0] is None and len(pl) == len(ids)
    for tid, entry, want_lp in zip(ids[1:], pl[1:], want):
        first = next(iter(entry))
        assert first == str(tid) and entry[first]["rank"] >= 1
        assert entry[first]["logprob"] == pytest.approx(want_lp, abs=1e-2)
    assert r.usage.prompt_tokens == len(ids)

    # With generation: the prompt's entries, then the generated token's.
    r = client.completions.create(model=model, prompt=prompt, echo=True, logprobs=1,
                                  max_tokens=2, temperature=0, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 2 and lp.token_logprobs[0] is None
    assert "".join(lp.tokens) == r.choices[0].text


def test_prompt_logprobs_shapes(server, client, model):
    """prompt_logprobs: per choice on completions (each of n choices gets the prompt's),
    top level on chat; the first entry null; k alternatives plus the prompt token."""
    body = {"model": model, "prompt": "One two three four", "max_tokens": 1,
            "prompt_logprobs": 3, "n": 2, "temperature": 1.0, "seed": 1}
    r = httpx.post(server + "/v1/completions", json=body).json()
    pls = [c["prompt_logprobs"] for c in r["choices"]]
    assert pls[0] == pls[1] and pls[0][0] is None
    assert all(c["logprobs"] is None for c in r["choices"])
    for entry in pls[0][1:]:
        ranks = sorted(v["rank"] for v in entry.values())
        assert 3 <= len(entry) <= 4 and ranks[:3] == [1, 2, 3]
        assert all(isinstance(v["decoded_token"], str) and v["logprob"] <= 0
                   for v in entry.values())
    chat = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
            "prompt_logprobs": 1}
    r = httpx.post(server + "/v1/chat/completions", json=chat).json()
    n_prompt = r["usage"]["prompt_tokens"]
    assert len(r["prompt_logprobs"]) == n_prompt and r["prompt_logprobs"][0] is None
    assert "prompt_logprobs" not in r["choices"][0]
    # Refused as vLLM refuses them: a stream with prompt_logprobs > 0, and values below -1.
    for path, extra in (("/v1/completions", {"prompt": "x"}),
                        ("/v1/chat/completions", {"messages": chat["messages"]})):
        for bad in ({"prompt_logprobs": 1, "stream": True}, {"prompt_logprobs": -2}):
            resp = httpx.post(server + path, json={"model": model, **extra, **bad})
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["param"] == "prompt_logprobs"
