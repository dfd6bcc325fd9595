"""The pause/sleep/drain machine alone: no Trio, no model. A fake engine stands for the
core: `busy` is whether it holds requests, and the machine's effects are recorded."""

from __future__ import annotations

import pytest

from actors.messages import ControlResult
from actors.runtime.failures import GenerationPaused
from actors.runtime.pause_states import PauseStates, Transition


class Engine:
    def __init__(self, running: int = 0) -> None:
        self.running = running
        self.effects: list[str] = []
        self.machine: PauseStates[str] = PauseStates(
            busy=lambda: self.running > 0, abort_all=self._abort, reset_cache=self._reset)

    def _abort(self) -> None:
        self.effects.append("abort")
        self.running = 0

    def _reset(self) -> None:
        self.effects.append("reset")


def answers(t: Transition[str]) -> dict[str, ControlResult]:
    return dict(t.replies)


def test_pause_modes():
    e = Engine(running=2)
    m = e.machine
    assert answers(m.pause("keep", True, "p")) == {"p": ControlResult(True)}
    assert m.holding and not m.refusing and not m.stepping_allowed and not m.admits_flow
    assert e.effects == []  # keep: requests stay, the cache too
    m.resume("r")
    assert m.stepping_allowed and m.admits_flow and m.pause_mode is None

    assert answers(m.pause("abort", True, "p")) == {"p": ControlResult(True)}
    assert e.effects == ["abort", "reset"] and m.holding
    assert isinstance(m.refusal(), GenerationPaused) and m.is_sleeping
    assert answers(m.resume("r")) == {"r": ControlResult(True)}
    assert m.refusal() is None and not m.is_sleeping

    bad = answers(m.pause("later", True, "p"))["p"]
    assert not bad.ok and bad.reason == "invalid" and m.pause_mode is None


def test_pause_wait_answers_once_drained():
    e = Engine(running=1)
    m = e.machine
    assert m.pause("wait", False, "p") == Transition()  # pending
    assert m.refusing and not m.admits_flow and m.stepping_allowed  # it drains
    assert m.drained() == Transition()  # still busy
    e.running = 0
    assert answers(m.drained()) == {"p": ControlResult(True)}
    assert m.holding and e.effects == []  # clear_cache=False
    assert m.drained() == Transition()  # answered once


def test_sleep_runs_the_core_and_wake_up_ends_it():
    e = Engine()
    m = e.machine
    t = m.sleep("abort", 1, "s")
    assert t.replies == () and [p.ticket for p in t.sleep_now] == ["s"]
    m.slept(1)
    assert m.sleep_level == 1 and not m.stepping_allowed and m.is_sleeping
    assert m.refusal() is None  # a sleep holds new requests, it does not refuse them
    assert m.wake_up() == Transition()
    m.woke(asleep=True)  # a partial wake-up: still asleep
    assert m.sleep_level == 1
    m.woke(asleep=False)
    assert m.sleep_level is None and m.stepping_allowed


def test_sleep_keep_refused_while_busy():
    e = Engine(running=1)
    r = answers(e.machine.sleep("keep", 1, "s"))["s"]
    assert not r.ok and r.reason == "conflict" and e.running == 1
    assert e.machine.sleep("keep", 0, "s").sleep_now  # level 0 keeps the KV cache


@pytest.mark.parametrize("first, then", [("pause", "resume"), ("sleep", "wake_up")])
def test_a_later_command_overtakes_a_pending_drain(first, then):
    """The race of sleep?mode=wait with wake_up (pause?mode=wait with resume): the later
    command wins, deterministically. The pending one is answered 409 at once and never
    applies, however the drain ends afterwards."""
    e = Engine(running=1)
    m = e.machine
    start = m.pause("wait", True, "first") if first == "pause" else m.sleep("wait", 1, "first")
    assert start == Transition() and len(m.pending) == 1
    t = m.resume("then") if then == "resume" else m.wake_up()
    overtaken = answers(t)["first"]
    assert not overtaken.ok and overtaken.reason == "conflict"
    assert "overtaken" in (overtaken.error or "")
    e.running = 0
    assert m.drained() == Transition()  # the drain ends: nothing left to apply
    assert m.stepping_allowed and m.admits_flow and not m.holding and m.sleep_level is None
    assert e.effects == []


def test_pending_ones_of_the_other_kind_stay():
    e = Engine(running=1)
    m = e.machine
    m.pause("wait", True, "p")
    m.sleep("wait", 1, "s")
    assert answers(m.wake_up()).keys() == {"s"}  # wake_up overtakes sleeps only
    assert [p.ticket for p in m.pending] == ["p"]
    e.running = 0
    assert answers(m.drained()) == {"p": ControlResult(True)} and m.holding


def test_drain_applies_pauses_and_runs_sleeps_in_order():
    e = Engine(running=1)
    m = e.machine
    m.sleep("wait", 2, "s")
    m.pause("wait", True, "p")
    e.running = 0
    t = m.drained()
    assert answers(t) == {"p": ControlResult(True)}
    assert [p.ticket for p in t.sleep_now] == ["s"] and t.sleep_now[0].level == 2
    m.slept(2)
    m.slept(1)  # a lighter sleep after a deeper one keeps the deeper level
    assert m.sleep_level == 2 and m.stopped_at_shutdown


def test_take_pending_at_the_end():
    e = Engine(running=1)
    m = e.machine
    m.pause("wait", True, "p")
    assert [p.ticket for p in m.take_pending()] == ["p"] and m.pending == []


def test_release_needs_a_completed_pause_and_wake_up_resumes():
    e = Engine(running=1)
    m = e.machine
    assert not m.released_allowed  # no pause
    m.pause("keep", False, "p")
    assert not m.released_allowed  # keep: the requests are still in the core
    m.resume("r")
    m.pause("wait", False, "p")
    assert not m.released_allowed  # pending its drain
    e.running = 0
    m.drained()
    assert m.released_allowed
    m.released()
    assert m.sleep_level == 1 and m.is_sleeping and not m.stepping_allowed
    m.resume("r")  # the pause ends, but the KV cache is still gone: nothing steps
    assert m.pause_mode is None and not m.stepping_allowed
    m.pause("abort", False, "p")
    m.woke(asleep=False)  # vLLM's wake_up resumes the scheduler once fully awake
    assert m.stepping_allowed and m.admits_flow and m.pause_mode is None
    assert m.refusal() is None and not m.kv_released
    m.pause("abort", False, "p")
    m.slept(1)
    m.woke(asleep=False)  # a plain sleep's wake_up leaves the operator's pause alone
    assert m.pause_mode == "abort" and m.holding
