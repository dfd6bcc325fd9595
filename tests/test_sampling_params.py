"""SamplingParams: vLLM-compatible defaults, normalisation and the validation ranges."""

from __future__ import annotations

import math

import pytest
from actors.errors import RequestRefused
from actors.params.limits import RequestLimits
from actors.params.sampling import SamplingParams, SamplingParamsError

VOCAB = 1000
LIMITS = RequestLimits(VOCAB)


def check(**kwargs: object) -> None:
    SamplingParams(**kwargs).validate(LIMITS)  # type: ignore[arg-type]


def rejects(param: str, **kwargs: object) -> SamplingParamsError:
    with pytest.raises(SamplingParamsError) as info:
        check(**kwargs)
    assert info.value.param == param, info.value
    assert isinstance(info.value, RequestRefused) and isinstance(info.value, ValueError)
    assert str(info.value) == info.value.message
    return info.value


def test_defaults_follow_vllm() -> None:
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert p.max_tokens == 16 and p.min_tokens == 0 and p.seed is None
    assert p.stop == () and p.stop_token_ids == () and not p.ignore_eos
    assert p.logprobs is None and p.prompt_logprobs is None and p.skip_special_tokens
    p.validate(LIMITS)


def test_normalisation() -> None:
    p = SamplingParams(stop="###", stop_token_ids=[5, 6], seed=-1, allowed_token_ids=[1, 2])
    assert p.stop == ("###",) and p.stop_token_ids == (5, 6) and p.seed is None
    assert p.allowed_token_ids == (1, 2)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
    assert SamplingParams(stop=None, stop_token_ids=None).stop == ()
    with pytest.raises(AttributeError):
        p.temperature = 0.5  # type: ignore[misc]


def test_greedy_notion() -> None:
    assert SamplingParams(temperature=0.0).is_greedy
    assert SamplingParams(temperature=9e-6).is_greedy
    assert not SamplingParams(temperature=1e-5).is_greedy
    g = SamplingParams(temperature=0.0, top_p=0.5, top_k=5, min_p=0.2)
    assert (g.effective_temperature, g.effective_top_k, g.effective_top_p, g.effective_min_p) == (
        0.0,
        0,
        1.0,
        0.0,
    )
    assert SamplingParams(temperature=0.001).effective_temperature == 0.01  # clamped up
    assert SamplingParams(temperature=0.7, top_k=-1).effective_top_k == 0


@pytest.mark.parametrize("t", [0.0, 0.5, 2.0])
def test_temperature_accepted(t: float) -> None:
    check(temperature=t)


@pytest.mark.parametrize("t", [-0.1, 2.01, math.inf, math.nan, "1", None])
def test_temperature_rejected(t: object) -> None:
    rejects("temperature", temperature=t)


def test_ranges() -> None:
    check(top_p=1.0, top_k=-1, min_p=1.0, presence_penalty=-2.0, frequency_penalty=2.0)
    check(repetition_penalty=2.0, top_k=50, min_p=0.0, top_p=1e-3)
    rejects("top_p", top_p=0.0)
    rejects("top_p", top_p=1.01)
    rejects("top_k", top_k=-2)
    rejects("top_k", top_k=1.5)
    rejects("min_p", min_p=-0.01)
    rejects("min_p", min_p=1.5)
    rejects("presence_penalty", presence_penalty=2.5)
    rejects("frequency_penalty", frequency_penalty=-2.5)
    rejects("repetition_penalty", repetition_penalty=0.0)
    rejects("repetition_penalty", repetition_penalty=math.inf)
    rejects("repetition_penalty", repetition_penalty=2.5)


def test_n() -> None:
    check(n=16, temperature=1.0)
    rejects("n", n=0)
    rejects("n", n=17)
    rejects("n", n=True)
    e = rejects("n", n=2, temperature=0.0)
    assert "greedy" in e.message
    SamplingParams(n=64).validate(RequestLimits(VOCAB, max_n=64))


def test_tokens_and_lengths() -> None:
    check(max_tokens=None, min_tokens=5)
    check(max_tokens=1, min_tokens=1)
    rejects("max_tokens", max_tokens=0)
    rejects("min_tokens", min_tokens=-1)
    rejects("min_tokens", max_tokens=4, min_tokens=5)


def test_seed_and_priority_int64() -> None:
    by_priority = RequestLimits(VOCAB, scheduling_policy="priority")
    SamplingParams(seed=2**63 - 1, priority=-(2**63)).validate(by_priority)
    rejects("seed", seed=2**63)
    rejects("seed", seed=1.5)
    assert "at most" in refused(by_priority, "priority", priority=2**63)
    rejects("priority", priority=2**63)  # out of range comes before the policy


def test_cache_salt_as_vllm_checks_it_and_printable() -> None:
    check(cache_salt=None)
    check(cache_salt="tenant-42:v1 x")
    check(cache_salt="s" * 128)
    check(cache_salt="sel-\u00e9t\u00e9")  # printable non-ASCII is fine
    assert "non-empty string" in rejects("cache_salt", cache_salt="").message
    assert "non-empty string" in rejects("cache_salt", cache_salt=5).message
    for bad in ("s" * 129, "a/b", "a@b", "a\\b", "a\x00b"):
        assert "at most 128 characters" in rejects("cache_salt", cache_salt=bad).message
    for bad in ("a\nb", "a\tb", "a\x7fb", "a\u2028b"):
        assert "printable" in rejects("cache_salt", cache_salt=bad).message


