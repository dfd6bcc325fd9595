"""vLLM 0.34's smaller request fields and flags on a real `python -m server`, through the
openai SDK (extra_body) where it has the route: --enable-per-request-metrics (`metrics`),
--stream-interval and `stream_interval`, `repetition_detection`, `truncation_side` (chat and
pooling; completions' is in test_server_e2e.py) and the render routes' `return_token_offsets`.

Each is held to what it documents: the metrics are positive and add up, a stream's chunks
hold at least the interval's tokens and join into the whole response's text, a detected
repetition ends the output the model otherwise repeats to max_tokens, and a truncated prompt
answers what its kept tokens sent alone answer.
"""

from __future__ import annotations

import math
import time

import httpx
import numpy as np
import openai
import pytest
from openai import OpenAI

from server_helpers import ServerProcess

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
SERVER_INTERVAL = 2  # --stream-interval
METRIC_FIELDS = ("time_to_first_token_ms", "generation_time_ms", "queue_time_ms",
                 "mean_itl_ms", "tokens_per_second")
REPEATING = "1 2 3 1 2 3 1 2 3"  # the model continues it with " 1 2 3" to max_tokens
RULE = {"max_pattern_size": 8, "min_count": 3}
LONG_CHAT = [{"role": "user", "content": "Here is a story about a lighthouse keeper and "
              "his dog, who lived on a small island far out at sea. " * 6
              + "What was the dog's name?"}]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--enable-per-request-metrics", "--enable-scale-out",
                        "--stream-interval", str(SERVER_INTERVAL),
                        "--pooler-config", '{"pooling_type": "MEAN"}').wait_ready()
    yield srv.url
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def client(server):
    with OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def post(server: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(server + path, json=body, timeout=300)


# -- --enable-per-request-metrics ------------------------------------------------------------
def check_metrics(m: dict, generated: int, wall_ms: float) -> None:
    ttft, gen, queue = m["time_to_first_token_ms"], m["generation_time_ms"], m["queue_time_ms"]
    assert ttft > 0 and gen > 0 and queue > 0, m
    assert queue + ttft + gen <= wall_ms  # the server's spans lie inside the client's wait
    assert math.isclose(m["mean_itl_ms"] * (generated - 1), gen, rel_tol=1e-9), m
    # throughput over scheduling to the last token, which is TTFT + generation time
    assert math.isclose(m["tokens_per_second"], generated / (ttft + gen) * 1000,
                        rel_tol=1e-9), m


def test_metrics_on_whole_responses(client):
    start = time.monotonic()
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12,
                                  temperature=0, extra_body={"ignore_eos": True})
    wall = (time.monotonic() - start) * 1000
    m = r.model_extra["metrics"]
    assert list(m) == [*METRIC_FIELDS, "speculative_decoding"]
    check_metrics(m, r.usage.completion_tokens, wall)
    start = time.monotonic()
    c = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=10, temperature=0)
    check_metrics(c.model_extra["metrics"], c.usage.completion_tokens,
                  (time.monotonic() - start) * 1000)
    one = client.completions.create(model=MODEL, prompt="Hi", max_tokens=1).model_extra["metrics"]
    assert one["mean_itl_ms"] is None and one["generation_time_ms"] == 0.0
    assert math.isclose(one["tokens_per_second"], 1000 / one["time_to_first_token_ms"])


def test_metrics_are_null_for_several_choices_or_prompts(client):
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, n=2, temperature=1)
    assert r.model_extra["metrics"] is None
    r = client.completions.create(model=MODEL, prompt=["Hi", "Yo"], max_tokens=3)
    assert r.model_extra["metrics"] is None
    c = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       max_tokens=3, n=2, temperature=1)
    assert c.model_extra["metrics"] is None


def test_metrics_ride_on_the_usage_chunk_only(client):
    start = time.monotonic()
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me a joke"}], max_tokens=10,
        temperature=0, stream=True, stream_options={"include_usage": True}))
    wall = (time.monotonic() - start) * 1000
    *deltas, last = chunks
    assert all("metrics" not in c.model_extra for c in deltas)
    assert last.choices == [] and last.usage is not None
    m = last.model_extra["metrics"]
    assert list(m) == list(METRIC_FIELDS)  # a stream leaves nulls out, as vLLM's chunks
    check_metrics(m, last.usage.completion_tokens, wall)
    # without the usage chunk there are none, and n > 1 has none
    plain = list(client.completions.create(model=MODEL, prompt="Hi", max_tokens=4,
                                           stream=True))
    assert all("metrics" not in c.model_extra for c in plain)
    two = list(client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, n=2,
                                         temperature=1, stream=True,
                                         stream_options={"include_usage": True}))
    assert two[-1].usage is not None and "metrics" not in two[-1].model_extra


