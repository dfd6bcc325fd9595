"""Listed logprobs (``logprob_token_ids``): the compiled sampler reports the logprob of each
id a row lists, from the distribution its top entries come from, on every ISA variant.

The check that can fail: with every token in the top list (num_top_logprobs = vocabulary),
each listed id's logprob equals that id's top entry exactly (same normalizer, same value), in
raw and processed mode, with the row's bias, masks and temperature applied in processed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import llmcore
from llmcore import SamplingBatch

VOCAB = 300


def _batch() -> SamplingBatch:
    batch = SamplingBatch()
    batch.add(temperature=0.0)
    batch.add(temperature=0.7, seed=3, logit_bias={5: 4.0}, banned_tokens=[7])
    batch.add(temperature=1.3, seed=9, allowed_tokens=range(0, VOCAB, 2),
              output_tokens=[4, 4, 6], frequency_penalty=0.5)
    return batch


LISTED = [[17, 3, 17, 299], [], [0, 7, 5, 1]]  # a repeat, an empty row, a masked id


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_listed_logprobs_equal_the_top_entries(isa: str, mode: str) -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(5)) * 3
    with llmcore.isa.capped(isa):
        res = _batch().sample(logits, num_top_logprobs=VOCAB, logprobs_mode=mode,
                              logprob_token_ids=LISTED)
    assert res.listed_logprobs.shape == (sum(map(len, LISTED)),)
    at = 0
    for r, ids in enumerate(LISTED):
        top = dict(zip(res.top_tokens[r].tolist(), res.top_logprobs[r].tolist()))
        for t in ids:
            got = float(res.listed_logprobs[at])
            at += 1
            if t in top:
                assert got == top[t], (r, t)
            else:  # only a masked token is missing from the top list (processed mode)
                assert mode == "processed" and got == -np.inf, (r, t)
    # raw mode is the model's log_softmax, whatever the row's processing
    if mode == "raw":
        want = torch.log_softmax(logits.double(), -1)
        np.testing.assert_allclose(res.listed_logprobs[:4], want[0, LISTED[0]].numpy(),
                                   atol=1e-5)


def test_listing_does_not_change_the_draws() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(6))
    plain = _batch().sample(logits)
    listed = _batch().sample(logits, logprob_token_ids=LISTED)
    assert plain.tokens.tolist() == listed.tokens.tolist()
    assert plain.listed_logprobs.shape == (0,)


@pytest.mark.parametrize("ids", [[[VOCAB]], [[-1]]])
def test_out_of_vocabulary_ids_are_refused(ids: list[list[int]]) -> None:
    batch = SamplingBatch()
    batch.add(temperature=0.0)
    with pytest.raises(ValueError, match="logprob token id"):
        batch.sample(torch.zeros(1, VOCAB), logprob_token_ids=ids)


@pytest.mark.slow
def test_offline_llm_reports_the_listed_ids() -> None:
    """Through the engine (actors.LLM): each position reports exactly the listed ids, in
    the listed order, with the values its top-20 run reports for them."""
    from actors import SamplingParams
    from server_helpers import offline_llm

    llm = offline_llm()
    prompt = [[1, 504, 3458, 282]]
    top = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=4, logprobs=20))
    steps = top[0].outputs[0].logprobs
    listed = sorted({t for lp in steps for t in lp.top_token_ids[:3]}) + [7]
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=4,
                                              logprob_token_ids=listed))
    assert out[0].outputs[0].token_ids == top[0].outputs[0].token_ids
    for want, got in zip(steps, out[0].outputs[0].logprobs, strict=True):
        assert got.top_token_ids == tuple(listed) and got.logprob == want.logprob
        tops = dict(zip(want.top_token_ids, want.top_logprobs))
        shared = [(v, tops[t]) for t, v in zip(got.top_token_ids, got.top_logprobs) if t in tops]
        assert shared and all(a == b for a, b in shared)
    with pytest.raises(ValueError, match="logprob_token_ids"):
        llm.generate(prompt, SamplingParams(logprob_token_ids=[1] * 129))
