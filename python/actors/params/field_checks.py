"""The field checks SamplingParams.validate is made of: each judges one value as the core
will hold it and raises SamplingParamsError naming the field (vLLM's messages where vLLM
has the rule)."""

from __future__ import annotations

import math

from actors.errors import RequestRefused

# The core's types (lc_sampling_row): the per-row reals are float32 and top_k is int32.
# Kernels may flush float32 subnormals to zero, so a bound that is open at 0 means "at least
# the smallest normal float32".
FLOAT32_MIN_NORMAL = 2.0**-126
INT32_MAX = 2**31 - 1


class SamplingParamsError(RequestRefused):
    """An out-of-range request parameter; ``param`` names the field."""

    param: str

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message, param)


def is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_real(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def int_in(x: object, name: str, low: int | None, high: int | None) -> None:
    if not is_int(x):
        raise SamplingParamsError(f"{name} must be an integer, got {x!r}", name)
    assert isinstance(x, int)
    if low is not None and x < low:
        raise SamplingParamsError(f"{name} must be at least {low}, got {x}", name)
    if high is not None and x > high:
        raise SamplingParamsError(f"{name} must be at most {high}, got {x}", name)


def real_in(x: object, name: str, low: float, high: float, *, low_open: bool = False) -> None:
    """x in [low, high] (or (low, high]) as the float32 the sampler receives. The bounds are
    float32-exact, so rounding keeps a value of a closed range inside it; only a bound open
    at 0 needs a float32 check (1e-46 rounds to 0.0, 1e-40 to a subnormal)."""
    if not is_real(x) or not math.isfinite(x):  # type: ignore[arg-type]
        raise SamplingParamsError(f"{name} must be a finite number, got {x!r}", name)
    assert isinstance(x, (int, float))
    if (x <= low if low_open else x < low) or x > high:
        lo = "(" if low_open else "["
        raise SamplingParamsError(f"{name} must be in {lo}{low}, {high}], got {x}", name)
    if low_open and low == 0.0 and x < FLOAT32_MIN_NORMAL:
        raise SamplingParamsError(
            f"{name} must be at least {FLOAT32_MIN_NORMAL:.9g} (the smallest normal float32, "
            f"the sampler's type), got {x}", name,
        )


def logprobs_in(value: object, name: str, vocab_size: int, max_logprobs: int) -> None:
    """vLLM's rule and messages: -1 asks for the whole vocabulary, and max_logprobs=-1
    allows it."""
    if value is None:
        return
    if not is_int(value):
        raise SamplingParamsError(f"{name} must be an integer, got {value!r}", name)
    assert isinstance(value, int)
    if value < -1:
        raise SamplingParamsError(f"`{name}` must be a positive value or -1.", name)
    wanted = vocab_size if value == -1 else value
    allowed = vocab_size if max_logprobs == -1 else max_logprobs
    kind = "sample" if name == "logprobs" else "prompt"
    if wanted > allowed:
        raise SamplingParamsError(
            f"Requested {kind} logprobs of {wanted}, which is greater than max allowed: "
            f"{allowed}", name,
        )


def token_id_in(t: object, name: str, vocab_size: int) -> None:
    if not is_int(t):
        raise SamplingParamsError(f"{name} must hold integer token ids, got {t!r}", name)
    assert isinstance(t, int)
    if not 0 <= t < vocab_size:
        raise SamplingParamsError(
            f"token id {t} in {name} is out of vocabulary (vocab size {vocab_size})", name
        )
