"""repetition_detection: end a generation whose tail repeats one token pattern.

vLLM 0.34's request parameter (``RepetitionDetectionParams``): with ``max_pattern_size``
> 0, after each new token the output's tail is compared with the ``min_count - 1`` spans
of the same length before it, for every pattern length from ``min_pattern_size`` (0
means 1) to ``max_pattern_size``; when one length matches ``min_count`` times in a row the
choice ends with finish_reason ``"repetition"`` and stop_reason ``"repetition_detected"``.
The check runs after the EOS, stop-token and length checks and not while ``min_tokens``
holds, as vLLM orders them.

Cost: a request that leaves it unset pays one attribute test per token. One that sets it
pays, per token, a comparison that stops at the first token that differs, so an output
that does not repeat costs about one comparison per pattern length; the lengths whose
``min_count`` spans are longer than the output are skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["REPETITION_STOP_REASON", "RepetitionDetection", "repeats", "repetition_problem"]

# What stop_reason says when the check ended a choice (vLLM's).
REPETITION_STOP_REASON = "repetition_detected"


@dataclass(frozen=True, slots=True)
class RepetitionDetection:
    """vLLM's fields and defaults (all 0: off)."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0


def repetition_problem(rule: object) -> tuple[str, str] | None:
    """(message, param) of what SamplingParams.validate refuses in a repetition_detection
    (vLLM's messages), or None."""
    param = "repetition_detection"
    if rule is None:
        return None
    if not isinstance(rule, RepetitionDetection):
        return "repetition_detection must be a RepetitionDetection", param
    for name in ("max_pattern_size", "min_pattern_size", "min_count"):
        value = getattr(rule, name)
        if not isinstance(value, int) or isinstance(value, bool):
            return f"{name} must be an integer, got {value!r}", f"{param}.{name}"
    if (rule.max_pattern_size < 0 or rule.min_pattern_size < 0
            or rule.min_pattern_size > rule.max_pattern_size):
        return ("max_pattern_size, min_pattern_size must be >=0, with min_pattern_size <= "
                "max_pattern_size. Set both to 0 to disable repetitive pattern detection.",
                param)
    if rule.max_pattern_size > 0 and rule.min_count < 2:
        return ("min_count must be >= 2 to detect repetitive patterns in engine output. If "
                "you do not wish to detect repetitive patterns, set max_pattern_size to 0.",
                param)
    return None


def repeats(tokens: Sequence[int], rule: RepetitionDetection) -> bool:
    """Whether the tail of `tokens` is one pattern of an allowed length, `min_count` times
    in a row."""
    count = rule.min_count
    if rule.max_pattern_size <= 0 or count < 2:
        return False
    n = len(tokens)
    for size in range(max(rule.min_pattern_size, 1), rule.max_pattern_size + 1):
        if size * count > n:
            return False  # longer patterns cannot fit either
        if _tail_repeats(tokens, n, size, count):
            return True
    return False


def _tail_repeats(tokens: Sequence[int], n: int, size: int, count: int) -> bool:
    """tokens[n - size:] equals each of the count - 1 spans of `size` before it."""
    for i in range(n - size, n):
        t = tokens[i]
        for k in range(1, count):
            if tokens[i - k * size] != t:
                return False
    return True
