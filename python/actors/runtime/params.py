"""Resolved generation parameters of one request, before they become engine SamplingParams."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class GenerationParams:
    """Validated, default-resolved parameters. `max_tokens` None = fill the context."""

    n: int = 1
    max_tokens: int | None = None
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    priority: int = 0

    def for_child(self, i: int, max_tokens: int) -> GenerationParams:
        """The parameters of the i-th of n fanned-out sequences (seed + i when seeded)."""
        seed = None if self.seed is None else self.seed + i
        return dataclasses.replace(self, n=1, seed=seed, max_tokens=max_tokens)

    def to_engine(self) -> Any:
        """Build the engine's SamplingParams, passing the fields it declares."""
        from actors.sampling_params import SamplingParams  # heavy side imported lazily

        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        declared = {f.name for f in dataclasses.fields(SamplingParams)}
        return SamplingParams(**{k: v for k, v in values.items() if k in declared})
