"""Engine logprobs as the Outbox carries them: TokenLogprob lists per output, and the token
ids whose texts a response may print (decoded by the tokenizer actor off the event loop)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from actors.messages import RequestOutput
from actors.runtime.outbox import TokenLogprob

Logprobs = tuple[list[TokenLogprob], "list[TokenLogprob | None] | None"]


def has_logprobs(out: RequestOutput) -> bool:
    return bool(out.new_logprobs) or out.prompt_logprobs is not None


def named_ids(lps: list[TokenLogprob], prompt_lps: list[TokenLogprob | None] | None,
              prompt: Sequence[int]) -> Iterator[int]:
    """Every token id a response may print for these logprobs (an echo prints the prompt's
    first token, which has no logprob)."""
    for lp in lps:
        yield lp.token_id
        yield from (t for t, _ in lp.top)
    if prompt_lps is not None:
        yield from prompt[:1]
        for plp in prompt_lps:
            if plp is not None:
                yield plp.token_id
                yield from (t for t, _ in plp.top)


def logprobs_of(token_ids: list[int], out: RequestOutput) -> list[TokenLogprob]:
    lps = out.new_logprobs
    if not lps:
        return []
    return [
        TokenLogprob(tid, float(lp.logprob), list(zip(lp.top_token_ids, lp.top_logprobs)))
        for tid, lp in zip(token_ids, lps)
    ]


def prompt_logprobs_of(prompt: Sequence[int], out: RequestOutput
                     ) -> list[TokenLogprob | None] | None:
    lps = out.prompt_logprobs
    if lps is None:
        return None
    return [
        None if lp is None else TokenLogprob(
            tid, float(lp.logprob), list(zip(lp.top_token_ids, lp.top_logprobs)), lp.rank)
        for tid, lp in zip(prompt, lps)
    ]
