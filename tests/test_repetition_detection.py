"""repetition_detection (vLLM 0.34): the tail check against a brute-force reading of its
definition, its validation messages, and where it sits among a sequence's stop checks."""

from __future__ import annotations

import random

import pytest

from actors.core.sequence import FinishReason, Sequence
from actors.params.limits import RequestLimits
from actors.params.repetition import RepetitionDetection, repeats
from actors.params.sampling import SamplingParams, SamplingParamsError

LIMITS = RequestLimits(vocab_size=100, max_model_len=256)


def reference(tokens: list[int], rule: RepetitionDetection) -> bool:
    """The definition read literally: some allowed pattern length L whose last L tokens,
    repeated min_count times, are the output's tail."""
    for size in range(max(rule.min_pattern_size, 1), rule.max_pattern_size + 1):
        span = size * rule.min_count
        if span <= len(tokens) and tokens[-span:] == tokens[-size:] * rule.min_count:
            return True
    return False


def test_tail_check_matches_the_definition():
    rng = random.Random(0)
    checked = hits = 0
    for _ in range(4000):
        alphabet = rng.randint(1, 3)  # small alphabets repeat often
        tokens = [rng.randrange(alphabet) for _ in range(rng.randint(0, 24))]
        if rng.random() < 0.3:  # and some tails that are repetitions by construction
            tokens += [rng.randrange(5) for _ in range(rng.randint(1, 4))] * rng.randint(2, 4)
        high = rng.randint(1, 6)
        rule = RepetitionDetection(high, rng.randint(0, high), rng.randint(2, 5))
        want = reference(tokens, rule)
        assert repeats(tokens, rule) == want, (tokens, rule)
        checked += 1
        hits += want
    assert 0.1 * checked < hits < 0.9 * checked  # both answers were exercised


@pytest.mark.parametrize(("tokens", "rule", "want"), [
    ([1, 2, 3, 1, 2, 3], RepetitionDetection(3, 0, 2), True),
    ([1, 2, 3, 1, 2, 4], RepetitionDetection(3, 0, 2), False),
    ([7, 7, 7], RepetitionDetection(1, 1, 3), True),
    ([7, 7], RepetitionDetection(1, 1, 3), False),
    # a pattern shorter than min_pattern_size does not count
    ([7, 7, 7, 7], RepetitionDetection(4, 3, 2), False),
    ([1, 7, 7, 1, 7, 7], RepetitionDetection(4, 3, 2), True),
    ([5, 5, 5, 5], RepetitionDetection(0, 0, 0), False),  # off
])
def test_tail_check_examples(tokens, rule, want):
    assert repeats(tokens, rule) is want


@pytest.mark.parametrize(("rule", "message"), [
    (RepetitionDetection(-1, 0, 2), "max_pattern_size, min_pattern_size must be >=0"),
    (RepetitionDetection(2, 3, 2), "with min_pattern_size <= max_pattern_size"),
    (RepetitionDetection(2, 0, 1), "min_count must be >= 2"),
    (RepetitionDetection(2, 0, 0), "min_count must be >= 2"),
])
def test_refused_values_name_the_field(rule, message):
    with pytest.raises(SamplingParamsError, match=message) as err:
        SamplingParams(repetition_detection=rule).validate(LIMITS)
    assert err.value.param == "repetition_detection"


def test_accepted_values():
    for rule in (RepetitionDetection(), RepetitionDetection(0, 0, 0),
                 RepetitionDetection(5, 0, 2), RepetitionDetection(5, 5, 9)):
        SamplingParams(repetition_detection=rule).validate(LIMITS)


@pytest.mark.parametrize("value", [0, -3])
def test_stream_interval_below_one_is_refused(value):
    with pytest.raises(SamplingParamsError, match=f"stream_interval must be at least 1, "
                                                  f"got {value}.") as err:
        SamplingParams(stream_interval=value).validate(LIMITS)
    assert err.value.param == "stream_interval"


def _run(tokens: list[int], **params) -> Sequence:
    seq = Sequence(0, "r", [1, 2, 3], SamplingParams(**params), max_model_len=256,
                   eos_token_ids=[0])
    for t in tokens:
        if seq.append_token(t):
            break
    return seq


def test_a_sequence_ends_with_repetition_and_its_stop_reason():
    rule = RepetitionDetection(max_pattern_size=2, min_count=3)
    seq = _run([9, 4, 5, 4, 5, 4, 5, 6, 6], max_tokens=50, repetition_detection=rule)
    assert seq.output_token_ids == [9, 4, 5, 4, 5, 4, 5]
    assert seq.finish_reason is FinishReason.REPETITION
    assert seq.stop_reason == "repetition_detected"


def test_min_tokens_holds_the_check_back():
    rule = RepetitionDetection(max_pattern_size=1, min_count=2)
    seq = _run([8, 8, 8, 8, 8], max_tokens=50, min_tokens=4, repetition_detection=rule)
    assert len(seq.output_token_ids) == 4 and seq.finish_reason is FinishReason.REPETITION


def test_length_and_stop_tokens_come_first():
    rule = RepetitionDetection(max_pattern_size=1, min_count=2)
    seq = _run([8, 8], max_tokens=2, repetition_detection=rule)
    assert seq.finish_reason is FinishReason.LENGTH and seq.stop_reason is None
    # [0, 0] repeats, but its second 0 is EOS (the first was held back by min_tokens)
    seq = _run([0, 0], max_tokens=9, min_tokens=1, repetition_detection=rule)
    assert seq.finish_reason is FinishReason.STOP and seq.stop_reason is None
    seq = _run([8, 8], max_tokens=9, stop_token_ids=[8], repetition_detection=rule)
    assert seq.finish_reason is FinishReason.STOP and seq.stop_reason == 8
