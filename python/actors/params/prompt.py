"""check_prompt: the one check of a tokenized prompt against the request and the engine.

The server's tokenizer actor and the offline ``LLM.generate`` both call it after
SamplingParams.validate, so a prompt is refused with the same typed error (and the same
message and ``param``) on either path, and the engine core trusts what it admits. The
errors carry no HTTP status; the server maps them to 400s.

A pooling request (embeddings) is checked by the same function under another
`PromptRule` (`POOLING`): it generates nothing, so its prompt may fill the whole context,
and its refusals name `input` with vLLM's wording for embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass

from actors.errors import PromptTooLong, RequestRefused, TokenOutOfVocab
from actors.params.limits import RequestLimits
from actors.params.sampling import SamplingParams

__all__ = ["EMBEDS", "GENERATION", "POOLING", "PromptRule", "check_prompt"]


@dataclass(frozen=True, slots=True)
class PromptRule:
    """What differs between the prompt of a generation and that of a pooling request."""

    param: str  # the field every refusal names
    output_positions: int  # positions the prompt must leave free (1: the first output token)
    too_long: str  # how the too-long message ends


GENERATION = PromptRule("prompt", 1, "; at least one token must be left for the completion.")
# A prompt given as embedding rows (actors.params.embeds), judged on its placeholder ids.
EMBEDS = PromptRule("prompt_embeds", 1, GENERATION.too_long)
POOLING = PromptRule("input", 0, ", which exceeds this limit even without any output "
                                 "tokens. Please reduce the length of the input prompt.")


def check_prompt(token_ids: list[int], params: SamplingParams, limits: RequestLimits,
                 rule: PromptRule = GENERATION) -> list[int]:
    """The prompt as the engine will run it: ``token_ids`` after truncate_prompt_tokens
    (``token_ids`` itself when nothing is cut). Raises, in this order:
    TokenOutOfVocab (a token id outside the vocabulary), RequestRefused (an empty prompt),
    PromptTooLong (fewer than ``rule.output_positions`` positions left), RequestRefused
    naming min_tokens (more than the prompt leaves; a generation's only)."""
    param = rule.param
    vocab = limits.vocab_size
    for t in token_ids:
        if not 0 <= t < vocab:
            raise TokenOutOfVocab(f"Token id {t} is out of vocabulary", param=param)
    if not token_ids:
        raise RequestRefused(f"The {param} is empty after tokenization.", param=param)
    limit = limits.max_model_len
    if limit is None:
        raise ValueError("check_prompt needs limits.max_model_len")
    # truncate_prompt_tokens=-1 keeps what the context holds besides the output positions
    # (never empty: validate refuses 0)
    ids = params.truncate_prompt(token_ids, limit + 1 - rule.output_positions)
    if len(ids) > limit - rule.output_positions:
        raise PromptTooLong(
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains {len(ids)} input tokens{rule.too_long}", param=param)
    room = limit - len(ids)
    if rule.output_positions and params.min_tokens > room:
        # max_tokens is clamped to the room a prompt leaves; min_tokens cannot be.
        raise RequestRefused(
            f"min_tokens ({params.min_tokens}) is more than this prompt leaves for the "
            f"completion: the prompt has {len(ids)} tokens and the model's maximum context "
            f"length is {limit}, so at most {room} tokens can be generated.",
            param="min_tokens")
    return ids
