"""Whether the engine steps and takes new requests: pause, resume, sleep, wake_up, drain.

A pure state machine (no Trio, no core): the engine actor (actors.runtime.engine_controls)
feeds it the operator's commands between two steps and carries out what it answers. Its
state is three independent parts:

- the operator's pause: ``pause_mode`` (None, "abort", "wait" or "keep") until ``resume``;
  in abort and wait modes new requests are refused (``refusal()``: GenerationPaused, a
  503); a pause that has applied *holds*: nothing steps, admits wait;
- sleep: ``sleep_level`` (None: awake) from a core sleep that succeeded until a wake_up
  that left the core awake; nothing steps, admits wait;
- pending drains: a pause or sleep of mode "wait" (or "abort" while something still runs)
  waits until the core holds nothing; meanwhile admits wait and steps go on.

    pause(keep)                 -> holding at once (requests stay in the core)
    pause(abort)                -> abort everything, then as wait
    pause(wait)   busy          -> pending ... drained() -> holding (cache reset if asked)
    pause(wait)   idle          -> holding at once
    resume                      -> not paused; every pending pause answered 409
    sleep(abort|wait, level)    -> like pause, then the core's sleep -> slept(level)
    sleep(keep, level >= 1)     -> 409 while busy (the KV cache goes, the requests cannot stay)
    wake_up                     -> every pending sleep answered 409, then the core's wake_up
                                   -> woke(asleep)
    release_kv_cache_memory     -> 409 unless a pause holds and the core is empty; then the
      (vLLM's; the core frees      core's release -> released(): asleep at level 1 (nothing
       the KV cache)               steps, even after resume) until a wake_up that leaves the
                                   core awake, which also ends the pause (vLLM's wake_up
                                   resumes the scheduler)

The order of operations is decided here, once: commands apply in arrival order, and a
later ``resume`` (``wake_up``) overtakes a pause (sleep) still pending for its drain: that
one is answered 409 ("overtaken") and never applies. vLLM's wake_up and resume act on the
engine at once and never wait behind an earlier call, so the later command wins; the
engine is never left paused (asleep) with nobody to undo it. A wake_up that arrives while
the core's own sleep is running is simply the next command: it applies after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from actors.messages import ControlResult
from actors.runtime.failures import GenerationPaused

PAUSE_MODES = ("abort", "wait", "keep")

T = TypeVar("T")  # how the actor answers a deferred command (a reply channel)


@dataclass(frozen=True, slots=True)
class Pending(Generic[T]):
    """A pause or sleep waiting for the drain, with what applies it once drained."""

    command: str  # "pause" | "sleep"
    mode: str
    clear_cache: bool
    level: int
    ticket: T


@dataclass(frozen=True, slots=True)
class Transition(Generic[T]):
    """What the actor does after a command: answer these callers now (in order), and run
    the core's sleep for each of ``sleep_now`` (then ``slept``) and answer its caller with
    the core's result."""

    replies: tuple[tuple[T, ControlResult], ...] = ()
    sleep_now: tuple[Pending[T], ...] = ()


