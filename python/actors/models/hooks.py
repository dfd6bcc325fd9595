"""Model hooks: the rules of a model family that the engine applies without knowing the
family. A model class may define ``decoding_hook(config)`` returning a ``ModelHook``;
models without one get the neutral ``ModelHook`` (no tokens banned, no per-prompt
processors, no checks of their own).

The engine asks a hook four things (core/build.py at load, core/engine.py per request):

- ``context_length``: the context it serves, from the one configured;
- ``suppress_tokens`` / ``begin_suppress_tokens``: tokens never drawn / never drawn first;
- ``prompt_rules``: logits processors a sequence runs under, chosen from its prompt;
- ``check``: refuses (ValueError) a request whose inputs the model cannot take.

Whisper's hook (whisper_rules.WhisperHook) is the reason this exists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from actors.params.kinds import RequestKind

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

__all__ = ["ModelHook", "PromptRules", "hook_for"]

# A per-prompt logits-processor factory: prompt token ids -> processors, or None.
PromptRules = Callable[[tuple[int, ...]], tuple[Any, ...] | None]


class ModelHook:
    def context_length(self, requested: int) -> int:
        """The context the engine serves when ``requested`` is configured (the engine
        refuses one above the model's position table)."""
        return requested

    def suppress_tokens(self, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
        """Tokens a sequence of this model never draws."""
        return ()

    def begin_suppress_tokens(self) -> tuple[int, ...]:
        """Tokens it never draws first."""
        return ()

    def prompt_rules(self, tokenizer: PreTrainedTokenizerBase, eos_token_ids: tuple[int, ...]
                     ) -> PromptRules | None:
        """The logits processors a sequence runs under, chosen from its prompt."""
        return None

    def check(self, kind: RequestKind) -> None:
        """Raises ValueError for a request whose inputs this model cannot take."""


def hook_for(model: torch.nn.Module, config: PretrainedConfig) -> ModelHook:
    make = getattr(model, "decoding_hook", None)
    return make(config) if make is not None else ModelHook()
