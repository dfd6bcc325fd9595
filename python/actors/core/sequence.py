"""Sequence: one stream of tokens the scheduler drives to completion.

A request with ``n`` choices becomes ``n`` sequences sharing a request id (``index``
0..n-1). The token buffer and who owns which part of it::

    tokens:  [ prompt ............ | output ......... ]
              0                    num_prompt_tokens   num_tokens
    KV:      [ computed ............... )[ to compute )
              0          num_computed_tokens           num_tokens

    block_ids[i] holds tokens [i * block_size, (i + 1) * block_size);
    block_hashes[i] is the chained hash of block i once it is full and computed
    (prefix caching on), so len(block_hashes) <= num_computed_tokens // block_size.

A model with sliding-window layers has several KV cache groups (actors.core.kv_groups):
block_ids/block_hashes are group 0's, group_block_ids[g - 1]/group_block_hashes[g - 1]
group g's, laid out the same way; a sliding group's entries the window has left are
kv_manager.NULL_BLOCK (freed), always a prefix of its table.

Stop checks here are token-level only (EOS, stop_token_ids, max_tokens, the model's
context length, repetition_detection). Stop strings need text and belong to the
detokenizer.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import TYPE_CHECKING

from actors.params.kinds import Generate, Pool, RequestKind
from actors.params.pooling import PoolingSpec
from actors.params.repetition import REPETITION_STOP_REASON, repeats
from actors.params.sampling import SamplingParams

if TYPE_CHECKING:
    from actors.core.scheduler.beam_group import BeamGroup

__all__ = ["FinishReason", "Sequence", "SequenceStatus"]


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # never ran, or re-queued; holds no blocks
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again after its blocks were taken (recompute)
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS or a stop token id
    LENGTH = "length"  # max_tokens or the model's context length
    ABORT = "abort"
    ERROR = "error"  # the sampler refused the request's row (vLLM: always a 500)
    REPETITION = "repetition"  # repetition_detection matched the output's tail


class Sequence:
    __slots__ = (
        "seq_id",
        "request_id",
        "index",
        "prompt_token_ids",
        "output_token_ids",
        "params",
        "arrival_time",
        "priority",
        "status",
        "finish_reason",
        "stop_reason",
        "num_computed_tokens",
        "num_cached_tokens",
        "block_ids",
        "block_hashes",
        "group_block_ids",
        "group_block_hashes",
        "rng_seed",
        "num_preemptions",
        "eos_token_ids",
        "max_model_len",
        "max_output_tokens",
        "pending_children",
        "row_static",
        "prompt_logprobs",
        "kind",
        "lora_id",
        "suppress",
        "suppress_first",
        "beam",
    )

    def __init__(
        self,
        seq_id: int,
        request_id: str,
        prompt_token_ids: Iterable[int],
        params: SamplingParams,
        *,
        max_model_len: int,
        eos_token_ids: Iterable[int] = (),
        index: int = 0,
        arrival_time: float = 0.0,
        priority: int | None = None,
        rng_seed: int = 0,
        kind: RequestKind | None = None,
    ) -> None:
        """``kind``: the Admit's (None: Generate(params), a bare sequence of tests)."""
        self.seq_id = seq_id
        self.request_id = request_id
        self.index = index
        self.prompt_token_ids: tuple[int, ...] = tuple(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.params = params
        self.arrival_time = arrival_time
        self.priority = params.priority if priority is None else priority
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        # the stop token id that ended it, or "repetition_detected"; None otherwise
        self.stop_reason: int | str | None = None
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prefix-cache hit tokens at first admission
        self.block_ids: list[int] = []
        self.block_hashes: list[int] = []
        self.group_block_ids: list[list[int]] = []  # groups 1 .. G-1 (empty: none held)
        self.group_block_hashes: list[list[int]] = []
        self.rng_seed = rng_seed  # uint64 key of the sampler's counter-based draws
        self.num_preemptions = 0
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        budget = max_model_len - len(self.prompt_token_ids)
        self.max_output_tokens = budget if params.max_tokens is None else params.max_tokens
        self.pending_children = 0  # siblings (n > 1) forked once this one has a first token
        self.row_static: tuple | None = None  # cached per-request part of its sampling row
        # Prompt logprobs gathered so far (entries for prompt tokens 1, 2, ...) while they
        # are wanted and not yet delivered; None otherwise. Only choice 0 computes them.
        self.prompt_logprobs: list | None = (
            [] if params.prompt_logprobs is not None and index == 0 else None
        )
        self.kind: RequestKind = Generate(params) if kind is None else kind
        # The LoRA adapter it runs under (0: the base model), part of its blocks' keys.
        self.lora_id = self.kind.lora_id if isinstance(self.kind, Generate) else 0
        # The tokens its model family never draws (Whisper's suppress_tokens) and never
        # draws first (begin_suppress_tokens: a blank or the end at the start).
        self.suppress: tuple[int, ...] = ()
        self.suppress_first: tuple[int, ...] = ()
        # A beam of a beam-search request: its group (scheduler/beam_group.py), shared by
        # every beam of the request; None otherwise.
        self.beam: BeamGroup | None = None

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}#{self.index} id={self.seq_id} {self.status.name} "
            f"computed={self.num_computed_tokens}/{self.num_tokens} blocks={len(self.block_ids)})"
        )

    # ------------------------------------------------------------------ tokens

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Whether some prompt token still lacks its logprob (the sequence must then
        compute its prompt itself: no prefix-cache hit)."""
        pl = self.prompt_logprobs
        return pl is not None and len(pl) < len(self.prompt_token_ids) - 1

    @property
    def pooling(self) -> PoolingSpec | None:
        """A Pool kind's spec (it computes its prompt, yields one vector and finishes)."""
        return self.kind.spec if isinstance(self.kind, Pool) else None

    def needs_every_row(self, causal: bool) -> bool:
        """Whether every prompt row must be computed here (no prefix-cache hit): prompt
        logprobs, a MEAN or CLS pooling, or any pooling under bidirectional attention (a
        LAST pooling of a causal model needs only the last row, which is always computed)."""
        if self.wants_prompt_logprobs:
            return True
        p = self.pooling
        return p is not None and (not causal or p.pooling_type != "LAST")

    def token_slice(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output, without copying the whole buffer."""
        p = len(self.prompt_token_ids)
        if end <= p:
            return list(self.prompt_token_ids[start:end])
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        return list(self.prompt_token_ids[start:]) + self.output_token_ids[: end - p]

    def all_token_ids(self) -> list[int]:
        return list(self.prompt_token_ids) + self.output_token_ids

    # ------------------------------------------------------------------ stopping

    def suppressed_token_ids(self) -> tuple[int, ...]:
        """Tokens the sampler must not draw next: the stop tokens while min_tokens holds."""
        if self.num_output_tokens >= self.params.min_tokens:
            return ()
        eos = () if self.params.ignore_eos else tuple(sorted(self.eos_token_ids))
        return eos + tuple(t for t in self.params.stop_token_ids if t not in self.eos_token_ids)

    def append_token(self, token_id: int) -> bool:
        """Appends a sampled token and applies the stop checks; True if now finished.

        The first min_tokens outputs never stop on EOS or a stop token id (the sampler
        is asked to suppress them; this check holds them back if it did not). A stop
        token that also reaches max_tokens reports "stop", the more specific reason.
        """
        self.output_token_ids.append(token_id)
        if self.num_output_tokens > self.params.min_tokens:
            if token_id in self.params.stop_token_ids:
                self.finish(FinishReason.STOP, stop_reason=token_id)
                return True
            # a grammar's end allows only EOS: it ends the output even under ignore_eos
            if ((not self.params.ignore_eos or self.params.structured is not None)
                    and token_id in self.eos_token_ids):
                self.finish(FinishReason.STOP)
                return True
        n_out = self.num_output_tokens
        if n_out >= self.max_output_tokens or self.num_tokens >= self.max_model_len:
            self.finish(FinishReason.LENGTH)
            return True
        rule = self.params.repetition_detection
        if rule is not None and n_out >= self.params.min_tokens and repeats(
                self.output_token_ids, rule):
            self.finish(FinishReason.REPETITION, stop_reason=REPETITION_STOP_REASON)
            return True
        return False

    def finish(self, reason: FinishReason, *, stop_reason: int | str | None = None) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