def test_metrics_on_responses(client):
    start = time.monotonic()
    r = client.responses.create(model=MODEL, input="Hi", max_output_tokens=6, store=False)
    check_metrics(r.model_extra["metrics"], r.usage.output_tokens,
                  (time.monotonic() - start) * 1000)
    events = list(client.responses.create(model=MODEL, input="Hi", max_output_tokens=6,
                                          store=False, stream=True))
    assert events[-1].type == "response.incomplete"  # cut at max_output_tokens
    assert events[-1].response.model_extra["metrics"]["time_to_first_token_ms"] > 0
    assert all("metrics" not in e.response.model_extra for e in events[:2])  # the opening


# -- stream_interval ---------------------------------------------------------------------------
def chunk_tokens(client, interval: int | None, n: int = 25) -> tuple[list[int], str, str]:
    """(tokens per content chunk, the streamed text, the same request's whole text)."""
    body = {"ignore_eos": True} | ({} if interval is None else {"stream_interval": interval})
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Count to fifty"}],
                  max_tokens=n, temperature=0, logprobs=True, extra_body=body)
    sizes, text = [], ""
    for c in client.chat.completions.create(stream=True, **kwargs):
        if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content:
            sizes.append(len(c.choices[0].logprobs.content))
            text += c.choices[0].delta.content or ""
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    assert sum(sizes) == n
    return sizes, text, whole


@pytest.mark.parametrize(("asked", "interval"), [(None, SERVER_INTERVAL),
                                                 (1, SERVER_INTERVAL),  # raised to the flag's
                                                 (5, 5)])
def test_stream_interval_gathers_tokens(client, asked, interval):
    sizes, text, whole = chunk_tokens(client, asked)
    assert text == whole
    # the first chunk at once, then at least `interval` tokens each, the last as it ends
    assert all(s >= interval for s in sizes[1:-1]), sizes
    assert len(sizes) <= 2 + (25 - 1) // interval, sizes
    if asked == 5:
        assert len(sizes) < len(chunk_tokens(client, None)[0])


def test_stream_interval_is_checked_and_ignored_without_a_stream(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=2,
                                  extra_body={"stream_interval": 0})
    assert err.value.body["param"] == "stream_interval"
    assert err.value.body["message"] == "stream_interval must be at least 1, got 0."
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2,
                                  extra_body={"stream_interval": 7})
    assert r.usage.completion_tokens == 2


# -- repetition_detection ----------------------------------------------------------------------
def test_repetition_detection_ends_a_repeating_output(client):
    free = client.completions.create(model=MODEL, prompt=REPEATING, max_tokens=40,
                                     temperature=0)
    assert free.choices[0].finish_reason == "length"
    assert free.choices[0].text.startswith(" 1 2 3 1 2 3 1 2 3")
    r = client.completions.create(model=MODEL, prompt=REPEATING, max_tokens=40, temperature=0,
                                  extra_body={"repetition_detection": RULE})
    choice = r.choices[0]
    assert choice.finish_reason == "repetition"
    assert choice.model_extra["stop_reason"] == "repetition_detected"
    # " 1 2 3" is six tokens: three of them end it after 18
    assert r.usage.completion_tokens == 18 and choice.text == " 1 2 3" * 3
    assert free.choices[0].text.startswith(choice.text)
    chunks = list(client.completions.create(model=MODEL, prompt=REPEATING, max_tokens=40,
                                            temperature=0, stream=True,
                                            extra_body={"repetition_detection": RULE}))
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == "repetition"
    # min_count 4 needs a fourth " 1 2 3"
    r = client.completions.create(model=MODEL, prompt=REPEATING, max_tokens=40, temperature=0,
                                  extra_body={"repetition_detection": RULE | {"min_count": 4}})
    assert r.usage.completion_tokens == 24


