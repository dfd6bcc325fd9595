"""The engine actor's books: per admitted prompt and per choice, what the metrics report.

The engine actor keeps one Entry per engine request it has received (its Admit) until
every choice of it has retired: whether it reached the core, which choices are live, and
each choice's timing (queued, first token, inter-token gaps, preemptions). From a step's
TokenBatch the ledger derives the step's StepTokens and the choices that finished; at a
retirement it derives SequenceFinished (and GroupFinished with the prompt's last choice).

Pure bookkeeping: no Trio, no core; times are time.monotonic() seconds passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from actors.messages import Admit, RequestOutput, TokenBatch
from actors.runtime.messages import (
    ChoiceTiming,
    GroupFinished,
    MetricEvent,
    SequenceFinished,
    StepTokens,
)


@dataclass(slots=True, eq=False)
class ChoiceClock:
    """One choice as the engine actor counts it."""

    retired: bool = False
    # Decided before its retirement by whoever stopped it (a stop string: "stop"; an
    # abort), else the reason it retires with.
    finish_reason: str | None = None
    num_generated: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    inter_token: list[float] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class Entry:
    """One engine request (one prompt, params.n choices) the engine actor has received."""

    admit: Admit
    choices: list[ChoiceClock]
    in_engine: bool = False  # the core holds it
    abort_requested: bool = False  # every choice: it never reaches the core
    prompt_counted: bool = False  # its prompt tokens count once, with its first token

    def live(self) -> list[int]:
        return [i for i, c in enumerate(self.choices) if not c.retired]


class Ledger:
    """The engine requests the engine actor holds, by engine id (see the module)."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}

    def add(self, admit: Admit) -> Entry:
        entry = Entry(admit, [ChoiceClock() for _ in range(admit.kind.params.n)])
        self._entries[admit.request_id] = entry
        return entry

    def get(self, engine_id: str) -> Entry | None:
        return self._entries.get(engine_id)

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def note_schedule(self, batch: TokenBatch, started: float) -> None:
        """Preemptions per choice, and when each newly admitted request was first scheduled
        (its queue time ends there, although a long prompt's first token comes several
        chunked steps later; the forked choices start with it)."""
        for engine_id, index in batch.preempted:
            clock = self._clock(engine_id, index)
            if clock is not None:
                clock.num_preemptions += 1
        for engine_id, index in batch.scheduled:
            entry = self._entries.get(engine_id)
            if entry is None:
                continue
            for clock in entry.choices if index == 0 else entry.choices[index:index + 1]:
                if clock.scheduled_at is None:
                    clock.scheduled_at = started

    def account(self, batch: TokenBatch, now: float
                ) -> tuple[StepTokens, list[tuple[str, int, str]]]:
        """The step's token counts, and the (engine id, index, reason) of each choice the
        step finished (to be retired by the caller)."""
        prompt = cached = generated = 0
        finished = []
        for out in batch.outputs:
            entry = self._entries.get(out.request_id)
            if entry is None:
                continue
            clock = entry.choices[out.index]
            if clock.retired:
                continue
            clock.num_cached_tokens = out.num_cached_tokens
            if out.new_token_ids:
                if not entry.prompt_counted:  # the prompt ran once, for all its choices
                    entry.prompt_counted = True
                    prompt += len(entry.admit.prompt_token_ids)
                    cached += out.num_cached_tokens
                if clock.first_token_at is None:
                    clock.first_token_at = now
                elif clock.last_token_at is not None:
                    clock.inter_token.append(now - clock.last_token_at)
                clock.last_token_at = now
                clock.num_generated += len(out.new_token_ids)
                generated += len(out.new_token_ids)
            if out.finished:
                finished.append((out.request_id, out.index, out.finish_reason or "stop"))
        return StepTokens(prompt, cached, generated, len(batch.scheduled)), finished

    def timings(self, outputs: tuple[RequestOutput, ...]) -> tuple[ChoiceTiming | None, ...]:
        """Each output's choice clock after `account` (before the step's retirements drop
        any entry), for the per-request metrics."""
        out: list[ChoiceTiming | None] = []
        for o in outputs:
            entry = self._entries.get(o.request_id)
            if entry is None:
                out.append(None)
                continue
            c = entry.choices[o.index]
            out.append(ChoiceTiming(entry.admit.arrival_time, c.scheduled_at,
                                    c.first_token_at, c.last_token_at))
        return tuple(out)

    def retire(self, engine_id: str, index: int, reason: str, now: float
               ) -> tuple[str, list[MetricEvent]] | None:
        """Retires one choice: its final finish reason and its metric events (the group's
        too once it was the last); None if it had already retired. The entry is dropped
        with its last choice."""
        entry = self._entries.get(engine_id)
        if entry is None or entry.choices[index].retired:
            return None
        clock = entry.choices[index]
        clock.retired = True
        if clock.finish_reason is None:
            clock.finish_reason = reason
        events: list[MetricEvent] = [sequence_finished(entry, clock, now)]
        if not entry.live():
            del self._entries[engine_id]
            events.append(GroupFinished(len(entry.choices),
                                        max(c.num_generated for c in entry.choices)))
        return clock.finish_reason, events

    def _clock(self, engine_id: str, index: int) -> ChoiceClock | None:
        entry = self._entries.get(engine_id)
        if entry is None or not 0 <= index < len(entry.choices):
            return None
        return entry.choices[index]

    def __len__(self) -> int:
        return len(self._entries)


def sequence_finished(entry: Entry, clock: ChoiceClock, now: float) -> SequenceFinished:
    """The metrics of a choice that retired at `now` (monotonic seconds)."""
    admitted_at = entry.admit.arrival_time
    scheduled, first, last = clock.scheduled_at, clock.first_token_at, clock.last_token_at
    started = scheduled is not None and first is not None and last is not None
    return SequenceFinished(
        finish_reason=clock.finish_reason or "error",
        num_prompt_tokens=len(entry.admit.prompt_token_ids),
        num_generation_tokens=clock.num_generated,
        num_cached_tokens=clock.num_cached_tokens,
        num_preemptions=clock.num_preemptions,
        max_tokens=entry.admit.kind.params.max_tokens,
        e2e_seconds=now - admitted_at,
        queue_seconds=None if scheduled is None else scheduled - admitted_at,
        ttft_seconds=None if first is None else first - admitted_at,
        inter_token_seconds=tuple(clock.inter_token),
        prefill_seconds=first - scheduled if started else None,  # type: ignore[operator]
        decode_seconds=last - first if started else None,  # type: ignore[operator]
        inference_seconds=last - scheduled if started else None,  # type: ignore[operator]
    )
