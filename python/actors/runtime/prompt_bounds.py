"""How long a prompt's text may be before it is tokenized.

A text that cannot fit the context is refused by its length in characters, without
tokenizing it (a 4 MB prompt took seconds of the tokenizer thread only to be refused):

    characters (not counting ones the tokenizer drops) > max_model_len x L
        =>   tokens > max_model_len

where L is the longest entry of the tokenizer's vocabulary, added tokens included (vLLM's
rule, `max_chars_per_token`). Why no prompt that fits is refused:
- byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen) spells every vocabulary entry one character
  per byte, so a token covers at most L bytes of UTF-8 text, and every character with a
  byte the vocabulary has is covered by some token: c such characters need at least c / L
  tokens. A character none of whose bytes the vocabulary has produces no token at all
  (SmolLM2 drops six ASCII control characters, U+0004, U+0006, U+0013, U+0014, U+0016,
  U+001D), so those are not counted; they are found at startup by encoding every 1- and
  2-byte character, and the vocabulary is checked to hold every continuation byte (which
  every longer character contains, so none of those can vanish);
- SentencePiece vocabularies spell their pieces one character per character ("\u2581" for a
  space); a byte-fallback piece ("<0xE2>", 6 characters) covers a single byte, an unknown
  character becomes one <unk> token;
- an added or special token is one token for its whole text, which L includes.
If any non-ASCII character vanished, a longer one might too, and the bound is not applied.
A normalizer that deletes characters beyond U+07FF would also break it; the generative
models served here have none. SmolLM2's L is 81 (a newline and 80 spaces): 82,944
characters at max_model_len 1024 and 663,552 at its 8,192 positions, where English text is
about 4-5 characters a token. tests/test_server_limits.py checks chars <= tokens x L on
generated text.
"""

from __future__ import annotations

from typing import Any

_SCANNED = 0x800  # every 1- and 2-byte UTF-8 character
_CONTINUATION = range(0x80, 0xC0)


def _byte_symbols() -> dict[int, str]:
    """Byte-level BPE's spelling of each byte (GPT-2's table): printable Latin-1 bytes are
    themselves, the others the characters from U+0100 on, in byte order."""
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in kept]
    return {**{b: chr(b) for b in kept}, **{b: chr(0x100 + i) for i, b in enumerate(others)}}


class PromptCharBound:
    """The character bound of one tokenizer (a tokenizers.Tokenizer)."""

    def __init__(self, tokenizer: Any) -> None:
        from tokenizers.pre_tokenizers import ByteLevel

        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self.max_token_chars = max((len(t) for t in vocab), default=1)
        dropped = "".join(
            c for c in map(chr, range(_SCANNED))
            if not 0xD800 <= ord(c) <= 0xDFFF
            and not tokenizer.encode(c, add_special_tokens=False).ids
        )
        self.dropped = dropped  # characters that make no token
        self.applies = all(c.isascii() for c in dropped)
        if isinstance(tokenizer.pre_tokenizer, ByteLevel):
            symbols = _byte_symbols()
            self.applies &= all(symbols[b] in vocab for b in _CONTINUATION)

    def error(self, text: str, max_model_len: int) -> str | None:
        """The 400 message for a prompt text that cannot fit, else None; its first sentence
        is vLLM's (clients parse the context length out of it)."""
        bound = max_model_len * self.max_token_chars
        if not self.applies or len(text) <= bound:
            return None
        counted = len(text) - sum(text.count(c) for c in self.dropped)
        if counted <= bound:
            return None
        return (f"This model's maximum context length is {max_model_len} tokens. However, "
                f"your prompt contains {counted} characters, more than the {bound} characters "
                f"that {max_model_len} tokens can hold (at most {self.max_token_chars} "
                "characters each).")
