"""Every message that crosses a boundary inside the engine side, typed and frozen.

Two boundaries, both of plain data (ids, numbers, tuples, frozen params), so either side
can move to another process unchanged (``actors.core.process`` proves the first):

    front end (actors.runtime, actors.llm)          engine core (actors.core)
        Admit / Abort / Control    ------------->   EngineCore.add / abort / control
        TokenBatch, EngineStats,   <-------------   EngineCore.step / stats
        ControlResult
        PrepareGrammar             ------------->   EngineCore.prepare_grammar (any time)
        GrammarVerdict             <-------------

    Scheduler --StepPlan--> ModelRunner --StepResult--> Scheduler   (inside the core)

The front end sends one ``Admit`` per prompt with ``params.n`` choices: the core runs the
prompt once and forks the other n - 1 choices from it after its first token, sharing the
prompt's KV blocks. ``RequestOutput.index`` names the choice (0 .. n - 1). ``Abort`` with
an index ends one choice (a stop string matched by the detokenizer), without one the
whole request.

Step protocol: ``schedule()`` and ``update()`` alternate strictly; every non-empty
StepPlan is answered by exactly one StepResult with the same step_id before the next
plan. The runner applies ``released_seq_ids`` first, then ``new_seqs``, then runs. An
empty plan never reaches the runner, so what it would release waits for the next plan.

Per-sequence state on the runner side. A sequence is keyed by ``seq_id`` (unique
for the scheduler's lifetime). The plan sends full data once (``NewSeq``: prompt,
outputs so far, static sampling lists) when a sequence is (re)admitted and only the
new tokens afterwards; ``released_seq_ids`` says when to drop it. The penalty context
of a sampling row (prompt and output tokens) is therefore::

    prompt  = NewSeq.prompt_token_ids
    outputs = NewSeq.output_token_ids + every token the runner sampled for it since

since the scheduler appends every sampled token it gets back (a sequence aborted
meanwhile is released instead).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from actors.params.kinds import Generate, Pool, RequestKind, Transcribe
from actors.params.reasoning import ReasoningGate
from actors.params.structured import StructuredSpec

__all__ = [
    "Abort",
    "Admit",
    "Control",
    "ControlResult",
    "EngineInfo",
    "EngineStats",
    "Generate",
    "GrammarVerdict",
    "SeqRef",
    "Logprobs",
    "NewSeq",
    "Pool",
    "PooledOutput",
    "PrepareGrammar",
    "PromptLogprobs",
    "RequestOutput",
    "SampledToken",
    "SamplingRow",
    "ScheduledSeq",
    "StepPlan",
    "StepResult",
    "TokenBatch",
    "Transcribe",
]

# ------------------------------------------------------------- front end -> engine core


@dataclass(frozen=True, slots=True)
class PrepareGrammar:
    """Compile ``spec`` before its request is admitted (EngineCore.prepare_grammar), in the
    core's process. ``max_pending``: the front end's bound on compiles pending at once
    (None: never turned away)."""

    spec: StructuredSpec
    max_pending: int | None = None


@dataclass(frozen=True, slots=True)
class GrammarVerdict:
    """The answer to a PrepareGrammar. ``outcome`` "ok": compiled and pinned until
    ``EngineCore.release_grammar(pin)``; "refused": the spec is at fault (``message``,
    ``param`` name it); "busy": no compile slot now (retry after ``retry_after`` s)."""

    outcome: str
    pin: int = 0
    message: str = ""
    param: str | None = None
    retry_after: int = 0


@dataclass(frozen=True, slots=True)
class Admit:
    """A tokenized prompt entering the core, of one kind (actors.params.kinds: Generate
    with ``params.n`` choices, Pool, Transcribe). The front end has validated it
    (``SamplingParams.validate``, ``actors.params.prompt.check_prompt``); the core trusts
    it."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    kind: RequestKind
    arrival_time: float
    priority: int | None = None  # None: kind.params.priority


@dataclass(frozen=True, slots=True)
class Abort:
    """Stop a request (``index`` None: every choice) or one choice of it, at any stage; its
    blocks are freed at once. Unknown ids and finished choices are ignored."""

    request_id: str
    index: int | None = None


