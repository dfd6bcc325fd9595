"""SamplingParams.validate judges every value as the core will see it: float32 and int32.

A value Python accepts but float32 or int32 cannot carry (top_p=1e-46 rounds to 0.0, which
the core refuses; top_k=2**31 overflows int32) would otherwise reach the sampler and fail a
whole engine step. And logprobs follow vLLM's max_logprobs rule (-1 = the vocabulary), with
the core's own cap on sampled top logprobs on top.
"""

from __future__ import annotations

import struct

import pytest
from actors.params.limits import RequestLimits
from actors.params.sampling import (
    FLOAT32_MIN_NORMAL,
    INT32_MAX,
    SamplingParams,
    SamplingParamsError,
)

VOCAB = 1000


def lim(max_logprobs: int = 20) -> RequestLimits:
    return RequestLimits(VOCAB, max_logprobs=max_logprobs)


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def rejects(param: str, max_logprobs: int = 20, **kwargs: object) -> str:
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(**kwargs).validate(lim(max_logprobs))  # type: ignore[arg-type]
    assert info.value.param == param, info.value
    return info.value.message


def test_constants_are_the_core_types() -> None:
    assert FLOAT32_MIN_NORMAL == 2.0**-126 and f32(FLOAT32_MIN_NORMAL) == FLOAT32_MIN_NORMAL
    assert INT32_MAX == 2**31 - 1


@pytest.mark.parametrize("field", ["top_p", "repetition_penalty"])
@pytest.mark.parametrize("value", [1e-46, 5e-324, 1e-40, FLOAT32_MIN_NORMAL / 2])
def test_open_at_zero_fields_refuse_what_float32_cannot_keep_above_zero(field: str,
                                                                       value: float) -> None:
    # 1e-46 is 0.0 in float32; 1e-40 is a float32 subnormal, which kernels may flush to 0.
    assert value > 0 and f32(value) < FLOAT32_MIN_NORMAL
    message = rejects(field, temperature=1.0, **{field: value})
    assert field in message and "float32" in message


@pytest.mark.parametrize("field", ["top_p", "repetition_penalty"])
def test_smallest_normal_float32_is_accepted(field: str) -> None:
    SamplingParams(temperature=1.0, **{field: FLOAT32_MIN_NORMAL}).validate(lim())


@pytest.mark.parametrize("field,low", [("temperature", 0.0), ("min_p", 0.0),
                                       ("presence_penalty", -2.0),
                                       ("frequency_penalty", -2.0)])
def test_closed_ranges_take_subnormals_and_negative_zero(field: str, low: float) -> None:
    # Inside a closed range whose bounds float32 holds exactly, rounding to float32 stays
    # inside it: a value that becomes 0.0 or a subnormal is simply (almost) "off".
    for value in (5e-324, 1e-46, -0.0, 1e-40):
        if value >= low:
            SamplingParams(**{"temperature": 1.0, field: value}).validate(lim())


def test_top_k_fits_int32() -> None:
    SamplingParams(top_k=INT32_MAX).validate(lim())
    for value in (2**31, 2**32 + 5, 2**63, 10**30):
        assert "int32" in rejects("top_k", top_k=value)


def test_logprobs_follow_vllm_max_logprobs() -> None:
    SamplingParams(logprobs=20, prompt_logprobs=20).validate(lim(20))
    assert rejects("logprobs", logprobs=21) == (
        "Requested sample logprobs of 21, which is greater than max allowed: 20")
    assert rejects("prompt_logprobs", prompt_logprobs=21) == (
        "Requested prompt logprobs of 21, which is greater than max allowed: 20")
    # -1 asks for the whole vocabulary: refused under a cap, allowed with max_logprobs=-1.
    assert rejects("logprobs", logprobs=-1) == (
        f"Requested sample logprobs of {VOCAB}, which is greater than max allowed: 20")
    SamplingParams(logprobs=-1, prompt_logprobs=-1).validate(lim(-1))
    assert "greater than max allowed: 5" in rejects("logprobs", max_logprobs=5, logprobs=6)
    for name in ("logprobs", "prompt_logprobs"):
        assert "positive value or -1" in rejects(name, **{name: -2})
        rejects(name, **{name: 2.0})
        rejects(name, **{name: True})


def test_logprobs_are_bounded_by_max_logprobs_and_the_vocabulary_only() -> None:
    # The core's sampler returns any count up to the vocabulary: no cap of its own.
    SamplingParams(logprobs=VOCAB, prompt_logprobs=VOCAB).validate(lim(-1))
    assert "greater than max allowed: 1000" in rejects("logprobs", max_logprobs=-1,
                                                       logprobs=VOCAB + 1)
    assert "greater than max allowed: 25" in rejects("prompt_logprobs", max_logprobs=25,
                                                     prompt_logprobs=26)