def test_repetition_detection_on_chat(client):
    messages = [{"role": "user", "content": "Write the numbers 1 2 3 1 2 3 1 2 3 1 2 3 and "
                 "keep going"}]
    kwargs = dict(model=MODEL, messages=messages, max_tokens=60, temperature=0)
    free = client.chat.completions.create(**kwargs)
    assert free.choices[0].finish_reason == "length"
    rule = {"repetition_detection": {"max_pattern_size": 12, "min_count": 3}}
    r = client.chat.completions.create(**kwargs, extra_body=rule)
    content = r.choices[0].message.content
    assert r.choices[0].finish_reason == "repetition"
    assert r.choices[0].model_extra["stop_reason"] == "repetition_detected"
    assert content == "1, 2, 3, " * 3 and free.choices[0].message.content.startswith(content)
    chunks = list(client.chat.completions.create(**kwargs, extra_body=rule, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == content
    assert chunks[-1].choices[0].finish_reason == "repetition"


@pytest.mark.parametrize(("rule", "message"), [
    ({"max_pattern_size": 4, "min_count": 1}, "min_count must be >= 2"),
    ({"max_pattern_size": 2, "min_pattern_size": 3, "min_count": 2},
     "with min_pattern_size <= max_pattern_size"),
    ({"max_pattern_size": -1}, "max_pattern_size, min_pattern_size must be >=0"),
])
def test_repetition_detection_bad_values(client, rule, message):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       max_tokens=2, extra_body={"repetition_detection": rule})
    assert err.value.body["param"] == "repetition_detection"
    assert message in err.value.body["message"]


def test_repetition_detection_types(client):
    with pytest.raises(openai.BadRequestError) as err:  # "3" coerces (vLLM's lax mode)
        client.completions.create(model=MODEL, prompt="x", max_tokens=2,
                                  extra_body={"repetition_detection": {"min_count": "three"}})
    assert err.value.body["param"] == "repetition_detection"


# -- truncation_side -------------------------------------------------------------------------
def test_chat_truncation_side(server, client):
    ids = post(server, "/v1/chat/completions/render", {"messages": LONG_CHAT}).json()["token_ids"]
    keep = 40
    assert len(ids) > 3 * keep
    answers = {}
    for side, kept in (("left", ids[-keep:]), ("right", ids[:keep]), (None, ids[-keep:])):
        body = {"truncate_prompt_tokens": keep} | ({} if side is None else
                                                    {"truncation_side": side})
        r = client.chat.completions.create(model=MODEL, messages=LONG_CHAT, max_tokens=8,
                                           temperature=0, extra_body=body)
        alone = client.completions.create(model=MODEL, prompt=kept, max_tokens=8,
                                          temperature=0)
        assert r.usage.prompt_tokens == keep == alone.usage.prompt_tokens
        assert r.choices[0].message.content == alone.choices[0].text
        answers[side] = r.choices[0].message.content
    assert answers["left"] == answers[None] != answers["right"]  # generation keeps the end


def test_embeddings_truncation_side(server):
    text = "The lighthouse keeper walked his dog along the shore. " * 4
    ids = post(server, "/tokenize", {"prompt": text}).json()["tokens"]
    vectors = {}
    for side, kept in (("left", ids[-10:]), ("right", ids[:10]), (None, ids[:10])):
        body = {"input": text, "truncate_prompt_tokens": 10} | (
            {} if side is None else {"truncation_side": side})
        cut = post(server, "/v1/embeddings", body)
        assert cut.status_code == 200, cut.text
        assert cut.json()["usage"]["prompt_tokens"] == 10
        alone = post(server, "/v1/embeddings", {"input": kept}).json()["data"][0]["embedding"]
        vectors[side] = np.asarray(cut.json()["data"][0]["embedding"])
        np.testing.assert_allclose(vectors[side], alone, atol=1e-6)
    assert not np.allclose(vectors["left"], vectors["right"], atol=1e-3)  # pooling: the start


# -- return_token_offsets (the render routes) ------------------------------------------------
def test_render_token_offsets(server):
    text = "The quick brown fox jumps over the lazy dog."
    out = post(server, "/v1/completions/render",
               {"prompt": text, "return_token_offsets": True}).json()[0]
    ids, spans = out["token_ids"], out["token_offsets"]
    assert len(spans) == len(ids)
    pieces = [post(server, "/detokenize", {"tokens": [i]}).json()["prompt"] for i in ids]
    assert [text[s:e] for s, e in spans] == pieces
    for side, want in (("left", spans[-3:]), ("right", spans[:3])):
        cut = post(server, "/v1/completions/render", {
            "prompt": text, "return_token_offsets": True, "truncate_prompt_tokens": 3,
            "truncation_side": side}).json()[0]
        assert cut["token_offsets"] == want and len(cut["token_ids"]) == 3
    # off by default, none for a prompt of token ids
    assert post(server, "/v1/completions/render", {"prompt": text}).json()[0][
        "token_offsets"] is None
    assert post(server, "/v1/completions/render", {"prompt": ids, "return_token_offsets": True}
                ).json()[0]["token_offsets"] is None
    # chat: offsets in the template's text, one span per token, end to end
    chat = post(server, "/v1/chat/completions/render",
                {"messages": [{"role": "user", "content": "Hi"}],
                 "return_token_offsets": True}).json()
    spans = chat["token_offsets"]
    assert len(spans) == len(chat["token_ids"]) and spans[0][0] == 0
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    # the generation routes ignore it, as vLLM's
    r = post(server, "/v1/completions", {"prompt": text, "max_tokens": 1,
                                         "return_token_offsets": True})
    assert r.status_code == 200 and "token_offsets" not in r.json()
