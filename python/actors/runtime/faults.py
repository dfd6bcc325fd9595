"""Fault injection for the server's failure tests: inert unless LLMSERVE_FAULT_INJECT is set.

    LLMSERVE_FAULT_INJECT="point:N[,point:N ...]"

makes the named point fail on its N-th pass (N >= 1):

    engine     the engine actor raises after its N-th engine step
    tokenizer  the tokenizer actor raises instead of delivering the N-th step's output
    metrics    the metrics actor raises instead of applying its N-th event
    bad_row    before the first engine step from the N-th on in which at least two running
               sequences are decoding, the oldest one's sampling row gets repetition_penalty=0,
               a value validation refuses: the core then refuses that one row of the batch at
               run time, as it would a value validation let through by mistake
    matcher_accept
               a structured-output grammar matcher raises on its N-th accept (a token drawn
               or forced in the engine step), as a backend bug would

The supervisor reads the variable once at startup (`configure`); nothing a client sends can
reach these points. LLMSERVE_FAULT_AFTER_STEPS (engine_actor) fails engine steps themselves.
bad_row reaches into LLMEngine's scheduler: a spoiled row is by definition below the
EngineCore boundary, and other cores simply never take this point. matcher_accept is set into
the grammar masks of this process (actors.core.structured.mask), so it reaches an in-process
engine core only, not a --data-parallel-size child.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from actors.core.protocol import EngineCore

__all__ = ["AFTER_STEPS_ENV", "FAULT_ENV", "InjectedFault", "check", "configure", "fault_after",
           "hit", "maybe_spoil_row"]

log = logging.getLogger("actors.runtime.faults")

FAULT_ENV = "LLMSERVE_FAULT_INJECT"
AFTER_STEPS_ENV = "LLMSERVE_FAULT_AFTER_STEPS"  # read by the engine actor when it is built
POINTS = ("engine", "tokenizer", "metrics", "bad_row", "matcher_accept")

_plan: dict[str, int] = {}
_passes: dict[str, int] = {}
_lock = threading.Lock()  # bad_row is passed in the engine's worker thread


class InjectedFault(RuntimeError):
    """Raised where LLMSERVE_FAULT_INJECT (or LLMSERVE_FAULT_AFTER_STEPS) says so."""


def parse(raw: str) -> dict[str, int]:
    plan: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        point, _, count = item.partition(":")
        if point not in POINTS or not count.strip().isdigit() or int(count) < 1:
            raise ValueError(f"{FAULT_ENV}: {item!r} is not point:N with point one of "
                             f"{', '.join(POINTS)} and N >= 1")
        plan[point] = int(count)
    return plan


def fault_after(environ: Mapping[str, str] = os.environ) -> int | None:
    """LLMSERVE_FAULT_AFTER_STEPS: every engine step after that many fails (None: unset)."""
    raw = environ.get(AFTER_STEPS_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{AFTER_STEPS_ENV} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{AFTER_STEPS_ENV} must be >= 0, got {value}")
    return value


def configure(environ: Mapping[str, str]) -> None:
    """Reads the plan (startup only); an unset or empty variable injects nothing."""
    plan = parse(environ.get(FAULT_ENV, ""))
    with _lock:
        _plan.clear()
        _plan.update(plan)
        _passes.clear()
    _set_matcher_fault("matcher_accept" in plan)
    for point, count in plan.items():
        log.warning("%s: %s fails on pass %d", FAULT_ENV, point, count)


def _set_matcher_fault(on: bool) -> None:
    """Points the grammar masks' accept hook at the matcher_accept point, or clears it (the
    module is imported only when the point is planned: nothing changes otherwise)."""
    import sys

    if on:
        from actors.core.structured import mask
    else:
        mask = sys.modules.get("actors.core.structured.mask")  # type: ignore[assignment]
        if mask is None:
            return
    mask.set_accept_fault(_matcher_accept if on else None)


def _matcher_accept() -> None:
    check("matcher_accept")


def hit(point: str) -> bool:
    """Counts one pass of `point`; True on the pass the plan names."""
    if point not in _plan:
        return False
    with _lock:
        _passes[point] = _passes.get(point, 0) + 1
        return _passes[point] == _plan[point]


def check(point: str) -> None:
    if hit(point):
        raise InjectedFault(f"injected fault at {point}")


def maybe_spoil_row(core: EngineCore) -> None:
    """The bad_row point, passed before every engine step (in the engine's thread)."""
    if "bad_row" not in _plan:
        return
    from actors.core.engine import LLMEngine

    if not isinstance(core, LLMEngine):
        return
    with _lock:
        passes = _passes["bad_row"] = _passes.get("bad_row", 0) + 1
        if passes < _plan["bad_row"] or _passes.get("bad_row fired"):
            return
        decoding = [s for s in core.scheduler.running if s.output_token_ids]
        if len(decoding) < 2:
            return
        _passes["bad_row fired"] = 1
    seq = decoding[0]  # running is in admission order: the oldest
    seq.params = replace(seq.params, repetition_penalty=0.0)  # replace() does not validate
    seq.row_static = None  # the cached per-request part of its sampling row
    log.warning("%s: bad_row spoils request %s", FAULT_ENV, seq.request_id)