def test_stop_strings_and_ids() -> None:
    check(stop=["a"] * 4, stop_token_ids=[0, VOCAB - 1])
    check(stop_token_ids=[1] * 256)
    assert rejects("stop_token_ids", stop_token_ids=[1] * 257).message == \
        "at most 256 stop_token_ids are allowed"
    assert rejects("stop", stop=["a"] * 5).message == "at most 4 stop strings are allowed, got 5"
    rejects("stop", stop=[""])
    rejects("stop", stop=["x" * 257])
    rejects("stop", stop=[1])
    rejects("stop_token_ids", stop_token_ids=[VOCAB])
    rejects("stop_token_ids", stop_token_ids=[-1])


def test_logprobs() -> None:
    check(logprobs=0, prompt_logprobs=20)
    check(logprobs=20)
    rejects("logprobs", logprobs=21)
    rejects("logprobs", logprobs=-1)
    rejects("logprobs", logprobs=2.0)
    rejects("prompt_logprobs", prompt_logprobs=-2)
    SamplingParams(logprobs=-1).validate(RequestLimits(VOCAB, max_logprobs=-1))  # whole vocabulary, operator opt-in
    SamplingParams(logprobs=500).validate(RequestLimits(VOCAB, max_logprobs=-1))


def test_logit_bias_and_allowed_ids() -> None:
    check(logit_bias={"5": 3.0, 7: -100.0})
    e = rejects("logit_bias", logit_bias={"x": 1.0, "5": 1.0})
    assert "'x'" in e.message
    e = rejects("logit_bias", logit_bias={VOCAB: 1.0})
    assert str(VOCAB) in e.message
    rejects("logit_bias", logit_bias={1: math.nan})
    rejects("logit_bias", logit_bias={i: 1.0 for i in range(1025)})
    assert SamplingParams(logit_bias={"9": 250.0, 3: -1e9}).logit_bias_items() == (
        (3, -100.0),
        (9, 100.0),
    )
    check(allowed_token_ids=[0, 1])
    rejects("allowed_token_ids", allowed_token_ids=[])
    rejects("allowed_token_ids", allowed_token_ids=[VOCAB])
    check(allowed_token_ids=[1] * VOCAB)
    assert rejects("allowed_token_ids", allowed_token_ids=[1] * (VOCAB + 1)).message == \
        "allowed_token_ids is longer than the vocabulary"
    check(truncate_prompt_tokens=-1)
    check(truncate_prompt_tokens=5, truncation_side="right")
    rejects("truncate_prompt_tokens", truncate_prompt_tokens=-2)
    rejects("truncate_prompt_tokens", truncate_prompt_tokens=1.5)
    rejects("truncation_side", truncation_side="middle")


def test_truncate_prompt_keeps_an_end_and_is_idempotent() -> None:
    """Also for offline engine users: the engine applies it too (the server truncates first,
    for echo and usage; applying it again changes nothing)."""
    ids = list(range(10))
    left = SamplingParams(truncate_prompt_tokens=4)
    right = SamplingParams(truncate_prompt_tokens=4, truncation_side="right")
    assert left.truncate_prompt(ids, 100) == [6, 7, 8, 9]
    assert right.truncate_prompt(ids, 100) == [0, 1, 2, 3]
    assert left.truncate_prompt(left.truncate_prompt(ids, 100), 100) == [6, 7, 8, 9]
    assert SamplingParams(truncate_prompt_tokens=-1).truncate_prompt(ids, 8) == ids[3:]
    assert SamplingParams().truncate_prompt(ids, 8) is ids
    with pytest.raises(SamplingParamsError, match="truncate_prompt_tokens"):
        SamplingParams(truncate_prompt_tokens=0).validate(RequestLimits(100))


def refused(limits: RequestLimits, param: str, **kwargs: object) -> str:
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(**kwargs).validate(limits)  # type: ignore[arg-type]
    assert info.value.param == param, info.value
    return info.value.message


def test_the_engine_limits_are_rules_too() -> None:
    """Context length, scheduling policy and running seats: judged by validate like every
    other range, so the server and the offline LLM refuse them alike."""
    ctx = RequestLimits(VOCAB, max_model_len=64)
    SamplingParams(max_tokens=64, min_tokens=63, truncate_prompt_tokens=64).validate(ctx)
    SamplingParams(max_tokens=10**6).validate(LIMITS)  # no context length: not judged
    assert refused(ctx, "max_tokens", max_tokens=65) == \
        "max_tokens=65 cannot be greater than max_model_len=64"
    assert refused(ctx, "min_tokens", max_tokens=None, min_tokens=64) == \
        "min_tokens (64) must be less than max_model_len (64)"
    assert refused(ctx, "truncate_prompt_tokens", truncate_prompt_tokens=65) == \
        "truncate_prompt_tokens (65) is greater than max_model_len (64)"
    assert refused(LIMITS, "priority", priority=-1) == \
        "Got priority -1 but Priority scheduling is not enabled."
    SamplingParams(priority=-1).validate(RequestLimits(VOCAB, scheduling_policy="priority"))
    seats = RequestLimits(VOCAB, max_num_seqs=2)
    SamplingParams(n=2, temperature=1.0).validate(seats)
    assert refused(seats, "n", n=3, temperature=1.0) == "n=3 exceeds max_num_seqs=2"
