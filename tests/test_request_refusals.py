"""One rule book, served and offline: every refused request field is refused alike.

One table drives both paths. For each row, a POST /v1/completions to a real
`python -m server` gets a 400 whose error.param names the field, and the offline
``actors.LLM.generate`` with the same SamplingParams and prompt raises the typed error
(SamplingParamsError for a field, TokenOutOfVocab / PromptTooLong / RequestRefused for the
prompt) with the same message and param, and queues nothing. Both engines have the test
servers' settings (max_model_len 1024, max_logprobs 20, fcfs), so the limits are equal.
Where vLLM's request model itself bounds a field (seed), the served message is pydantic's.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from actors.errors import PromptTooLong, RequestRefused, TokenOutOfVocab
from actors.params.sampling import SamplingParamsError

pytestmark = pytest.mark.slow

VOCAB = 49152
CONTEXT = 1024  # tests/server_helpers.BASE_ARGS and offline_llm()
HI = [1, 2, 3]
FIELD = SamplingParamsError

# (id, SamplingParams fields, prompt, the param named, the offline error type)
CASES: list[tuple[str, dict[str, Any], Any, str, type[RequestRefused]]] = [
    ("temperature", {"temperature": 2.5}, HI, "temperature", FIELD),
    ("top_p zero", {"top_p": 0.0}, HI, "top_p", FIELD),
    ("top_p below float32", {"top_p": 1e-46}, HI, "top_p", FIELD),
    ("top_k", {"top_k": -2}, HI, "top_k", FIELD),
    ("top_k past int32", {"top_k": 2**31}, HI, "top_k", FIELD),
    ("min_p", {"min_p": 1.5}, HI, "min_p", FIELD),
    ("presence_penalty", {"presence_penalty": 2.5}, HI, "presence_penalty", FIELD),
    ("frequency_penalty", {"frequency_penalty": -2.5}, HI, "frequency_penalty", FIELD),
    ("repetition_penalty zero", {"repetition_penalty": 0.0}, HI, "repetition_penalty",
     FIELD),
    ("repetition_penalty", {"repetition_penalty": 2.5}, HI, "repetition_penalty", FIELD),
    ("n", {"n": 17, "temperature": 1.0}, HI, "n", FIELD),
    ("n greedy", {"n": 2, "temperature": 0.0}, HI, "n", FIELD),
    ("logprobs", {"logprobs": 21}, HI, "logprobs", FIELD),
    ("logprobs vocabulary", {"logprobs": -1}, HI, "logprobs", FIELD),
    ("prompt_logprobs", {"prompt_logprobs": 21}, HI, "prompt_logprobs", FIELD),
    ("prompt_logprobs negative", {"prompt_logprobs": -2}, HI, "prompt_logprobs", FIELD),
    ("max_tokens zero", {"max_tokens": 0}, HI, "max_tokens", FIELD),
    ("max_tokens past context", {"max_tokens": CONTEXT + 1}, HI, "max_tokens", FIELD),
    ("min_tokens over max_tokens", {"max_tokens": 5, "min_tokens": 10}, HI, "min_tokens",
     FIELD),
    ("min_tokens fill the context", {"max_tokens": CONTEXT, "min_tokens": CONTEXT}, HI,
     "min_tokens", FIELD),
    ("min_tokens past the room", {"max_tokens": 100, "min_tokens": 100}, [1] * 1000,
     "min_tokens", RequestRefused),
    ("stop empty", {"stop": [""]}, HI, "stop", FIELD),
    ("stop too long", {"stop": ["x" * 257]}, HI, "stop", FIELD),
    ("stop count", {"stop": ["a", "b", "c", "d", "e"]}, HI, "stop", FIELD),
    ("stop_token_ids vocabulary", {"stop_token_ids": [VOCAB]}, HI, "stop_token_ids", FIELD),
    ("stop_token_ids count", {"stop_token_ids": [1] * 257}, HI, "stop_token_ids", FIELD),
    ("logit_bias vocabulary", {"logit_bias": {VOCAB: 1.0}}, HI, "logit_bias", FIELD),
    ("logit_bias entries", {"logit_bias": {i: 1.0 for i in range(1025)}}, HI, "logit_bias",
     FIELD),
    ("allowed_token_ids empty", {"allowed_token_ids": []}, HI, "allowed_token_ids", FIELD),
    ("allowed_token_ids vocabulary", {"allowed_token_ids": [VOCAB]}, HI, "allowed_token_ids",
     FIELD),
    ("seed", {"seed": 2**63}, HI, "seed", FIELD),
    ("priority under fcfs", {"priority": 1}, HI, "priority", FIELD),
    ("priority range", {"priority": 2**63}, HI, "priority", FIELD),
    ("cache_salt empty", {"cache_salt": ""}, HI, "cache_salt", FIELD),
    ("cache_salt slash", {"cache_salt": "a/b"}, HI, "cache_salt", FIELD),
    ("truncate_prompt_tokens zero", {"truncate_prompt_tokens": 0}, HI,
     "truncate_prompt_tokens", FIELD),
    ("truncate_prompt_tokens past context", {"truncate_prompt_tokens": CONTEXT + 1}, HI,
     "truncate_prompt_tokens", FIELD),
    ("prompt too long", {}, [1] * CONTEXT, "prompt", PromptTooLong),
    ("text prompt too long", {}, "hello " * 1100, "prompt", PromptTooLong),
    ("truncated prompt still too long", {"truncate_prompt_tokens": CONTEXT}, [1] * 1100,
     "prompt", PromptTooLong),
    ("prompt token out of vocabulary", {}, [5, VOCAB], "prompt", TokenOutOfVocab),
    ("prompt token negative", {}, [-1, 5], "prompt", TokenOutOfVocab),
    ("prompt empty after tokenizing", {}, "\x06", "prompt", RequestRefused),
]


# Fields whose range vLLM's request model declares (pydantic's bound): served, the message
# is pydantic's and names the bound's type, as vLLM's does; offline, validate's.
PROTOCOL_BOUNDS = {"seed": "[type=less_than_equal]"}


def body_of(fields: dict[str, Any], prompt: Any) -> dict[str, Any]:
    body = {"prompt": prompt, **fields}
    if "logit_bias" in body:  # JSON object keys are strings
        body["logit_bias"] = {str(k): v for k, v in body["logit_bias"].items()}
    return body


@pytest.fixture(scope="module")
def server(plain_server):
    return plain_server


@pytest.fixture(scope="module")
def llm():
    from server_helpers import offline_llm

    return offline_llm()


@pytest.mark.parametrize("fields,prompt,param,error", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_served_and_offline_refuse_alike(server, llm, fields, prompt, param, error) -> None:
    from actors import SamplingParams

    with pytest.raises(RequestRefused) as info:
        llm.generate([prompt], SamplingParams(**fields))
    offline = info.value
    assert type(offline) is error, repr(offline)
    assert offline.param == param, repr(offline)
    assert not llm.engine.has_unfinished(), "a refused request was queued"

    r = httpx.post(server.url + "/v1/completions", json=body_of(fields, prompt), timeout=60)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    if param in PROTOCOL_BOUNDS and fields.keys() == {param}:
        assert err["param"] == param and PROTOCOL_BOUNDS[param] in err["message"], err
    else:
        assert (err["param"], err["message"]) == (param, offline.message)
    assert err["type"] == "BadRequestError"


def test_the_table_refuses_what_it_names(llm) -> None:
    """The table can fail: each row's prompt and fields pass once its bad value is
    replaced by a good one (so the refusal is that field's, not another's)."""
    from actors import SamplingParams

    fixes = {"temperature": {"temperature": 1.0}, "top_p": {"top_p": 0.5},
             "top_k": {"top_k": 5}, "n": {"n": 2, "temperature": 1.0},
             "max_tokens": {"max_tokens": 2}, "seed": {"seed": 7}}
    for name, fields, prompt, param, _ in CASES:
        if param in fixes:
            good = {**fields, **fixes[param]}
            out = llm.generate([prompt], SamplingParams(**{**good, "max_tokens": 2}))
            assert out[0].outputs[0].token_ids, name
