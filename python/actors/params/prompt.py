"""check_prompt: the one check of a tokenized prompt against the request and the engine.

The server's tokenizer actor and the offline ``LLM.generate`` both call it after
SamplingParams.validate, so a prompt is refused with the same typed error (and the same
message and ``param``) on either path, and the engine core trusts what it admits. The
errors carry no HTTP status; the server maps them to 400s.
"""

from __future__ import annotations

from actors.errors import PromptTooLong, RequestRefused, TokenOutOfVocab
from actors.params.limits import RequestLimits
from actors.params.sampling import SamplingParams

__all__ = ["check_prompt"]


def check_prompt(token_ids: list[int], params: SamplingParams,
                 limits: RequestLimits) -> list[int]:
    """The prompt as the engine will run it: ``token_ids`` after truncate_prompt_tokens
    (``token_ids`` itself when nothing is cut). Raises, in this order:
    TokenOutOfVocab (a token id outside the vocabulary), RequestRefused (an empty prompt),
    PromptTooLong (no position left for the completion), RequestRefused naming min_tokens
    (more than the prompt leaves)."""
    vocab = limits.vocab_size
    for t in token_ids:
        if not 0 <= t < vocab:
            raise TokenOutOfVocab(f"Token id {t} is out of vocabulary", param="prompt")
    if not token_ids:
        raise RequestRefused("The prompt is empty after tokenization.", param="prompt")
    limit = limits.max_model_len
    if limit is None:
        raise ValueError("check_prompt needs limits.max_model_len")
    ids = params.truncate_prompt(token_ids, limit)  # never empty: validate refuses 0
    if len(ids) >= limit:
        raise PromptTooLong(
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains {len(ids)} input tokens; at least one token must be left for the "
            "completion.", param="prompt")
    room = limit - len(ids)
    if params.min_tokens > room:
        # max_tokens is clamped to the room a prompt leaves; min_tokens cannot be.
        raise RequestRefused(
            f"min_tokens ({params.min_tokens}) is more than this prompt leaves for the "
            f"completion: the prompt has {len(ids)} tokens and the model's maximum context "
            f"length is {limit}, so at most {room} tokens can be generated.",
            param="min_tokens")
    return ids
