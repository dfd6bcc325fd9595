"""PromptEmbeds: a prompt given as embedding rows instead of token ids (vLLM's
``prompt_embeds``, served with ``--enable-prompt-embeds``).

A generation whose prompt is embeddings carries them on its ``Generate`` kind, beside a
prompt of as many placeholder token ids (0, as vLLM's), which is what the scheduler, the
KV manager and the sampler count positions by. The runner feeds row p of ``data`` to the
first layer for prompt position p instead of the embedding of the placeholder id, so the
placeholder never reaches the model; the sampler's repetition penalty does not see it either
(there is no prompt token to penalize). Row p is what the model's token embedding gives
for a token at that position, the family's embedding scale included (Gemma's sqrt(hidden)),
as vLLM's ``embed_input_ids``.

Plain data like EncoderInput: it crosses the front end -> core boundary (and the process
boundary, pickled: one copy of the rows, float32) unchanged. ``digest`` (BLAKE2b of the
rows' bytes) is what the prefix cache keys the sequence's chain by, since its placeholder
ids say nothing of its content: two prompts share cached blocks only when their
embeddings are equal to the bit (and never with a token prompt).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

__all__ = ["PLACEHOLDER_TOKEN_ID", "PromptEmbeds"]

PLACEHOLDER_TOKEN_ID = 0  # the prompt's token id at every embedded position (vLLM's)


@dataclass(frozen=True, slots=True, eq=False)
class PromptEmbeds:
    """``data``: float32 [rows, hidden_size], C-contiguous, finite (``of`` checks it).
    Compared by identity."""

    data: np.ndarray
    digest: bytes

    @classmethod
    def of(cls, rows: np.ndarray) -> PromptEmbeds:
        """The rows as float32, with their digest; ValueError for anything else than a
        non-empty 2-D array of finite values."""
        data = np.ascontiguousarray(rows, dtype=np.float32)
        if data.ndim != 2 or not data.shape[0] or not data.shape[1]:
            raise ValueError(f"prompt embeddings must be a non-empty 2-D array, got shape "
                             f"{tuple(data.shape)}")
        if not np.isfinite(data).all():
            raise ValueError("prompt embeddings hold NaN or infinity")
        return cls(data, hashlib.blake2b(data.tobytes(), digest_size=16).digest())

    @property
    def num_rows(self) -> int:
        return int(self.data.shape[0])

    @property
    def width(self) -> int:
        return int(self.data.shape[1])

    def placeholder_ids(self) -> list[int]:
        return [PLACEHOLDER_TOKEN_ID] * self.num_rows

    def kept(self, rows: int, side: str | None) -> PromptEmbeds:
        """The rows a truncation to ``rows`` keeps: the last ones, or the first ones for
        ``side`` "right" (SamplingParams.truncate_prompt's rule); itself if none is cut."""
        if rows >= self.num_rows:
            return self
        data = self.data[:rows] if side == "right" else self.data[self.num_rows - rows:]
        return PromptEmbeds.of(data)

    def check(self, width: int, num_tokens: int) -> None:
        """Raises ValueError unless these rows fit a model taking ``width``-wide embeddings
        and a prompt of ``num_tokens`` positions (the core's own check of an Admit)."""
        d = self.data
        if not isinstance(d, np.ndarray) or d.dtype != np.float32 or d.ndim != 2:
            raise ValueError("prompt embeddings must be a float32 2-D numpy array")
        if d.shape[1] != width:
            raise ValueError(f"prompt embeddings are {d.shape[1]} wide; the model takes "
                             f"{width}")
        if d.shape[0] != num_tokens:
            raise ValueError(f"{d.shape[0]} prompt embedding rows for a prompt of "
                             f"{num_tokens} positions")
