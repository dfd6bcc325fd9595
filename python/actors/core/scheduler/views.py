"""Message views of a Sequence: what the engine and the tokenizer side get to see."""

from __future__ import annotations

from actors.core.sequence import FinishReason, Sequence
from actors.messages import Logprobs, NewSeq, RequestOutput, SamplingRow

__all__ = ["new_seq_of", "output_of", "sampling_row_of"]


def sampling_row_of(seq: Sequence) -> SamplingRow:
    if seq.beam is not None:
        return _beam_row(seq)
    static = seq.row_static
    if static is None:  # the per-request part, computed once per sequence
        p = seq.params
        static = seq.row_static = (
            p.effective_temperature,
            p.effective_top_k,
            p.effective_top_p,
            p.effective_min_p,
            float(p.presence_penalty),
            float(p.frequency_penalty),
            float(p.repetition_penalty),
            seq.rng_seed,
        )
    p = seq.params
    n_out = len(seq.output_token_ids)
    banned = seq.suppressed_token_ids() if n_out < p.min_tokens else ()
    if seq.suppress or seq.suppress_first:  # the model family's rules (models/hooks.py)
        banned = banned + seq.suppress + (seq.suppress_first if n_out == 0 else ())
    return SamplingRow(
        *static,
        position=n_out,
        num_logprobs=p.logprobs or 0,
        want_logprobs=p.wants_logprobs,
        banned_token_ids=banned,
        logprob_token_ids=p.logprob_token_ids or (),
    )


def _beam_row(seq: Sequence) -> SamplingRow:
    """A beam's row: greedy (the draw is unused), no penalty or ban, and the raw top
    logprobs its group needs (2 * width candidates, or more when the request reports more
    alternatives); the sampler caps the count at the vocabulary."""
    lp = seq.params.logprobs
    k = -1 if lp == -1 else max(seq.beam.num_candidates, lp or 0)
    return SamplingRow(0.0, 0, 1.0, 0.0, 0.0, 0.0, 1.0, seq.rng_seed,
                       position=len(seq.output_token_ids), num_logprobs=k,
                       want_logprobs=True, banned_token_ids=())


def new_seq_of(seq: Sequence) -> NewSeq:
    p = seq.params
    return NewSeq(
        seq_id=seq.seq_id,
        request_id=seq.request_id,
        index=seq.index,
        prompt_token_ids=seq.prompt_token_ids,
        output_token_ids=tuple(seq.output_token_ids),
        logit_bias=p.logit_bias_items(),
        allowed_token_ids=p.allowed_token_ids,
        kind=seq.kind,
        structured=p.structured,
        reasoning=p.reasoning_gate,
    )


def output_of(
    seq: Sequence,
    new_token_ids: tuple[int, ...] = (),
    new_logprobs: tuple[Logprobs, ...] | None = None,
    prompt_logprobs: tuple[Logprobs | None, ...] | None = None,
) -> RequestOutput:
    reason = seq.finish_reason
    return RequestOutput(
        request_id=seq.request_id,
        index=seq.index,
        new_token_ids=new_token_ids,
        new_logprobs=new_logprobs,
        finished=seq.is_finished,
        finish_reason=None if reason is None else reason.value,
        stop_reason=seq.stop_reason,
        num_prompt_tokens=seq.num_prompt_tokens,
        num_cached_tokens=seq.num_cached_tokens,
        num_output_tokens=seq.num_output_tokens,
        prompt_logprobs=prompt_logprobs,
        # STOP with a new token is a stop token or EOS (a mask that allows nothing ends
        # with STOP and no token; stop strings are the front end's).
        stopped_on_token=reason is FinishReason.STOP and bool(new_token_ids),
    )
