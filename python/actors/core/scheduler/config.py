"""SchedulerConfig (the knobs) and SchedulerStats (what metrics read)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SchedulerConfig", "SchedulerStats"]


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 128  # running sequences per step
    max_num_batched_tokens: int = 2048  # tokens computed per step (the token budget)
    max_model_len: int = 4096  # prompt + output tokens of one sequence
    policy: str = "fcfs"  # "fcfs" or "priority" (lower value first, then arrival)
    enable_prefix_caching: bool = True
    eos_token_ids: tuple[int, ...] = ()
    seed: int | None = None  # seeds the draw of sampling seeds for unseeded requests
    # False for an encoder (bidirectional attention): a prompt runs whole in one step,
    # from position 0, and only pooling requests are served.
    causal: bool = True
    # An encoder-decoder model (Whisper): every request carries an EncoderInput and only
    # such requests are served; the model's banned tokens go on each of their rows.
    encoder_decoder: bool = False
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.policy not in ("fcfs", "priority"):
            raise ValueError(f"policy must be 'fcfs' or 'priority', got {self.policy!r}")
        if not self.causal and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"an encoder runs each prompt in one step: max_num_batched_tokens "
                f"({self.max_num_batched_tokens}) must be >= max_model_len ({self.max_model_len})"
            )
        if not isinstance(self.eos_token_ids, tuple):
            object.__setattr__(self, "eos_token_ids", tuple(self.eos_token_ids))


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    num_running: int
    num_waiting: int
    num_preemptions: int  # cumulative
    kv_usage: float  # fraction of blocks in use
    prefix_queried_tokens: int  # cumulative, at admissions
    prefix_hit_tokens: int  # cumulative, at admissions
    num_steps: int