@dataclass(frozen=True, slots=True)
class Control:
    """An operator command, applied between steps and answered by one ControlResult.
    The engine actor handles ``pause``, ``resume``, ``is_paused``, ``abort_requests``,
    ``sleep``, ``wake_up`` and ``is_sleeping`` (they decide whether it steps); the core
    ``reset_prefix_cache``, ``sleep``/``wake_up`` (its memory), the weight transfer
    (``start_weight_update``, ``update_weights``, ``finish_weight_update``, ``weight_info``
    ...), ``start_profile`` and ``stop_profile`` (actors.core.operator), and
    ``linear_routing`` (the kernel table chosen at load)."""

    command: str
    args: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class ControlResult:
    ok: bool
    value: Any = None
    error: str | None = None
    # Why it was refused: "invalid" (the command's arguments are wrong), "conflict" (the
    # engine's state does not allow it now), "rpc" (a weight-transfer call out of order:
    # vLLM's worker raises, its server answers 500); None for a failure or success.
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Logprobs:
    """Logprob of one sampled token and the top alternatives (best first), or with
    logprob_token_ids the listed ids in the request's order."""

    logprob: float
    top_token_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()
    rank: int = 0  # tokens scoring at least as high (1: the best); 0: not computed (sampled)


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """New tokens of one sequence (choice ``index`` of its request) after a step.

    ``finish_reason`` is "stop", "length", "abort" or "repetition" once finished;
    ``stop_reason`` is the stop token id that ended it, "repetition_detected" with
    "repetition" (None for EOS and the other reasons).

    ``prompt_logprobs`` (requests that ask for them): one entry per prompt token, the
    first None (nothing precedes it), then the logprob of prompt token i given tokens
    [0, i). Sent once per request, whole, on the output of choice 0 that carries its
    first token (or ends it); None on every other output.
    """

    request_id: str
    index: int
    new_token_ids: tuple[int, ...]
    new_logprobs: tuple[Logprobs, ...] | None
    finished: bool
    finish_reason: str | None
    stop_reason: int | str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    prompt_logprobs: tuple[Logprobs | None, ...] | None = None
    # The last of new_token_ids is the EOS or stop token id that ended the choice: it is in
    # the token ids, but its text is not output (unless include_stop_str_in_output).
    stopped_on_token: bool = False
    # A pooling request's result (finished, "stop"): the vector as little-endian float32.
    pooled: bytes | None = None


SeqRef = tuple[str, int]  # (request_id, choice index)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the core's gauges and cumulative counters."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, tokens found
    num_preemptions: int = 0
    grammar_compiles: int = 0  # grammars compiled in the core's process (cache misses)


