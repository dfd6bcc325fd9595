"""Model hooks: the per-family decoding rules the engine applies without knowing the
family. A model class may define ``decoding_hook(config)``; models without one get the
neutral ``ModelHook`` (no tokens banned, no per-prompt processors).

Whisper's are the reason this exists: its checkpoint's suppress_tokens and its control
tokens are never drawn inside a transcript, blank and end-of-text never first, and a
window decoded with timestamps follows the timestamp grammar (whisper_rules.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# A per-prompt logits-processor factory: prompt token ids -> processors, or None.
PromptRules = Callable[[tuple[int, ...]], tuple[Any, ...] | None]


class ModelHook:
    def suppress_tokens(self, tokenizer: Any) -> tuple[int, ...]:
        """Tokens a sequence of this model never draws."""
        return ()

    def begin_suppress_tokens(self) -> tuple[int, ...]:
        """Tokens it never draws first."""
        return ()

    def prompt_rules(self, tokenizer: Any, eos_token_ids: tuple[int, ...]) -> PromptRules | None:
        """The logits processors a sequence runs under, chosen from its prompt."""
        return None


# Whisper's control tokens, never drawn inside a transcript (as Whisper's own decoding and
# faster-whisper add them to the checkpoint's suppress_tokens).
WHISPER_CONTROL = ("<|transcribe|>", "<|translate|>", "<|startoftranscript|>",
                   "<|startofprev|>", "<|startoflm|>", "<|nospeech|>", "<|nocaptions|>")


class WhisperHook(ModelHook):
    def __init__(self, config: Any) -> None:
        self.config = config

    def suppress_tokens(self, tokenizer: Any) -> tuple[int, ...]:
        """The config's suppress_tokens and the control tokens the tokenizer has."""
        vocab = tokenizer.get_vocab()
        control = {vocab[t] for t in WHISPER_CONTROL if t in vocab}
        return tuple(sorted(set(self.config.extra.get("suppress_tokens", ())) | control))

    def begin_suppress_tokens(self) -> tuple[int, ...]:
        return tuple(self.config.extra.get("begin_suppress_tokens", ()))

    def prompt_rules(self, tokenizer: Any, eos_token_ids: tuple[int, ...]) -> PromptRules | None:
        """A window's timestamp rules when its prompt asks for timestamps (no
        <|notimestamps|> in it); None otherwise. (The runner skips them for a window with
        allowed_token_ids: language detection's [sot] prompt.)"""
        from actors.models.whisper_rules import TimestampRules

        nots = tokenizer.get_vocab().get("<|notimestamps|>")
        if nots is None or not eos_token_ids:
            return None
        suppress, begin = self.suppress_tokens(tokenizer), self.begin_suppress_tokens()

        def rules(prompt: tuple[int, ...]) -> tuple[Any, ...] | None:
            if nots in prompt:
                return None
            return (TimestampRules(eos_token_ids[0], nots, nots + 1, suppress, begin),)

        return rules


def hook_for(model: Any, config: Any) -> ModelHook:
    make = getattr(model, "decoding_hook", None)
    return make(config) if make is not None else ModelHook()
