"""RequestLimits: what a loaded engine allows a request, for SamplingParams.validate and
check_prompt.

The server and the offline LLM build it from the same EngineInfo (``from_info``), so a
request is judged against the same numbers on either path. Every field but the vocabulary
has a default, so SamplingParams can also be judged alone (tests, tools): no context length
means no context checks, no max_num_seqs no seat check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from actors.messages import EngineInfo

__all__ = ["MAX_N", "RequestLimits"]

MAX_N = 16  # choices per request (vLLM has no bound; ours keeps a request's seats few)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    vocab_size: int
    max_model_len: int | None = None  # prompt + output tokens; None: not checked
    max_logprobs: int = 20  # vLLM's --max-logprobs (-1: the vocabulary)
    scheduling_policy: str = "fcfs"  # a priority other than 0 needs "priority"
    # The engine reserves a running seat per choice, so n may not exceed it (None: any n).
    max_num_seqs: int | None = None
    max_n: int = MAX_N
    prompt_embeds_width: int = 0  # a prompt_embeds row's width; 0: none accepted

    @classmethod
    def from_info(cls, info: EngineInfo) -> RequestLimits:
        """The limits of the engine that published ``info``."""
        return cls(vocab_size=info.vocab_size, max_model_len=info.max_model_len,
                   max_logprobs=info.max_logprobs, scheduling_policy=info.scheduling_policy,
                   max_num_seqs=info.max_num_seqs,
                   prompt_embeds_width=info.prompt_embeds_width)