@dataclass(frozen=True, slots=True)
class TokenBatch:
    """Everything one step produced, sent as one message (per-message cost matters).

    ``scheduled``: choices this step moved from waiting to running (a queue time ends
    there); ``preempted``: choices it sent back to waiting, once per preemption;
    ``weight_version``: the label of the weights the step ran (vLLM's weight version,
    actors.core.weight_transfer)."""

    outputs: tuple[RequestOutput, ...] = ()
    scheduled: tuple[SeqRef, ...] = ()
    preempted: tuple[SeqRef, ...] = ()
    weight_version: str = "default"


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the front end needs to know about a loaded core (fixed once it has loaded)."""

    model_dir: str  # the tokenizer and chat template live here
    vocab_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_blocks: int
    kv_cache_dtype: str  # as configured: auto | float32 | bfloat16
    enable_prefix_caching: bool
    scheduling_policy: str
    max_logprobs: int
    eos_token_ids: tuple[int, ...]
    # Sampling defaults from generation_config.json (SamplingParams field -> value).
    generation_defaults: tuple[tuple[str, Any], ...] = field(default=())
    # The KV-event publisher this core runs, as vLLM's KVEventsConfig fields (field ->
    # value; actors.core.kv_events.ZmqEventPublisher.source); () when it publishes none.
    kv_event_source: tuple[tuple[str, Any], ...] = field(default=())
    # The width of the prompt embeddings the core takes (the model's hidden size) under
    # --enable-prompt-embeds; 0: it takes none.
    prompt_embeds_width: int = 0


# ------------------------------------------------------------------ inside the core


@dataclass(frozen=True, slots=True)
class SamplingRow:
    """One row of the sampler (mirrors lc_sampling_row plus its per-row lists).

    Already normalised: temperature 0.0 means greedy; top_k 0, top_p 1.0, min_p 0.0
    and penalties 0/0/1.0 mean off. Draws are keyed by (seed, position).
    """

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    seed: int  # uint64; resolved by the scheduler when the request gave none
    position: int  # number of output tokens so far
    num_logprobs: int  # top logprobs wanted; 0 with want_logprobs: only the sampled one
    want_logprobs: bool
    banned_token_ids: tuple[int, ...]  # EOS / stop ids while min_tokens holds
    # ids whose logprobs are reported in place of the top ones (logprob_token_ids)
    logprob_token_ids: tuple[int, ...] = ()

    @property
    def uses_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )


@dataclass(frozen=True, slots=True)
class NewSeq:
    """Full data for a sequence the engine has no state for (new or resumed)."""

    seq_id: int
    request_id: str
    index: int
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    logit_bias: tuple[tuple[int, float], ...]  # (token id, additive bias)
    allowed_token_ids: tuple[int, ...] | None
    # The Admit's kind: the runner keeps what it needs per kind (a pooling state, the
    # encoder input to encode on the first step, the LoRA adapter of its rows).
    kind: RequestKind
    # The output constraint; the runner builds the choice's matcher from it (plain data:
    # the runner may live in another process than the server that compiled it first).
    structured: StructuredSpec | None = None
    # Where the choice's reasoning ends (SamplingParams.reasoning_gate): the runner gates the
    # constraint on it and forces its end marker past the thinking budget.
    reasoning: ReasoningGate | None = None


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    """One sequence's slice of the flattened batch.

    Computes ``token_ids`` at positions [start_pos, start_pos + len(token_ids)) and
    writes their KV into ``block_table`` (its full table, covering those positions).
    A model with several KV cache groups (sliding-window layers: actors.core.kv_groups)
    has the tables of groups 1 .. G-1 in ``group_block_tables``, ``block_table`` being
    group 0's; a sliding group's entries its window has left are -1 (freed, never read).
    ``sample`` is set iff these tokens reach the end of the known tokens, so the last
    position's logits draw the next token; a mid-prompt chunk has ``sample`` None.
    ``prompt_logprobs`` (top-k, 0 = the prompt token's own logprob only) asks for the
    logprobs of the prompt tokens these rows predict: row p scores prompt token p + 1.
    """

    seq_id: int
    token_ids: tuple[int, ...]
    start_pos: int  # == num_computed_tokens
    block_table: tuple[int, ...]
    sample: SamplingRow | None
    prompt_logprobs: int | None = None
    group_block_tables: tuple[tuple[int, ...], ...] = ()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True, slots=True)
class StepPlan:
    step_id: int
    seqs: tuple[ScheduledSeq, ...]  # batch order: running first, then newly admitted
    new_seqs: tuple[NewSeq, ...]
    released_seq_ids: tuple[int, ...]  # finished, aborted or preempted since last plan
    # Choices that ended since the last plan (not preempted ones): the runner drops what it
    # keeps per choice rather than per sequence (sampling hooks).
    finished: tuple[SeqRef, ...] = ()

    @property
    def num_batched_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)

    @property
    def is_empty(self) -> bool:
        """An empty plan runs nothing and is answered by no StepResult."""
        return not self.seqs


@dataclass(frozen=True, slots=True)
class SampledToken:
    """``token_id`` -1 (LC_NO_TOKEN: every token was masked) ends the sequence with
    "stop" and no new token. ``refused``: the sampler refused this row's parameters (a
    value validation should have stopped); its request ends with "error", alone.
    ``forced``: tokens the sequence's grammar forces after ``token_id`` (fast-forward),
    appended in order with no model step of their own."""

    seq_id: int
    token_id: int
    logprobs: Logprobs | None = None
    refused: bool = False
    forced: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PromptLogprobs:
    """Logprobs of prompt tokens [start, start + len(entries)) of one sequence (start >= 1),
    computed by one step; ranks are set."""

    seq_id: int
    start: int
    entries: tuple[Logprobs, ...]


@dataclass(frozen=True, slots=True)
class PooledOutput:
    """A pooling sequence's vector (little-endian float32), once its whole prompt ran."""

    seq_id: int
    data: bytes


@dataclass(frozen=True, slots=True)
class StepResult:
    """One SampledToken per ScheduledSeq whose ``sample`` was set, any order; one
    PromptLogprobs per ScheduledSeq with ``prompt_logprobs`` set whose rows scored any
    prompt token; one PooledOutput per sequence of a ``Pool`` kind whose chunk ends its
    prompt (the runner pools every chunk's final hidden states; such a chunk never
    samples)."""

    step_id: int
    sampled: tuple[SampledToken, ...]
    prompt_logprobs: tuple[PromptLogprobs, ...] = ()
    pooled: tuple[PooledOutput, ...] = ()
