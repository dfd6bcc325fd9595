"""The one interface the engine drives constrained decoding through, and backend selection.

A ``GrammarBackend`` is built once per tokenizer (it owns the backend's view of the
vocabulary, which is the costly part) and compiles a ``StructuredSpec`` into a
``CompiledGrammar``: an immutable, shareable result that the cache keeps. Each sequence gets
its own ``Matcher`` from it, a cursor that fills the sampler's allowed-token bitmask row and
follows the tokens the sequence emits.

The bitmask layout is the compiled sampler's (``llmcore.sampling``): int32 words, bit
``t % 32`` of word ``t // 32`` set = token ``t`` allowed, ``ceil(vocab_size / 32)`` words a
row. Implementations: ``guidance`` (llguidance, always available) and ``xgrammar`` (when the
package is installed); ``auto`` picks guidance.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from actors.core.structured.spec import StructuredSpec

__all__ = ["BACKEND_NAMES", "CompiledGrammar", "GrammarBackend", "Matcher", "bitmask_words",
           "make_backend"]

BACKEND_NAMES = ("auto", "guidance", "xgrammar")


def bitmask_words(vocab_size: int) -> int:
    """Words in one bitmask row for a vocabulary of ``vocab_size`` tokens."""
    return (vocab_size + 31) // 32


class Matcher(ABC):
    """One sequence's position in a grammar. Not thread-safe; one owner at a time."""

    @abstractmethod
    def fill_bitmask(self, out_row: npt.NDArray[np.int32]) -> None:
        """Writes the tokens allowed next into ``out_row`` (contiguous int32,
        ``bitmask_words(vocab_size)`` words). Once terminated or in error, only the
        end-of-sequence tokens are allowed."""

    @abstractmethod
    def accept(self, token_id: int) -> bool:
        """Advances past ``token_id``; False (state unchanged) if the grammar forbids it."""

    @abstractmethod
    def rollback(self, k: int) -> None:
        """Undoes the last ``k`` accepted tokens (speculative tokens, preemption)."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """Whether an end-of-sequence token was accepted: the constrained output is done."""

    @abstractmethod
    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next, in order, when they are exactly the tokens the
        tokenizer would produce for the forced text (empty when unknown or not exact).
        The matcher does not advance; accept them to jump ahead."""

    def validate_tokens(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar would accept in turn (no state change)."""
        accepted = 0
        for t in tokens:
            if not self.accept(t):
                break
            accepted += 1
        if accepted:
            self.rollback(accepted)
        return accepted

    def error(self) -> str | None:
        """Why the matcher can no longer follow the grammar (a resource limit hit mid-way),
        or None. A matcher in error allows only end-of-sequence tokens."""
        return None

    def is_accepting(self) -> bool:
        """Whether the output so far is complete (ending it now satisfies the grammar)."""
        return self.is_terminated()


class CompiledGrammar(ABC):
    """A compiled spec for one tokenizer: immutable, shared by the cache across requests."""

    @abstractmethod
    def matcher(self) -> Matcher:
        """A fresh matcher at the start of the grammar."""


class GrammarBackend(ABC):
    """Compiles specs for one tokenizer and vocabulary size."""

    name: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]

    @property
    @abstractmethod
    def tokenizer_key(self) -> str:
        """Identity of the tokenizer the grammars are compiled for (part of cache keys)."""

    @abstractmethod
    def compile_grammar(self, spec: StructuredSpec) -> CompiledGrammar:
        """Validates and compiles ``spec``; raises ``RequestRefused`` naming the field.
        May take long for large specs: callers bound it (``cache.GrammarCache``)."""

    def compile(self, spec: StructuredSpec) -> Matcher:
        """A fresh matcher for ``spec`` (compiles every time; use the cache to reuse)."""
        return self.compile_grammar(spec).matcher()

    def allocate_bitmask(self, rows: int) -> npt.NDArray[np.int32]:
        """A zeroed ``[rows, words]`` int32 bitmask for ``fill_bitmask`` rows."""
        return np.zeros((rows, bitmask_words(self.vocab_size)), np.int32)


def make_backend(name: str, tokenizer: Any, vocab_size: int | None = None,
                 eos_token_ids: Sequence[int] | None = None, **options: Any) -> GrammarBackend:
    """The backend called ``name`` (auto | guidance | xgrammar) for a Hugging Face fast
    tokenizer; ``vocab_size`` is the width of the model's logits (defaults to the
    tokenizer's size) and ``eos_token_ids`` the tokens that end a sequence (defaults to the
    tokenizer's EOS)."""
    if name in ("auto", "guidance"):
        from actors.core.structured.guidance import GuidanceBackend

        return GuidanceBackend(tokenizer, vocab_size, eos_token_ids, **options)
    if name == "xgrammar":
        try:
            from actors.core.structured.xgrammar_backend import XGrammarBackend
        except ImportError as e:
            raise ValueError(f"structured output backend 'xgrammar' needs the xgrammar "
                             f"package ({e})") from None
        return XGrammarBackend(tokenizer, vocab_size, eos_token_ids, **options)
    raise ValueError(f"unknown structured output backend {name!r}; choose one of "
                     f"{', '.join(BACKEND_NAMES)}")


def check_row(out_row: npt.NDArray[np.int32], words: int) -> None:
    """Refuses a bitmask row the backends cannot write into in place."""
    if (not isinstance(out_row, np.ndarray) or out_row.dtype != np.int32
            or out_row.shape != (words,) or not out_row.flags["C_CONTIGUOUS"]
            or not out_row.flags["WRITEABLE"]):
        raise ValueError(f"the bitmask row must be a writeable contiguous int32 array of "
                         f"{words} words")
