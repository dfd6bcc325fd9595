"""Logprobs as the dialects read them: `LogprobEntry` per position, built only when read.

`Logprobs` and `PromptLogprobs` wrap the Outbox's raw `TokenLogprob`s and the tokenizer
actor's token texts; an entry is made when a renderer indexes it, so a whole response's
logprobs (a million prompt positions, say) are built in the worker thread that builds its
body, never in one step of the event loop.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from actors.runtime.outbox import TokenLogprob


@dataclass(frozen=True, slots=True)
class TopLogprob:
    """One of the most likely tokens at a position."""

    token_id: int
    text: str
    logprob: float

    @property
    def bytes(self) -> builtins.bytes:
        return self.text.encode("utf-8")


@dataclass(frozen=True, slots=True)
class LogprobEntry:
    """One position: its token (the sampled one, or the prompt's), the token's logprob and
    the most likely tokens there, most likely first, each with its decoded text (the token
    decoded alone, special tokens kept, a partial character as U+FFFD)."""

    token_id: int
    text: str
    logprob: float
    top: tuple[TopLogprob, ...]
    rank: int = 0  # prompt tokens: 1 for the most likely; 0: not computed

    @property
    def bytes(self) -> builtins.bytes:
        return self.text.encode("utf-8")


def logprob_entry(lp: TokenLogprob) -> LogprobEntry:
    """The one place that reads a logprob's token texts (the tokenizer actor decodes them,
    off the event loop, into TokenLogprob.text and top_texts)."""
    top = tuple(TopLogprob(t, text, v)
                for (t, v), text in zip(lp.top, lp.top_texts, strict=True))
    return LogprobEntry(lp.token_id, lp.text, lp.logprob, top, lp.rank)


class Logprobs(Sequence[LogprobEntry]):
    """A choice's logprobs, one LogprobEntry per generated token, decoded when read."""

    __slots__ = ("_items",)

    def __init__(self, items: list[TokenLogprob]) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> LogprobEntry: ...
    @overload
    def __getitem__(self, i: slice) -> Logprobs: ...

    def __getitem__(self, i: int | slice) -> LogprobEntry | Logprobs:
        if isinstance(i, slice):
            return Logprobs(self._items[i])
        return logprob_entry(self._items[i])

    def __iter__(self) -> Iterator[LogprobEntry]:
        return (logprob_entry(lp) for lp in self._items)


class PromptLogprobs(Sequence["LogprobEntry | None"]):
    """A prompt's logprobs, one per prompt token; None for the first (nothing before it to
    score it by). Decoded when read."""

    __slots__ = ("_items",)

    def __init__(self, items: list[TokenLogprob | None]) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> LogprobEntry | None: ...
    @overload
    def __getitem__(self, i: slice) -> PromptLogprobs: ...

    def __getitem__(self, i: int | slice) -> LogprobEntry | None | PromptLogprobs:
        if isinstance(i, slice):
            return PromptLogprobs(self._items[i])
        lp = self._items[i]
        return None if lp is None else logprob_entry(lp)

    def __iter__(self) -> Iterator[LogprobEntry | None]:
        return (None if lp is None else logprob_entry(lp) for lp in self._items)


# -- what a generation reports ------------------------------------------------------------
