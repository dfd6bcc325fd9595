"""Burst admission: requests that reach an idle engine together prefill in one step.

Without it, the first request of a burst starts a step alone the moment it is tokenized and
the rest, tokenized while that step runs, wait for the next one: 8 requests sent at once
got their first tokens after [154, 745 x 7] ms. One step holding all of their prompts
(within max_num_batched_tokens) costs at most what the steps it replaces cost: where a step's
time hardly grows with its tokens (an accelerator) every request of the burst gets about the
first one's time; where it grows with them (a CPU) the burst shares one first-token time,
the first request gives up its head start and the others lose a step boundary.

    ActorSystem.submit --arrived(prompts)--> Arrivals <--settled()-- engine actor (received)
                                                 ^                    tokenizer (refused, gone)
    engine actor, idle -> busy: await gather() --+

`pending` counts prompts submitted to the tokenizer whose Admit the engine actor has not
received yet. When the engine was idle, its first step waits until

- nothing is pending and no request arrived for `quiet_s` (the HTTP edge may still be
  parsing the rest of a burst), or
- what arrived fills a step (the token budget or the seats), or
- the cap: `cap_s`, and at most STEP_FRACTION of a typical prefill step once one has run
  (an engine whose steps take 10 ms waits 2.5 ms at most, a slow CPU step up to `cap_s`).

A lone request pays at most what is left of `quiet_s` after its own tokenization; a burst
pays the cap once, instead of a whole step for every request after its first. A busy
engine never waits: what arrives during a step joins the next one anyway, and holding a
step back would only slow the running requests. The wait is on the Trio thread, woken by
every arrival and settlement, never polling. The numbers come from the server's
--admission-window-ms and --admission-quiet-ms (actors.config.AdmissionWindow); a cap of 0
turns the wait off.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import trio

from actors.config import AdmissionWindow
from actors.messages import Admit

__all__ = ["DEFAULT_WINDOW", "STEP_FRACTION", "AdmissionWindow", "Arrivals"]

DEFAULT_WINDOW = AdmissionWindow()
# The longest wait, as a share of a typical step that admitted requests.
STEP_FRACTION = 0.25
# Weight of the newest such step in the typical one (an exponential moving average).
STEP_EMA_WEIGHT = 0.2


class Arrivals:
    """Prompts on their way from the front door to the engine actor, and the engine's wait
    for them. Everything runs on the Trio thread."""

    def __init__(self, window: AdmissionWindow = DEFAULT_WINDOW) -> None:
        self.window = window
        self.pending = 0
        self.last_arrival = -math.inf
        self.typical_step_s: float | None = None  # of steps that admitted requests
        self._changed = trio.Event()

    def arrived(self, prompts: int) -> None:
        """A request with `prompts` prompts was handed to the tokenizer."""
        self.pending += prompts
        self.last_arrival = trio.current_time()
        self._changed.set()

    def settled(self, prompts: int = 1) -> None:
        """Prompts that reached the engine actor, or that never will (refused, cancelled)."""
        self.pending = max(self.pending - prompts, 0)
        self._changed.set()

    def note_step(self, seconds: float) -> None:
        """A step that admitted requests took `seconds`."""
        typical = self.typical_step_s
        self.typical_step_s = seconds if typical is None else \
            typical + STEP_EMA_WEIGHT * (seconds - typical)

    def cap(self) -> float:
        """The longest the next wait may last (seconds)."""
        cap = self.window.cap_s
        if self.typical_step_s is not None:
            cap = min(cap, STEP_FRACTION * self.typical_step_s)
        return cap

    async def gather(self, admitted: Sequence[Admit], max_tokens: int,
                     max_seqs: int) -> float:
        """Waits while the rest of a burst is on its way (see the module's rules); returns
        the seconds waited. `admitted`: the requests the first step will take, watched as
        they grow; `max_tokens`, `max_seqs`: what one step holds."""
        if not self.window.enabled:
            return 0.0
        start = trio.current_time()
        deadline = start + self.cap()
        while True:
            now = trio.current_time()
            if now >= deadline or _fills(admitted, max_tokens, max_seqs):
                break
            if self.pending:
                wake = deadline
            else:
                quiet_until = self.last_arrival + self.window.quiet_s
                if now >= quiet_until:
                    break
                wake = min(deadline, quiet_until)
            self._changed = trio.Event()
            with trio.move_on_at(wake):
                await self._changed.wait()
        return trio.current_time() - start


def _fills(admitted: Sequence[Admit], max_tokens: int, max_seqs: int) -> bool:
    """Whether these requests alone fill one step (prefix-cache hits aside)."""
    seqs = tokens = 0
    for req in admitted:
        seqs += req.kind.params.n
        tokens += len(req.prompt_token_ids)
    return seqs >= max_seqs or tokens >= max_tokens
