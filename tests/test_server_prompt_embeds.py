"""vLLM's ``prompt_embeds`` on /v1/completions through a real `python -m server
--enable-prompt-embeds` and the openai SDK, with the request bodies vLLM's tests send
(tests/entrypoints/openai/completion/test_completion_with_prompt_embeds.py): base64
torch.save tensors computed from the default model's own token embedding generate what the
text generates (one, a list, mixed with text prompts, streamed, with logprobs); every
malformed payload is a 400 naming the field and the server keeps serving; vLLM's refusals
(echo, prompt_logprobs, the flag off) in vLLM's words. Decoding's own cases:
test_prompt_embeds_decode.py; the engine's: test_prompt_embeds_engine.py."""

from __future__ import annotations

import base64
import io
import zipfile

import httpx
import pytest
import torch
from server_helpers import ServerProcess, default_tokenizer, offline_llm

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
PROMPTS = ["Hello, my name is", "What is an LLM?"]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--enable-prompt-embeds", "--enable-scale-out").wait_ready()
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    with OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def rows_of(text: str) -> torch.Tensor:
    """The rows the served model's embedding gives for the text's tokens (as the server
    tokenizes a completions prompt)."""
    ids = default_tokenizer().encode(text)
    with torch.inference_mode():
        return offline_llm().engine.loaded.model.embed(torch.tensor(ids)).clone()


def encoded(obj: object) -> str:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def embeds() -> list[str]:
    return [encoded(rows_of(p)) for p in PROMPTS]


def complete(client, prompt, extra=None, **kw):
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0.0,
                                     extra_body=extra, **kw)


def test_rows_complete_as_their_text_does(client, embeds) -> None:
    texts = [complete(client, p).choices[0] for p in PROMPTS]
    one = complete(client, None, {"prompt_embeds": embeds[0]})
    assert one.choices[0].text == texts[0].text and one.choices[0].finish_reason == "length"
    assert one.usage.prompt_tokens == len(default_tokenizer().encode(PROMPTS[0]))
    both = complete(client, None, {"prompt_embeds": embeds})
    assert [c.text for c in both.choices] == [t.text for t in texts]
    assert [c.index for c in both.choices] == [0, 1]
    # embeddings first, then the text prompts (vLLM's order)
    mixed = complete(client, PROMPTS[1], {"prompt_embeds": embeds[0]})
    assert [c.text for c in mixed.choices] == [texts[0].text, texts[1].text]
    # an empty list is no prompt: the text alone runs
    empty = complete(client, PROMPTS[0], {"prompt_embeds": []})
    assert [c.text for c in empty.choices] == [texts[0].text]
    # n choices fork from the rows as from the tokens
    seeded = {"n": 2, "temperature": 1.0, "seed": 5}
    want = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=5, **seeded)
    got = client.completions.create(model=MODEL, prompt=None, max_tokens=5,
                                    extra_body={"prompt_embeds": embeds[0]}, **seeded)
    assert [c.text for c in got.choices] == [c.text for c in want.choices]


def test_streams_and_logprobs(client, embeds) -> None:
    single = complete(client, None, {"prompt_embeds": embeds[0]}).choices[0].text
    chunks, finishes = [], 0
    for chunk in complete(client, None, {"prompt_embeds": embeds[0]}, stream=True):
        chunks.append(chunk.choices[0].text)
        finishes += chunk.choices[0].finish_reason is not None
    assert "".join(chunks) == single and finishes == 1
    per_choice: list[list[str]] = [[], []]
    for chunk in complete(client, None, {"prompt_embeds": embeds}, stream=True):
        per_choice[chunk.choices[0].index].append(chunk.choices[0].text)
    assert all(per_choice)
    for k in (0, 1):
        out = complete(client, None, {"prompt_embeds": embeds, "ignore_eos": True},
                       logprobs=k)
        for choice in out.choices:
            lp = choice.logprobs
            assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
            assert len(lp.text_offset) == 5
            assert all(max(k, 1) <= len(top) <= k + 1 for top in lp.top_logprobs)


def test_token_ids_of_rows_are_null_as_vllm_reports_them(client, embeds) -> None:
    text = complete(client, PROMPTS[0], {"return_token_ids": True}).choices[0]
    got = complete(client, PROMPTS[0], {"prompt_embeds": embeds[0], "return_token_ids": True})
    rows, words = got.choices
    assert rows.prompt_token_ids is None and rows.token_ids == text.token_ids
    assert words.prompt_token_ids == text.prompt_token_ids and words.prompt_token_ids
    first = next(iter(complete(client, None, {"prompt_embeds": embeds[0],
                                              "return_token_ids": True}, stream=True)))
    assert first.choices[0].prompt_token_ids is None and first.choices[0].token_ids