@dataclass(eq=False)
class PauseStates(Generic[T]):
    """See the module. `busy`: whether the core holds unfinished requests; `abort_all`: end
    every request the engine holds with "abort"; `reset_cache`: drop the prefix cache."""

    busy: Callable[[], bool]
    abort_all: Callable[[], None]
    reset_cache: Callable[[], None]
    pause_mode: str | None = None
    refusing: bool = False
    holding: bool = False
    sleep_level: int | None = None
    pending: list[Pending[T]] = field(default_factory=list)
    kv_released: bool = False  # the sleep is release_kv_cache_memory's (under a pause)

    # -- what the engine actor asks -------------------------------------------------------
    @property
    def stepping_allowed(self) -> bool:
        return not self.holding and self.sleep_level is None

    @property
    def admits_flow(self) -> bool:
        """New requests reach the core (else they wait in the actor): not while paused in
        keep mode, draining for a wait, or asleep."""
        return self.stepping_allowed and not self.pending

    def refusal(self) -> GenerationPaused | None:
        """Why a new request is refused now (pause in abort or wait mode), else None."""
        return GenerationPaused() if self.refusing else None

    @property
    def is_sleeping(self) -> bool:  # vLLM's: any pause of the scheduler counts as asleep
        return self.sleep_level is not None or self.pause_mode is not None

    @property
    def released_allowed(self) -> bool:
        """release_kv_cache_memory may run: a pause holds, nothing is left in the core."""
        return self.holding and not self.pending and not self.busy()

    @property
    def stopped_at_shutdown(self) -> bool:
        """Shutting down now would wait forever: held or asleep, nothing would finish."""
        return self.holding or self.sleep_level is not None

    # -- commands -------------------------------------------------------------------------
    def pause(self, mode: str, clear_cache: bool, ticket: T) -> Transition[T]:
        if mode not in PAUSE_MODES:
            return _answer(ticket, _invalid(mode))
        self.pause_mode = mode
        self.refusing = mode != "keep"
        if mode == "abort":
            self.abort_all()
        if mode == "keep" or not self.busy():
            return _answer(ticket, self._paused(mode, clear_cache))
        self.pending.append(Pending("pause", mode, clear_cache, 0, ticket))
        return Transition()

    def resume(self, ticket: T) -> Transition[T]:
        overtaken = self._overtake("pause", "resumed before the drain ended")
        self.pause_mode = None
        self.refusing = False
        self.holding = False
        return Transition((*overtaken, (ticket, ControlResult(True))))

    def sleep(self, mode: str, level: int, ticket: T) -> Transition[T]:
        if mode not in PAUSE_MODES:
            return _answer(ticket, _invalid(mode))
        if level >= 1 and mode == "keep" and self.busy():
            return _answer(ticket, ControlResult(False, reason="conflict", error=(
                f"sleep level {level} frees the KV cache, so mode=keep cannot keep the "
                "running requests; use mode=abort or mode=wait")))
        if mode == "abort":
            self.abort_all()
        pending = Pending("sleep", mode, False, level, ticket)
        if mode == "wait" and self.busy():
            self.pending.append(pending)
            return Transition()
        return Transition(sleep_now=(pending,))

    def slept(self, level: int) -> None:
        """The core's sleep at `level` succeeded."""
        self.sleep_level = max(level, self.sleep_level or 0)

    def released(self) -> None:
        """The core's release_kv_cache_memory succeeded: its KV cache is gone."""
        self.sleep_level = max(1, self.sleep_level or 0)
        self.kv_released = True

    def wake_up(self) -> Transition[T]:
        """Before the core's wake_up runs: pending sleeps are overtaken."""
        return Transition(self._overtake("sleep", "woken up before the drain ended"))

    def woke(self, asleep: bool) -> None:
        """The core's wake_up succeeded; `asleep`: part of it is still asleep (a partial
        wake_up of some tags), so nothing steps yet."""
        if not asleep:
            self.sleep_level = None
            if self.kv_released:  # vLLM's wake_up then resumes its paused scheduler
                self.kv_released = False
                self.pause_mode = None
                self.refusing = self.holding = False

    def drained(self) -> Transition[T]:
        """Between steps: once the core holds nothing, every pending pause applies and every
        pending sleep runs (in the order they came)."""
        if not self.pending or self.busy():
            return Transition()
        pending, self.pending = self.pending, []
        replies = []
        sleeps = []
        for p in pending:
            if p.command == "sleep":
                sleeps.append(p)
            else:
                replies.append((p.ticket, self._paused(p.mode, p.clear_cache)))
        return Transition(tuple(replies), tuple(sleeps))

    def take_pending(self) -> list[Pending[T]]:
        """The loop has ended: the pending commands, to be answered by the caller."""
        pending, self.pending = self.pending, []
        return pending

    # -- internals ------------------------------------------------------------------------
    def _paused(self, mode: str, clear_cache: bool) -> ControlResult:
        self.holding = True
        if clear_cache and mode != "keep":
            self.reset_cache()
        return ControlResult(True)

    def _overtake(self, command: str, why: str) -> tuple[tuple[T, ControlResult], ...]:
        overtaken = tuple((p.ticket, ControlResult(False, error=f"{command} was overtaken: "
                                                   f"{why}", reason="conflict"))
                          for p in self.pending if p.command == command)
        self.pending = [p for p in self.pending if p.command != command]
        return overtaken


def _answer(ticket: T, result: ControlResult) -> Transition[T]:
    return Transition(((ticket, result),))


def _invalid(mode: str) -> ControlResult:
    return ControlResult(False, error=f"Invalid pause mode: {mode}", reason="invalid")
