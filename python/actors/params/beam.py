"""The beam-search fields of SamplingParams and what a beam request may combine them with.

vLLM serves ``use_beam_search`` with ``n`` beams (its BeamSearchParams: beam_width = n,
max_tokens, ignore_eos, length_penalty, include_stop_str_in_output, skip_special_tokens);
the search itself is the engine's (actors.core.scheduler.beam_group). A beam request's
sampling fields (temperature, top_p/top_k/min_p, penalties, seed, stop strings and ids,
min_tokens, logit_bias) take no part in it, as in vLLM; the server leaves them out.

Refused here, with the field named, where the engine would otherwise answer something the
client did not ask for: a constraint (structured outputs), an allow-list of tokens (not
scored by the engine's search yet), listed-token logprobs and repetition detection (the
search reports and stops on its own terms; vLLM ignores both there silently) and prompt
logprobs (beam search computes none, as vLLM says).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from actors.params.sampling import SamplingParams

__all__ = ["beam_error"]


def beam_error(p: SamplingParams) -> tuple[str, str] | None:
    """(message, field) of the first beam-search rule ``p`` breaks, or None."""
    lp = p.length_penalty
    if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp):
        return f"length_penalty must be a finite number, got {lp!r}", "length_penalty"
    if p.structured is not None:
        return ("structured outputs are not supported with beam search by this server",
                "structured_outputs")
    if p.allowed_token_ids is not None:
        return ("allowed_token_ids is not supported with beam search by this server yet",
                "allowed_token_ids")
    if p.logprob_token_ids is not None:
        return ("logprob_token_ids is not supported with beam search: a beam reports the "
                "logprobs of its own search", "logprob_token_ids")
    if p.repetition_detection is not None:
        return ("repetition_detection is not supported with beam search by this server",
                "repetition_detection")
    if p.prompt_logprobs is not None:
        return ("`prompt_logprobs` is not supported with beam search because beam search "
                "does not compute prompt logprobs.", "prompt_logprobs")
    return None