def post(server, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", timeout=120,
                      json={"model": MODEL, "max_tokens": 3, "temperature": 0, **body})


def in_archive(pickle: bytes) -> str:
    """torch.save's archive of one tensor with its data.pkl replaced by ``pickle``."""
    src = zipfile.ZipFile(io.BytesIO(base64.b64decode(encoded(torch.zeros(2, 4)))))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, pickle if info.filename.endswith("/data.pkl")
                         else src.read(info))
    return base64.b64encode(out.getvalue()).decode()


CASES = ["not-base64", "not-a-tensor", "a-bare-pickle", "a-dict", "two-tensors",
         "wrong-hidden-size", "one-dimension", "integers", "too-many-rows", "nan", "inf",
         "stride-0", "os-system-in-an-archive"]


@pytest.fixture(scope="module")
def malformed() -> dict[str, str]:
    rows = rows_of(PROMPTS[0])
    nan = rows.clone()
    nan[1, 7] = float("nan")
    inf = rows.clone()
    inf[0, 0] = float("inf")
    bomb = (b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03.")
    payloads = {
        "not-base64": "this is not base64!",
        "not-a-tensor": base64.b64encode(b"hello world, no torch file").decode(),
        "a-bare-pickle": base64.b64encode(bomb).decode(),
        "a-dict": encoded({"embeds": rows}),
        "two-tensors": encoded([rows, rows]),
        "wrong-hidden-size": encoded(rows[:, :-1].clone()),
        "one-dimension": encoded(rows[0].clone()),
        "integers": encoded(torch.zeros(3, rows.shape[1], dtype=torch.int64)),
        "too-many-rows": encoded(torch.zeros(1025, rows.shape[1])),
        "nan": encoded(nan),
        "inf": encoded(inf),
        "stride-0": encoded(rows[:1].expand(1000, rows.shape[1])),
        "os-system-in-an-archive": in_archive(bomb),
    }
    assert list(payloads) == CASES
    return payloads


@pytest.mark.parametrize("case", CASES)
def test_each_malformed_payload_is_a_400_naming_the_field(server, malformed, case) -> None:
    payload = malformed[case]
    r = post(server, {"prompt_embeds": payload})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "prompt_embeds", err
    assert "prompt_embeds" in err["message"] or "context length" in err["message"], err
    # in a list, beside a good one: the whole request is refused, nothing runs
    r = post(server, {"prompt_embeds": [encoded(rows_of(PROMPTS[1])), payload]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_embeds"
    ok = post(server, {"prompt": PROMPTS[0]})  # and the server serves on
    assert ok.status_code == 200, ok.text


def test_vllms_refusals_in_vllms_words(server, embeds) -> None:
    cases = [
        ({"prompt_embeds": embeds[0], "echo": True}, "echo",
         "Echo is unsupported with prompt embeds."),
        ({"prompt_embeds": embeds[0], "prompt_logprobs": 1}, "prompt_logprobs",
         "prompt_logprobs is not compatible with prompt embeds."),
        ({"prompt_embeds": [embeds[0]] * 65}, "prompt_embeds",
         "prompt_embeds list length 65 exceeds the maximum allowed count of 64."),
        ({"prompt_embeds": 7}, "prompt_embeds", None),
    ]
    for body, param, message in cases:
        r = post(server, body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param, err
        assert message is None or err["message"] == message, err


def test_the_render_route_refuses_rows(server, embeds) -> None:
    r = httpx.post(server.url + "/v1/completions/render", timeout=60,
                   json={"model": MODEL, "prompt_embeds": embeds[0]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "prompt_embeds"


def test_without_the_flag_the_field_is_vllms_400(plain_server, embeds) -> None:
    r = post(plain_server, {"prompt_embeds": embeds[0]})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err == {**err, "param": "prompt_embeds", "message":
                   "You must set `--enable-prompt-embeds` to input `prompt_embeds`."}
    # an empty list asks for nothing: the text prompt runs, as in vLLM
    assert post(plain_server, {"prompt": "Hi", "prompt_embeds": []}).status_code == 200
