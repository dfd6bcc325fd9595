"""check_prompt under its two rules, a generation's and a pooling request's: the same checks
in the same order, with the differences (the field named, the positions left for output,
the too-long wording) as the rule's; the messages are vLLM's, pinned here word for word."""

from __future__ import annotations

import pytest

from actors.errors import PromptTooLong, RequestRefused, TokenOutOfVocab
from actors.params.limits import RequestLimits
from actors.params.pooling import check_pooling_prompt
from actors.params.prompt import GENERATION, POOLING, check_prompt
from actors.params.sampling import SamplingParams

LIMITS = RequestLimits(vocab_size=100, max_model_len=8)


def refusal(rule, ids, params=None) -> RequestRefused:
    with pytest.raises(RequestRefused) as info:
        check_prompt(ids, params or SamplingParams(), LIMITS, rule)
    return info.value


def test_out_of_vocabulary_and_empty() -> None:
    for rule, param in ((GENERATION, "prompt"), (POOLING, "input")):
        err = refusal(rule, [1, 100])
        assert isinstance(err, TokenOutOfVocab)
        assert (err.message, err.param) == ("Token id 100 is out of vocabulary", param)
        err = refusal(rule, [])
        assert (err.message, err.param) == (f"The {param} is empty after tokenization.", param)


def test_a_generation_leaves_one_position() -> None:
    assert check_prompt(list(range(7)), SamplingParams(), LIMITS) == list(range(7))
    err = refusal(GENERATION, list(range(8)))
    assert isinstance(err, PromptTooLong) and err.param == "prompt"
    assert err.message == ("This model's maximum context length is 8 tokens. However, your "
                           "prompt contains 8 input tokens; at least one token must be left "
                           "for the completion.")
    err = refusal(GENERATION, list(range(5)), SamplingParams(min_tokens=4))
    assert err.param == "min_tokens" and "at most 3 tokens can be generated" in err.message


def test_a_pooling_prompt_may_fill_the_context() -> None:
    params = SamplingParams(max_tokens=1)
    assert check_pooling_prompt(list(range(8)), params, LIMITS) == list(range(8))
    err = refusal(POOLING, list(range(9)), params)
    assert isinstance(err, PromptTooLong) and err.param == "input"
    assert err.message == ("This model's maximum context length is 8 tokens. However, your "
                           "prompt contains 9 input tokens, which exceeds this limit even "
                           "without any output tokens. Please reduce the length of the input "
                           "prompt.")


def test_truncate_all_keeps_what_each_rule_allows() -> None:
    keep_all = SamplingParams(max_tokens=1, truncate_prompt_tokens=-1, truncation_side="left")
    ids = list(range(20))
    assert check_prompt(ids, keep_all, LIMITS) == ids[-7:]
    assert check_pooling_prompt(ids, keep_all, LIMITS) == ids[-8:]
