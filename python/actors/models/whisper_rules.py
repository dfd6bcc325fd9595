"""Whisper's timestamp rules, as a logits processor of the runner's sampling hooks.

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

from collections.abc import Sequence

import torch

__all__ = ["MAX_INITIAL_TIMESTAMP_INDEX", "TimestampRules"]

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
