"""SamplingParams: how one request wants its tokens drawn and when it stops.

Fields and defaults follow vLLM's ``SamplingParams`` where a field exists there. The
object is frozen: the scheduler shares one instance between the ``n`` sequences of a
request, and the engine may receive it in another process.

``validate(limits)`` is the one function that judges a request's fields: the server
calls it before tokenizing, the offline LLM before queueing, and the engine core trusts
what either admits. It raises ``SamplingParamsError`` (a ``RequestRefused``, so a
``ValueError``) whose ``param`` names the offending field, so the HTTP edge can answer 400
with ``param`` set. The limits are those of docs "Request-parameter limits" (vLLM's
ranges, tightened where vLLM is loose: ``n`` <= 16, ``repetition_penalty`` <= 2, stop
strings <= 4 x 256 chars, <= 256 stop token ids) and the engine's own (RequestLimits:
vocabulary, context length, max_logprobs, scheduling policy, running seats).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from actors.params.beam import beam_error
from actors.params.cache_salt import cache_salt_error
from actors.params.field_checks import (
    FLOAT32_MIN_NORMAL,
    INT32_MAX,
    SamplingParamsError,
    int_in,
    is_int,
    is_real,
    logprobs_in,
    real_in,
    token_id_in,
)
from actors.params.limits import RequestLimits
from actors.params.reasoning import ReasoningGate, gate_error
from actors.params.repetition import RepetitionDetection, repetition_problem
from actors.params.structured import StructuredSpec

__all__ = ["FLOAT32_MIN_NORMAL", "GREEDY_EPS", "INT32_MAX", "RequestLimits", "SamplingParams",
           "SamplingParamsError", "cache_salt_error"]

# temperature below this is greedy (argmax); vLLM's _SAMPLING_EPS.
GREEDY_EPS = 1e-5
# (0, MIN_TEMPERATURE) is clamped up: tiny temperatures overflow exp() in fp32 logits.
MIN_TEMPERATURE = 0.01

MAX_STOP_STRINGS = 4  # vLLM's VLLM_MAX_STOP_STRINGS default, offline too here
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 256
MAX_LOGIT_BIAS_ENTRIES = 1024
MAX_LOGPROB_TOKEN_IDS = 128  # vLLM's bound on logprob_token_ids
LOGIT_BIAS_LIMIT = 100.0
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class SamplingParams:
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None  # -1 is normalised to None
    stop: tuple[str, ...] = ()  # matched by the detokenizer, not the scheduler
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None: until the model's context is full
    min_tokens: int = 0
    logprobs: int | None = None  # top logprobs per output token; None: none
    # The ids whose logprobs each output token reports instead of the top ones (vLLM's
    # logprob_token_ids; the sampled token's own logprob comes too). None: the top ones.
    logprob_token_ids: tuple[int, ...] | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: tuple[int, ...] | None = None
    # Applied to the prompt's token ids by the tokenizer: keep this many (-1: as many as the
    # context holds with one position left to generate), from the end ("left" drops the
    # start) or from the start ("right"). None: no truncation.
    truncate_prompt_tokens: int | None = None
    truncation_side: str = "left"
    priority: int = 0  # lower is served first under the priority policy
    # Prefix-cache namespace: requests share cached KV blocks only with requests of the same
    # salt (None: the shared default namespace). Mixed into the first block's hash.
    cache_salt: str | None = None
    # The output constraint (JSON schema, regex, choice, grammar, ...): plain data, so it
    # crosses the engine-process boundary; the core builds each choice's matcher from it.
    structured: StructuredSpec | None = None
    # The reasoning the engine follows (the server's --reasoning-parser; params/reasoning.py)
    reasoning_gate: ReasoningGate | None = None
    # The LoRA adapter the request runs under (the core's id; 0: the base model), set by
    # the server from the request's ``model``; the engine puts it on the Admit.
    lora_id: int = 0
    use_beam_search: bool = False  # n beams (actors.params.beam, core/scheduler/beam_*)
    length_penalty: float = 1.0
    # End a choice whose output tail repeats a pattern (actors.params.repetition); None: off.
    repetition_detection: RepetitionDetection | None = None
    # A stream's output goes out in deltas of at least this many tokens (its first and last
    # at once); read by the tokenizer actor. None or 1: every step's tokens as they come.
    stream_interval: int | None = None

    def __post_init__(self) -> None:
        # Shape normalisation only: nothing here can fail; validate() judges values.
        set_ = object.__setattr__
        if isinstance(self.stop, str):
            set_(self, "stop", (self.stop,))
        elif self.stop is None:
            set_(self, "stop", ())
        elif not isinstance(self.stop, tuple):
            set_(self, "stop", tuple(self.stop))
        if self.stop_token_ids is None:
            set_(self, "stop_token_ids", ())
        elif not isinstance(self.stop_token_ids, tuple):
            set_(self, "stop_token_ids", tuple(self.stop_token_ids))
        if self.allowed_token_ids is not None and not isinstance(self.allowed_token_ids, tuple):
            set_(self, "allowed_token_ids", tuple(self.allowed_token_ids))
        if self.logprob_token_ids is not None and not isinstance(self.logprob_token_ids,
                                                                 tuple):
            set_(self, "logprob_token_ids", tuple(self.logprob_token_ids))
        if self.seed == -1:
            set_(self, "seed", None)

    # ------------------------------------------------------------------ derived values

    @property
    def wants_logprobs(self) -> bool:
        """Whether each output token carries logprobs (top ones or listed ids)."""
        return self.logprobs is not None or self.logprob_token_ids is not None

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def effective_temperature(self) -> float:
        """0.0 for greedy; otherwise the temperature clamped up to MIN_TEMPERATURE."""
        if self.is_greedy:
            return 0.0
        return max(float(self.temperature), MIN_TEMPERATURE)

    @property
    def effective_top_k(self) -> int:
        return 0 if self.is_greedy or self.top_k <= 0 else int(self.top_k)

    @property
    def effective_top_p(self) -> float:
        return 1.0 if self.is_greedy else float(self.top_p)

    @property
    def effective_min_p(self) -> float:
        return 0.0 if self.is_greedy else float(self.min_p)

    def logit_bias_items(self) -> tuple[tuple[int, float], ...]:
        """(token id, bias) pairs, keys as ints, values clamped to [-100, 100]."""
        if not self.logit_bias:
            return ()
        lim = LOGIT_BIAS_LIMIT
        items = {int(k): min(max(float(v), -lim), lim) for k, v in self.logit_bias.items()}
        return tuple(sorted(items.items()))

    def truncate_prompt(self, ids: list[int], max_model_len: int) -> list[int]:
        """The prompt after truncate_prompt_tokens (-1: as much as the context holds with one
        position left to generate), keeping its end ("left") or its start ("right");
        `ids` itself when nothing is cut. Applying it twice changes nothing."""
        keep = self.truncate_prompt_tokens
        if keep is None:
            return ids
        if keep == -1:
            keep = max_model_len - 1
        if len(ids) <= keep:
            return ids
        return ids[:keep] if self.truncation_side == "right" else ids[len(ids) - keep:]

    # ------------------------------------------------------------------ validation

    def validate(self, limits: RequestLimits) -> None:
        """Raises SamplingParamsError for the first out-of-range field.

        Every value is judged as the core will hold it (float32 reals, int32 top_k), so a
        request that passes cannot make the sampler refuse its row. ``max_logprobs`` is
        vLLM's limit on logprobs and prompt_logprobs (-1: the vocabulary, which is also
        what a request's -1 asks for); the core's sampler returns any count up to the
        vocabulary, so nothing else bounds them. What depends on the prompt's length is
        actors.params.prompt.check_prompt's.
        """
        vocab_size = limits.vocab_size
        int_in(self.n, "n", 1, limits.max_n)
        if limits.max_num_seqs is not None and self.n > limits.max_num_seqs:
            raise SamplingParamsError(
                f"n={self.n} exceeds max_num_seqs={limits.max_num_seqs}", "n")
        if self.use_beam_search and (beam := beam_error(self)) is not None:
            raise SamplingParamsError(*beam)
        if (self.n > 1 and not self.use_beam_search and is_real(self.temperature)
                and self.temperature < GREEDY_EPS):
            raise SamplingParamsError("n must be 1 when using greedy sampling", "n")
        real_in(self.temperature, "temperature", 0.0, 2.0)
        real_in(self.top_p, "top_p", 0.0, 1.0, low_open=True)
        int_in(self.top_k, "top_k", -1, None)
        if self.top_k > INT32_MAX:
            raise SamplingParamsError(
                f"top_k must be at most {INT32_MAX} (the sampler's int32), got {self.top_k}",
                "top_k",
            )
        real_in(self.min_p, "min_p", 0.0, 1.0)
        real_in(self.presence_penalty, "presence_penalty", -2.0, 2.0)
        real_in(self.frequency_penalty, "frequency_penalty", -2.0, 2.0)
        real_in(self.repetition_penalty, "repetition_penalty", 0.0, 2.0, low_open=True)
        if self.seed is not None:
            int_in(self.seed, "seed", INT64_MIN, INT64_MAX)
        int_in(self.priority, "priority", INT64_MIN, INT64_MAX)
        if self.priority != 0 and limits.scheduling_policy != "priority":
            raise SamplingParamsError(  # vLLM's message
                f"Got priority {self.priority} but Priority scheduling is not enabled.",
                "priority")
        message = cache_salt_error(self.cache_salt)
        if message is not None:
            raise SamplingParamsError(message, "cache_salt")
        if self.max_tokens is not None:
            int_in(self.max_tokens, "max_tokens", 1, None)
        int_in(self.min_tokens, "min_tokens", 0, self.max_tokens)
        self._validate_stop(vocab_size)
        logprobs_in(self.logprobs, "logprobs", vocab_size, limits.max_logprobs)
        logprobs_in(self.prompt_logprobs, "prompt_logprobs", vocab_size, limits.max_logprobs)
        self._validate_logprob_token_ids(vocab_size)
        self._validate_logit_bias(vocab_size)
        if self.allowed_token_ids is not None:
            if len(self.allowed_token_ids) == 0:
                raise SamplingParamsError(
                    "allowed_token_ids must not be empty", "allowed_token_ids"
                )
            if len(self.allowed_token_ids) > vocab_size:
                raise SamplingParamsError("allowed_token_ids is longer than the vocabulary",
                                          "allowed_token_ids")
            for t in self.allowed_token_ids:
                token_id_in(t, "allowed_token_ids", vocab_size)
        if self.truncate_prompt_tokens is not None:
            int_in(self.truncate_prompt_tokens, "truncate_prompt_tokens", -1, INT64_MAX)
            if self.truncate_prompt_tokens == 0:
                raise SamplingParamsError("truncate_prompt_tokens must be -1 or at least 1",
                                          "truncate_prompt_tokens")
        if self.truncation_side not in ("left", "right"):
            raise SamplingParamsError(
                "truncation_side must be 'left' or 'right'", "truncation_side"
            )
        if self.stream_interval is not None:
            if not is_int(self.stream_interval) or self.stream_interval < 1:
                raise SamplingParamsError(  # vLLM's message
                    f"stream_interval must be at least 1, got {self.stream_interval}.",
                    "stream_interval")
        found = repetition_problem(self.repetition_detection)
        if found is not None:
            raise SamplingParamsError(*found)
        if self.structured is not None:
            if not isinstance(self.structured, StructuredSpec):
                raise SamplingParamsError("structured must be a StructuredSpec",
                                          "structured_outputs")
            # the backend-free checks only: compiling (and the slow metaschema walk) is the
            # grammar cache's, off the caller's thread
            self.structured.validate(grammar_check=False, metaschema=False)
        message = gate_error(self.reasoning_gate, vocab_size)
        if message is not None:
            raise SamplingParamsError(message, "thinking_token_budget")
        if limits.max_model_len is not None:
            self._validate_context(limits.max_model_len)

    def _validate_context(self, length: int) -> None:
        """What the context length rules out whatever the prompt."""
        if self.max_tokens is not None and self.max_tokens > length:
            raise SamplingParamsError(
                f"max_tokens={self.max_tokens} cannot be greater than max_model_len={length}",
                "max_tokens",
            )
        # A prompt takes at least one position, so min_tokens >= max_model_len can never be
        # met (with max_tokens None the cap is only known with the prompt: check_prompt).
        if self.min_tokens > length - 1:
            raise SamplingParamsError(
                f"min_tokens ({self.min_tokens}) must be less than max_model_len ({length})",
                "min_tokens",
            )
        truncate = self.truncate_prompt_tokens
        if truncate is not None and truncate > length:
            raise SamplingParamsError(
                f"truncate_prompt_tokens ({truncate}) is greater than max_model_len "
                f"({length})", "truncate_prompt_tokens",
            )

    def _validate_stop(self, vocab_size: int) -> None:
        if len(self.stop) > MAX_STOP_STRINGS:
            raise SamplingParamsError(
                f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(self.stop)}",
                "stop",
            )
        for s in self.stop:
            if not isinstance(s, str):
                raise SamplingParamsError("stop must be a string or a list of strings", "stop")
            if not s:
                raise SamplingParamsError("stop strings must not be empty", "stop")
            if len(s) > MAX_STOP_STRING_CHARS:
                raise SamplingParamsError(
                    f"a stop string may have at most {MAX_STOP_STRING_CHARS} characters", "stop"
                )
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise SamplingParamsError(
                f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids are allowed", "stop_token_ids"
            )
        for t in self.stop_token_ids:
            token_id_in(t, "stop_token_ids", vocab_size)

    def _validate_logprob_token_ids(self, vocab_size: int) -> None:
        """vLLM's rules and messages."""
        ids = self.logprob_token_ids
        if ids is None:
            return
        name = "logprob_token_ids"
        if len(ids) > MAX_LOGPROB_TOKEN_IDS:
            raise SamplingParamsError(
                f"Requested {name} of length {len(ids)}, which is greater than max allowed: "
                f"{MAX_LOGPROB_TOKEN_IDS}", name)
        for t in ids:
            if not is_int(t):
                raise SamplingParamsError(f"{name} must hold integer token ids, got {t!r}",
                                          name)
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise SamplingParamsError(
                f"token_id(s) {bad} in {name} contain out-of-vocab token ids. Vocabulary "
                f"size: {vocab_size}", name)
        if self.logprobs is not None and self.logprobs != len(ids):
            raise SamplingParamsError(
                f"When both logprobs and {name} are set, logprobs must equal len({name}). "
                f"Got logprobs={self.logprobs}, len({name})={len(ids)}.", name)

    def _validate_logit_bias(self, vocab_size: int) -> None:
        if not self.logit_bias:
            return
        if len(self.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
            raise SamplingParamsError(
                f"logit_bias may have at most {MAX_LOGIT_BIAS_ENTRIES} entries", "logit_bias"
            )
        bad = []
        for key, value in self.logit_bias.items():
            try:
                token = int(key)
            except (TypeError, ValueError):
                bad.append(key)
                continue
            if isinstance(key, float) and key != token:
                bad.append(key)
                continue
            if not 0 <= token < vocab_size:
                raise SamplingParamsError(
                    f"token_id {token} in logit_bias is out of vocabulary "
                    f"(vocab size {vocab_size})",
                    "logit_bias",
                )
            if not is_real(value) or not math.isfinite(value):
                raise SamplingParamsError(
                    f"logit_bias values must be finite numbers, got {value!r}", "logit_bias"
                )
        if bad:
            raise SamplingParamsError(
                f"logit_bias keys must be token ids (integers); invalid keys: {bad}", "logit_bias"
            )
