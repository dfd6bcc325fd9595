"""Whisper's rules: its model hook (models/hooks.py) and its timestamp rules, a logits
processor of the runner's sampling hooks.

``WhisperHook`` bans the checkpoint's suppress_tokens and the control tokens inside a
transcript (blank and end-of-text never first, as Whisper's own decoding and
faster-whisper), caps the context at the decoder's learned position table, checks each
window's encoder input against the model, and gives a window decoded with timestamps the
rules below.

A Whisper window decoded with timestamps (its prompt has no ``<|notimestamps|>``)
interleaves text with timestamp tokens (``timestamp_begin + t / 0.02 s``) that open and
close segments. Left alone the model may break that grammar (tiny.en draws
``<|notimestamps|>`` first), so every step of such a window masks, as Whisper's own
decoding (and CTranslate2's) does:

- ``<|notimestamps|>`` never;
- the first token is a timestamp no later than 1.0 s (``max_initial_timestamp``);
- timestamps come in pairs (end, then the next start), except right before the end:
  after a pair, text or the end; after a lone timestamp, another one or the end;
- timestamps never decrease, and a segment never has zero length;
- when the timestamps together are more likely than the best text token, a timestamp.

The processor sees the row before the sampler bans the model's suppressed tokens, so it
bans them itself first (the last rule compares probabilities without them, as Whisper's).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from actors.models.hooks import ModelHook, PromptRules
from actors.params.kinds import RequestKind, Transcribe

__all__ = ["MAX_INITIAL_TIMESTAMP_INDEX", "WHISPER_CONTROL", "TimestampRules", "WhisperHook"]

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

log = logging.getLogger("actors.models.whisper")

MAX_INITIAL_TIMESTAMP_INDEX = 50  # 1.0 s at 0.02 s a step, Whisper's default


class TimestampRules:
    """One window's rules (stateless: it reads the outputs so far at every call)."""

    __slots__ = ("eot", "notimestamps", "timestamp_begin", "suppress", "suppress_first")

    def __init__(self, eot: int, notimestamps: int, timestamp_begin: int,
                 suppress: Sequence[int] = (), suppress_first: Sequence[int] = ()) -> None:
        self.eot = eot
        self.notimestamps = notimestamps
        self.timestamp_begin = timestamp_begin
        self.suppress = torch.tensor(sorted(set(suppress)), dtype=torch.long)
        self.suppress_first = torch.tensor(sorted(set(suppress_first)), dtype=torch.long)

    def __call__(self, outputs: Sequence[int], logits: torch.Tensor) -> None:
        tb, neg = self.timestamp_begin, float("-inf")
        logits[self.suppress] = neg
        logits[self.notimestamps] = neg
        n = len(outputs)
        if n == 0:
            logits[self.suppress_first] = neg
            logits[:tb] = neg
            logits[tb + MAX_INITIAL_TIMESTAMP_INDEX + 1:] = neg
        else:
            last_ts = outputs[-1] >= tb
            penultimate_ts = n < 2 or outputs[-2] >= tb
            if last_ts:
                if penultimate_ts:
                    logits[tb:] = neg  # a pair just closed: text (or the end) next
                else:
                    logits[:self.eot] = neg  # a lone timestamp: another one, or the end
            last = next((t for t in reversed(outputs) if t >= tb), None)
            if last is not None:
                # non-decreasing; a segment closed by its start time would be empty
                bound = last if (last_ts and not penultimate_ts) else last + 1
                logits[tb:bound] = neg
        lp = torch.log_softmax(logits.float(), dim=-1)
        if torch.logsumexp(lp[tb:], dim=-1) > lp[:tb].max():
            logits[:tb] = neg


# Whisper's control tokens, never drawn inside a transcript (as Whisper's own decoding and
# faster-whisper add them to the checkpoint's suppress_tokens).
WHISPER_CONTROL = ("<|transcribe|>", "<|translate|>", "<|startoftranscript|>",
                   "<|startofprev|>", "<|startoflm|>", "<|nospeech|>", "<|nocaptions|>")


class WhisperHook(ModelHook):
    def __init__(self, config: PretrainedConfig) -> None:
        self.config = config

    def context_length(self, requested: int) -> int:
        """The decoder's learned position table (448) is Whisper's whole context; a
        server-wide --max-model-len above it means "as long as the model allows"."""
        limit = self.config.max_position_embeddings
        if requested > limit:
            log.info("max_model_len %d capped at Whisper's decoder length %d", requested,
                     limit)
            return limit
        return requested

    def suppress_tokens(self, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
        """The config's suppress_tokens and the control tokens the tokenizer has."""
        vocab = tokenizer.get_vocab()
        control = {vocab[t] for t in WHISPER_CONTROL if t in vocab}
        return tuple(sorted(set(self.config.extra.get("suppress_tokens", ())) | control))

    def begin_suppress_tokens(self) -> tuple[int, ...]:
        return tuple(self.config.extra.get("begin_suppress_tokens", ()))

    def prompt_rules(self, tokenizer: PreTrainedTokenizerBase, eos_token_ids: tuple[int, ...]
                     ) -> PromptRules | None:
        """A window's timestamp rules when its prompt asks for timestamps (no
        <|notimestamps|> in it); None otherwise. (The runner skips them for a window with
        allowed_token_ids: language detection's [sot] prompt.)"""
        nots = tokenizer.get_vocab().get("<|notimestamps|>")
        if nots is None or not eos_token_ids:
            return None
        suppress, begin = self.suppress_tokens(tokenizer), self.begin_suppress_tokens()

        def rules(prompt: tuple[int, ...]) -> tuple[Any, ...] | None:
            if nots in prompt:
                return None
            return (TimestampRules(eos_token_ids[0], nots, nots + 1, suppress, begin),)

        return rules

    def check(self, kind: RequestKind) -> None:
        """A window's log-mel features must fit the encoder."""
        if isinstance(kind, Transcribe):
            kind.encoder_input.check(int(self.config.extra["num_mel_bins"]))
