"""Incremental detokenization with stop strings.

Text reaches a client in three stages:

    token ids --DecodeStream--> decoded text --hold-back--> emitted text
                (never splits a UTF-8 char)   (never emits a possible stop prefix)

`DecodeStream` returns None while a token ends inside a multi-byte character, so decoded
text only ever contains whole characters. Decoded text then waits in `_held` while any
suffix of it could still grow into a stop string; a stop string is therefore always found
inside `_held`, never split across what was already emitted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

# Prompt tokens handed to DecodeStream as already-seen context: enough for a byte-level
# BPE to finish a character the prompt left open (a UTF-8 char is at most 4 bytes).
PROMPT_CONTEXT_TOKENS = 4


@dataclass(slots=True)
class DetokenizedStep:
    """What one batch of new tokens adds to the output."""

    text: str
    stop_reason: str | None = None  # the stop string matched, if any; generation ends


class IncrementalDetokenizer:
    """Decodes one sequence's generated tokens and applies its stop strings."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        prompt_token_ids: list[int] | None = None,
        skip_special_tokens: bool = True,
        stop: list[str] | None = None,
        include_stop_str_in_output: bool = False,
    ) -> None:
        self._tokenizer = tokenizer
        context = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:]) if prompt_token_ids else []
        self._stream = DecodeStream(context, skip_special_tokens=skip_special_tokens)
        self._stop = [s for s in (stop or []) if s]
        self._include_stop = include_stop_str_in_output
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def add(self, token_ids: list[int], *, ends_on_stop_token: bool = False) -> DetokenizedStep:
        """Decode new tokens; return the text now safe to emit (and the stop hit, if any).

        ``ends_on_stop_token``: the last id is the EOS or stop token id that ended the
        sequence (RequestOutput.stopped_on_token). As in vLLM its text is not output unless
        include_stop_str_in_output, which matters when special tokens are kept (an
        ``<|im_end|>`` would otherwise end the text) or a stop token id is a plain word."""
        if ends_on_stop_token and not self._include_stop:
            token_ids = token_ids[:-1]
        if self._stopped:
            return DetokenizedStep("")
        for token_id in token_ids:
            piece = self._stream.step(self._tokenizer, token_id)
            if piece:
                self._held += piece
        if not self._stop:
            out, self._held = self._held, ""
            return DetokenizedStep(out)
        hit = self._find_stop()
        if hit is not None:
            pos, stop = hit
            end = pos + len(stop) if self._include_stop else pos
            out, self._held = self._held[:end], ""
            self._stopped = True
            return DetokenizedStep(out, stop_reason=stop)
        keep = self._stop_prefix_len()
        cut = len(self._held) - keep
        out, self._held = self._held[:cut], self._held[cut:]
        return DetokenizedStep(out)

    def flush(self) -> str:
        """Release held-back text when generation ends for a reason other than a stop string."""
        out, self._held = self._held, ""
        return "" if self._stopped else out

    def _find_stop(self) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self._stop:
            pos = self._held.find(stop)
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, stop)
        return best

    def _stop_prefix_len(self) -> int:
        """Length of the longest suffix of the held text that is a proper prefix of a stop."""
        longest = 0
        held = self._held
        for stop in self._stop:
            for k in range(min(len(stop) - 1, len(held)), longest, -1):
                if held.endswith(stop[:k]):
                    longest = k
                    break
        return longest


class TokenTexts:
    """Each token's text as logprobs report it: the token decoded alone, special tokens
    kept, a partial character as U+FFFD. That text depends on the id only, so it is decoded
    once per id and kept: one slot per vocabulary entry bounds the cache (~3 MB for a 49k
    vocabulary). `fill` runs off the event loop; reads are list lookups."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self._texts: list[str | None] = [None] * vocab_size

    def fill(self, token_ids: Iterable[int]) -> None:
        """Decode the ids not seen yet (about 1.6 µs each). Safe in a worker thread: a slot
        is written whole, and two threads decoding one id write the same text."""
        texts, decode, size = self._texts, self._tokenizer.decode, len(self._texts)
        for token_id in token_ids:
            if 0 <= token_id < size and texts[token_id] is None:
                texts[token_id] = decode([token_id], skip_special_tokens=False)

    def __getitem__(self, token_id: int) -> str:
        text = self._texts[token_id] if 0 <= token_id < len(self._texts) else None
        if text is None:  # not filled (or outside the vocabulary): decode now
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            if 0 <= token_id < len(self._texts):
                self._texts[token_id] = text
        return text
