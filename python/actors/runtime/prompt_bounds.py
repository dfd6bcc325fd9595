"""How long a prompt's text may be before it is tokenized.

A text that cannot fit the context is refused by its length in characters, without
tokenizing it (a 4 MB prompt took seconds of the tokenizer thread only to be refused):

    characters > max_model_len x L   =>   tokens > max_model_len

where L is the longest entry of the tokenizer's vocabulary, added tokens included (vLLM's
rule, `max_chars_per_token`). Why no prompt that fits is refused:
- byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen) spells every vocabulary entry one character
  per byte, so a token covers exactly len(entry) <= L bytes of UTF-8 text; a character is at
  least one byte, so c characters need at least c / L tokens;
- SentencePiece vocabularies spell their pieces one character per character ("\u2581" for a
  space); a byte-fallback piece ("<0xE2>", 6 characters) covers a single byte;
- an added or special token is one token for its whole text, which L includes.
The bound would not hold for a normalizer that deletes characters (BERT's control-character
cleanup); the generative models served here have none. SmolLM2's L is 81 (a newline and 80
spaces): 82,944 characters at max_model_len 1024 and 663,552 at its 8,192 positions, where
English text is about 4-5 characters a token.
"""

from __future__ import annotations

from typing import Any


def longest_token_chars(tokenizer: Any) -> int:
    """L: the longest vocabulary entry of a tokenizers.Tokenizer, added tokens included."""
    return max((len(t) for t in tokenizer.get_vocab(with_added_tokens=True)), default=1)


def prompt_chars_error(chars: int, max_model_len: int, max_token_chars: int) -> str | None:
    """The 400 message for a prompt text of `chars` characters that cannot fit, else None;
    its first sentence is vLLM's (clients parse the context length out of it)."""
    bound = max_model_len * max_token_chars
    if chars <= bound:
        return None
    return (f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {chars} characters, more than the {bound} characters that "
            f"{max_model_len} tokens can hold (at most {max_token_chars} characters each).")
