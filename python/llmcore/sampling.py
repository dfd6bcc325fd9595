"""Token sampling: the compiled sampler and a builder for its columnar arguments.

``sample(logits, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
frequency_penalty, seed, position, *, prompt_tokens, output_tokens, logit_bias, banned_tokens,
allowed_bitmask, use_bitmask, num_top_logprobs, logprobs_mode, logprob_token_ids, stream)``
samples one token per row of ``logits`` ([num_rows, vocab], float32 or bfloat16, any object
with ``__dlpack__``; borrowed, never modified). Per-row parameters are 1-D arrays of length
num_rows (a scalar is broadcast to every row); token lists are CSR pairs
``(offsets, tokens)`` with ``offsets[num_rows + 1]``; ``logit_bias`` is
``(offsets, tokens, values)``; ``allowed_bitmask`` is int32 ``[num_rows, words]`` (bit
``t % 32`` of word ``t // 32`` set = token ``t`` allowed), applied to the rows where
``use_bitmask`` is set (every row when it is None).

It returns the tuple ``(tokens, logprobs, ranks, top_tokens, top_logprobs,
listed_logprobs)``:

- ``tokens`` int32 [B]: ``NO_TOKEN`` (-1) when every token of the row was masked;
- ``logprobs`` float32 [B]: logprob of the sampled token (-inf for ``NO_TOKEN``);
- ``ranks`` int32 [B]: 1 + number of tokens with a strictly higher logprob (0 for ``NO_TOKEN``);
- ``top_tokens`` int32 / ``top_logprobs`` float32 [B, num_top_logprobs]: best first, ties by
  lower id; slots past the tokens with a finite logprob hold ``NO_TOKEN`` / -inf;
- ``listed_logprobs`` float32 [L]: with ``logprob_token_ids=(offsets, ids)`` (CSR, any ids
  per row, repeats allowed), the logprob of each listed id in list order (L = number of
  ids listed; empty without it), from the same distribution as the top entries.

``logprobs_mode="raw"`` reports the model's distribution (log_softmax of the logits as given);
``"processed"`` reports log_softmax after bias, bans, bitmask, penalties and temperature (greedy
rows: temperature 1), before min-p / top-k / top-p.

Draws are exact samples of the processed, filtered distribution and depend only on
(seed, position) and the row itself: never on the batch around it (``rng_uniform`` exposes the
generator).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from llmcore._C import NO_TOKEN, rng_uniform, sample

__all__ = [
    "NO_TOKEN",
    "SampleResult",
    "SamplingBatch",
    "bitmask_from_tokens",
    "rng_uniform",
    "sample",
]


class SampleResult(NamedTuple):
    """What ``SamplingBatch.sample`` returns (the tuple of ``sample``, named)."""

    tokens: npt.NDArray[np.int32]
    logprobs: npt.NDArray[np.float32]
    ranks: npt.NDArray[np.int32]
    top_tokens: npt.NDArray[np.int32]
    top_logprobs: npt.NDArray[np.float32]
    listed_logprobs: npt.NDArray[np.float32]


def bitmask_from_tokens(tokens: Iterable[int], vocab_size: int) -> npt.NDArray[np.int32]:
    """The int32 bitmask words (ceil(vocab / 32) of them) allowing exactly ``tokens``."""
    ids = np.asarray(tokens if isinstance(tokens, np.ndarray) else list(tokens), np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"allowed token ids must be in [0, {vocab_size})")
    words = np.zeros((vocab_size + 31) // 32, np.uint32)
    np.bitwise_or.at(words, ids // 32, (np.uint32(1) << (ids % 32).astype(np.uint32)))
    return words.view(np.int32)


def _csr(lists: list[npt.NDArray[np.int32]]) -> tuple[npt.NDArray[np.int32], ...] | None:
    if not any(len(x) for x in lists):
        return None
    offsets = np.zeros(len(lists) + 1, np.int32)
    np.cumsum([len(x) for x in lists], out=offsets[1:])
    return offsets, np.concatenate(lists).astype(np.int32, copy=False)


class SamplingBatch:
    """Collects per-row sampling parameters and turns them into ``sample``'s arrays.

    Rows are added in the order of the logits' rows::

        batch = SamplingBatch()
        batch.add(temperature=0.7, top_p=0.9, seed=42, position=3, output_tokens=[5, 9])
        batch.add(temperature=0.0)                       # greedy
        result = batch.sample(logits, num_top_logprobs=5)
    """

    _FLOATS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
               "frequency_penalty")

    def __init__(self) -> None:
        self._cols: dict[str, list[Any]] = {
            name: [] for name in (*self._FLOATS, "top_k", "seed", "position")
        }
        self._prompt: list[npt.NDArray[np.int32]] = []
        self._output: list[npt.NDArray[np.int32]] = []
        self._banned: list[npt.NDArray[np.int32]] = []
        self._bias_tokens: list[npt.NDArray[np.int32]] = []
        self._bias_values: list[npt.NDArray[np.float32]] = []
        # per row: None, ("tokens", ids) or ("bitmask", words)
        self._allowed: list[tuple[str, npt.NDArray[Any]] | None] = []

    def __len__(self) -> int:
        return len(self._prompt)

    def add(
        self,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        seed: int = 0,
        position: int = 0,
        prompt_tokens: Iterable[int] = (),
        output_tokens: Iterable[int] = (),
        logit_bias: Mapping[int, float] | None = None,
        banned_tokens: Iterable[int] = (),
        allowed_tokens: Iterable[int] | None = None,
        allowed_bitmask: npt.NDArray[np.int32] | None = None,
    ) -> int:
        """Appends one row and returns its index.

        ``allowed_tokens`` (ids) or ``allowed_bitmask`` (ready words, e.g. from a grammar
        engine) restrict the row to those tokens; give at most one.
        """
        if allowed_tokens is not None and allowed_bitmask is not None:
            raise ValueError("give allowed_tokens or allowed_bitmask, not both")
        values = (temperature, top_p, min_p, repetition_penalty, presence_penalty,
                  frequency_penalty)
        for name, value in zip(self._FLOATS, values):
            self._cols[name].append(value)
        self._cols["top_k"].append(top_k)
        self._cols["seed"].append(seed)
        self._cols["position"].append(position)
        self._prompt.append(np.asarray(list(prompt_tokens), np.int32))
        self._output.append(np.asarray(list(output_tokens), np.int32))
        self._banned.append(np.asarray(list(banned_tokens), np.int32))
        bias = dict(logit_bias or {})
        self._bias_tokens.append(np.fromiter(bias.keys(), np.int32, len(bias)))
        self._bias_values.append(np.fromiter(bias.values(), np.float32, len(bias)))
        if allowed_bitmask is not None:
            self._allowed.append(("bitmask", np.asarray(allowed_bitmask).view(np.int32)))
        elif allowed_tokens is not None:
            self._allowed.append(("tokens", np.asarray(list(allowed_tokens), np.int64)))
        else:
            self._allowed.append(None)
        return len(self) - 1

    def arrays(self, vocab_size: int) -> dict[str, Any]:
        """Keyword arguments for ``sample`` (all but ``logits``)."""
        n = len(self)
        out: dict[str, Any] = {name: np.asarray(self._cols[name], np.float32)
                               for name in self._FLOATS}
        out["top_k"] = np.asarray(self._cols["top_k"], np.int32)
        out["seed"] = np.asarray(self._cols["seed"], np.uint64)
        out["position"] = np.asarray(self._cols["position"], np.int64)
        out["prompt_tokens"] = _csr(self._prompt)
        out["output_tokens"] = _csr(self._output)
        out["banned_tokens"] = _csr(self._banned)
        bias = _csr(self._bias_tokens)
        out["logit_bias"] = None if bias is None else (*bias, np.concatenate(self._bias_values))
        if any(a is not None for a in self._allowed):
            words = (vocab_size + 31) // 32
            mask = np.zeros((n, words), np.int32)
            use = np.zeros(n, np.int32)
            for row, allowed in enumerate(self._allowed):
                if allowed is None:
                    continue
                kind, values = allowed
                if kind == "bitmask":
                    if values.shape != (words,):
                        raise ValueError(f"row {row}: allowed_bitmask must have {words} words")
                    mask[row] = values
                else:
                    mask[row] = bitmask_from_tokens(values, vocab_size)
                use[row] = 1
            out["allowed_bitmask"], out["use_bitmask"] = mask, use
        return out

    def sample(
        self,
        logits: Any,
        *,
        num_top_logprobs: int = 0,
        logprobs_mode: str = "raw",
        logprob_token_ids: Iterable[Iterable[int]] | None = None,
        stream: int = 0,
    ) -> SampleResult:
        """Samples one token per row of ``logits`` ([len(self), vocab]).
        ``logprob_token_ids``: per row, the ids whose logprobs ``listed_logprobs`` reports."""
        vocab_size = int(logits.shape[-1])
        listed = None
        if logprob_token_ids is not None:
            rows = [np.asarray(list(ids), np.int32) for ids in logprob_token_ids]
            listed = _csr(rows)
        return SampleResult(*sample(logits, **self.arrays(vocab_size),
                                    num_top_logprobs=num_top_logprobs,
                                    logprobs_mode=logprobs_mode, logprob_token_ids=listed,
                                    stream=stream))
