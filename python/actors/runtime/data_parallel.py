"""Data parallelism inside one server: N engine cores, each in its own process with its own
KV cache, behind one HTTP front end (vLLM's --data-parallel-size).

    front end ⇢ DataParallelSystem.submit ⇢ least-loaded ActorSystem i
                  (tokenizer ⇢ engine actor ⇢ ProcessEngineCore child i ⇢ tokenizer ⇢ Outbox)

Each engine is a whole actor system (run_actor_system with engine_index i): its own
registry, tokenizer actor, engine actor and metrics actor, so nothing on one engine's path
waits on another's. This module only fans out over them:

- placement: a request goes, when it is registered, to the engine holding the fewest live
  sequences (queued + running, counted in choices); ties rotate, so an idle server
  alternates. The front end's one Admission bounds the total; each engine's channels are
  sized for the whole capacity, so a skewed placement never blocks a send.
- /metrics: the engines' expositions merged into one, one HELP/TYPE per family and every
  engine's samples under it (the `engine` label tells them apart, as in vLLM). The HTTP
  edge's own counters (http_requests, rejections) live on engine 0's metrics actor.
- failure: any engine's actor failing calls the same on_fatal (the supervisor then answers
  /health 503 and exits 1); that engine's requests fail, the others' get the grace period.
- grammars: a request's constraint compiles before admission on every engine, each in its
  own process, at once (its placement is only decided when it is registered, after the
  compile, and requests of one schema land on every engine soon anyway). A refusal from
  any engine is the answer (the spec is at fault; every engine gives the same one), then a
  full queue (503); the others' pins are released. One pin per engine, released together.
- controls (/pause, /sleep, LoRA loads...) go to every engine; the answer is the first
  refusal or failure, else engine 0's. A LoRA load refused by one engine is unloaded from
  the engines that took it (all or none), and a caller that leaves is no failure.

- scaling (actors.runtime.elastic): engines join and leave while requests run. A joining
  engine's actor system starts in this nursery (`spawn`) and takes requests once it is in
  the lists; a leaving one (always the last) first leaves placement (`draining`), keeps its
  requests until they retire, then ends. Every engine's channels are sized for the most
  engines the server may have (`channel_capacity`), so placement stays unblocked whatever
  the count.

What it does not do: share a prefix cache between engines (a prompt's KV lives on the engine
that ran it), or place by prefix. On a machine with few cores the engines compete for the
same cores; N > 1 is then a functional arrangement, not a speed-up.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import trio

from actors.core.process import EngineCoreDied
from actors.core.protocol import EngineCore
from actors.messages import Control, ControlResult, EngineInfo, GrammarVerdict, PrepareGrammar
from actors.runtime.admission import Admission
from actors.runtime.burst import DEFAULT_WINDOW, AdmissionWindow
from actors.runtime.failures import GenerationPaused, ServerFailed
from actors.runtime.prompt_bounds import PromptCharBound
from actors.errors import DuplicateRequest
from actors.runtime.request import Registry, RequestState
from actors.runtime.system import ActorSystem, run_actor_system
from actors.text.detokenizer import TokenTexts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = ["DataParallelSystem", "run_data_parallel"]

log = logging.getLogger("actors.runtime.data_parallel")
WATCH_INTERVAL_S = 0.25  # how soon /health turns 503 after an engine's process dies
# Commands that must apply on every engine or on none: a partial success is undone.
_UNDO = {"load_lora_adapter": "unload_lora_adapter"}


class DataParallelRegistry:
    """The front end's view of every engine's registry; `add` is where a request is placed."""

    def __init__(self, registries: Sequence[Registry]) -> None:
        self.parts = list(registries)
        self.draining: set[int] = set()  # engines that take no new request (leaving)
        self._next = 0

    def load(self, i: int) -> int:
        """Engine i's live sequences, queued and running."""
        return sum(s.num_choices for s in self.parts[i].requests.values())

    def add(self, state: RequestState) -> None:
        if any(state.request_id in r.requests for r in self.parts):
            raise DuplicateRequest(f"request id {state.request_id!r} is already in flight")
        n = len(self.parts)
        order = [i for i in ((self._next + k) % n for k in range(n)) if i not in self.draining]
        best = min(order, key=self.load)  # min keeps the first of equals: the rotation
        self._next = (best + 1) % n
        self.parts[best].add(state)

    def remove(self, state: RequestState) -> None:
        i = self.engine_of(state)
        if i is not None:
            self.parts[i].remove(state)

    def engine_of(self, state: RequestState) -> int | None:
        for i, r in enumerate(self.parts):
            if state.request_id in r.requests:
                return i
        return None

    @property
    def requests(self) -> dict[str, RequestState]:
        return {k: v for r in self.parts for k, v in r.requests.items()}

    async def wait_empty(self) -> None:
        for r in self.parts:
            await r.wait_empty()
        while len(self):  # one emptied while waiting on another, then got a request
            for r in self.parts:
                await r.wait_empty()

    def fail_all(self, error: ServerFailed) -> None:
        for r in self.parts:
            r.fail_all(error)

    def __len__(self) -> int:
        return sum(len(r) for r in self.parts)


class DataParallelMetrics:
    """One /metrics over every engine's metrics actor."""

    def __init__(self, systems: Sequence[ActorSystem]) -> None:
        self.parts = [s.metrics for s in systems]

    def count_http(self, handler: str, method: str, status: int) -> None:
        self.parts[0].count_http(handler, method, status)

    def count_rejection(self, reason: str = "max_num_queued_reqs") -> None:
        self.parts[0].count_rejection(reason)

    def load_gauges(self) -> list[tuple[str, float]]:
        """Every engine's load gauges, engine by engine within each name (as vLLM's metrics
        snapshot lists an engine-labelled gauge)."""
        parts = [p.load_gauges() for p in self.parts]
        return [part[i] for i in range(len(parts[0])) for part in parts]

    def exposition(self) -> bytes:
        return merge_expositions([m.exposition() for m in self.parts])


def merge_expositions(parts: Sequence[bytes]) -> bytes:
    """Prometheus text expositions merged: each family's HELP and TYPE once, then every
    part's samples of it; a sample already given (same name and labels) is not repeated."""
    families: dict[str, tuple[list[str], list[str]]] = {}
    seen: set[str] = set()
    for part in parts:
        current: str | None = None
        for line in part.decode().splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                current = line.split(" ", 3)[2]
                head, _ = families.setdefault(current, ([], []))
                if line not in head:
                    head.append(line)
            elif line and current is not None:
                key = line.rsplit(" ", 1)[0]
                if key not in seen:
                    seen.add(key)
                    families[current][1].append(line)
    out = [line for head, samples in families.values() for line in (*head, *samples)]
    return ("\n".join(out) + "\n").encode()


@dataclass(eq=False)
class DataParallelSystem:
    """The handle a front end holds, shaped as ActorSystem's, over N actor systems."""

    systems: list[ActorSystem]
    admission: Admission
    registry: DataParallelRegistry
    metrics: DataParallelMetrics
    cores: list[EngineCore] = field(default_factory=list)  # systems[i] runs cores[i]
    # starts the actor system of engine len(systems) on a core, in this server's nursery
    spawn: Callable[[EngineCore], Awaitable[ActorSystem]] | None = None
    stopped: trio.Event = field(default_factory=trio.Event)
    _pins: dict[int, list[int]] = field(default_factory=dict)  # each engine's pin, by ours
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def info(self) -> EngineInfo:
        return self.systems[0].info

    @property
    def capacity(self) -> int:
        return self.admission.capacity

    @property
    def queued_prompt_tokens(self) -> int:
        """Every engine's prefill backlog together (vLLM's limit covers all its ranks)."""
        return sum(s.queued_prompt_tokens for s in self.systems)

    @property
    def token_texts(self) -> TokenTexts:
        return self.systems[0].token_texts

    @property
    def prompt_bound(self) -> PromptCharBound:
        return self.systems[0].prompt_bound

    def refusal(self) -> GenerationPaused | None:
        """Any engine refusing new requests (the operator's pause applies to every one)."""
        return next((r for r in (s.refusal() for s in self.systems) if r is not None), None)

    async def submit(self, state: RequestState) -> None:
        i = self.registry.engine_of(state)
        if i is None:
            raise RuntimeError(f"request {state.request_id!r} was not registered")
        await self.systems[i].submit(state)

    def abort(self, state: RequestState) -> None:
        i = self.registry.engine_of(state)
        if i is not None:
            self.systems[i].abort(state)

    async def prepare_grammar(self, request: PrepareGrammar) -> GrammarVerdict:
        """Compiles the constraint on every engine at once; "ok" once every one has it."""
        systems = list(self.systems)  # the engines of now (one may join or leave meanwhile)
        verdicts: list[GrammarVerdict | None] = [None] * len(systems)

        async def one(i: int) -> None:
            verdicts[i] = await systems[i].prepare_grammar(request)

        def release_all() -> None:
            for i, v in enumerate(verdicts):
                if v is not None and v.outcome == "ok":
                    systems[i].release_grammar(v.pin)

        try:
            async with trio.open_nursery() as nursery:
                for i in range(len(systems)):
                    nursery.start_soon(one, i)
        except BaseException:
            release_all()
            raise
        done = [v for v in verdicts if v is not None]
        bad = (next((v for v in done if v.outcome == "refused"), None)
               or next((v for v in done if v.outcome != "ok"), None))
        if bad is not None:
            release_all()
            return bad
        ours = next(self._ids)
        self._pins[ours] = [v.pin for v in done]
        return GrammarVerdict("ok", pin=ours)

    def release_grammar(self, pin: int) -> None:
        for system, theirs in zip(self.systems, self._pins.pop(pin, ())):
            system.release_grammar(theirs)

    def forget_pins(self, engine: int) -> None:
        """Engine `engine` and those after it have left: their pins went with them."""
        for pins in self._pins.values():
            del pins[engine:]

    async def control(self, command: Control) -> ControlResult:
        systems = list(self.systems)  # the engines of now (one may join or leave meanwhile)
        results: list[ControlResult] = [ControlResult(False)] * len(systems)

        async def one(i: int) -> None:
            results[i] = await systems[i].control(command)

        async with trio.open_nursery() as nursery:
            for i in range(len(systems)):
                nursery.start_soon(one, i)
        refusal = next((r for r in results if not r.ok), None)
        if refusal is not None and command.command in _UNDO:
            await self._undo(command, [i for i, r in enumerate(results) if r.ok])
        return refusal or results[0]

    async def _undo(self, command: Control, applied: list[int]) -> None:
        """A load refused by one engine is unloaded from those that took it: the front end
        registers no name for it, so a slot kept there would never be freed."""
        undo = Control(_UNDO[command.command], command.args)
        with trio.CancelScope(shield=True):  # the caller leaving must not leak the slot
            for i in applied:
                if i >= len(self.systems):
                    continue  # that engine has left, its slots with it
                result = await self.systems[i].control(undo)
                if not result.ok:
                    log.warning("engine %d: undoing %s failed: %s", i, command.command,
                                result.error)

    def close_submissions(self) -> None:
        for s in self.systems:
            s.close_submissions()


async def run_data_parallel(
    cores: Sequence[EngineCore],
    tokenizer: PreTrainedTokenizerFast,
    *,
    capacity: int,
    model_name: str,
    on_fatal: Callable[[BaseException], None],
    admission_window: AdmissionWindow = DEFAULT_WINDOW,
    report_timings: bool = False,
    channel_capacity: int | None = None,
    task_status: trio.TaskStatus[DataParallelSystem] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Starts one actor system per core (engine label i) and reports the fan-out handle;
    returns once every one has ended. `capacity` bounds the whole server; each engine
    gathers its own bursts within `admission_window`; `channel_capacity` (default
    `capacity`) sizes each engine's channels: the most the whole server may ever admit."""
    stopped = trio.Event()
    handle: DataParallelSystem | None = None
    try:
        async with trio.open_nursery() as nursery:

            async def spawn(core: EngineCore) -> ActorSystem:
                i = len(handle.systems) if handle is not None else len(systems)
                system = await nursery.start(partial(
                    run_actor_system, core, tokenizer, capacity=channel_capacity or capacity,
                    model_name=model_name, on_fatal=on_fatal, engine_index=i,
                    admission_window=admission_window, report_timings=report_timings))
                nursery.start_soon(_watch, i, core, system, on_fatal)
                return system

            systems: list[ActorSystem] = []
            for core in cores:
                systems.append(await spawn(core))
            handle = DataParallelSystem(
                systems, Admission(capacity), DataParallelRegistry([s.registry for s in systems]),
                DataParallelMetrics(systems), list(cores), spawn, stopped)
            nursery.start_soon(_cancel_when_stopped, handle, nursery.cancel_scope)
            task_status.started(handle)
    finally:
        stopped.set()
        for core in handle.cores if handle is not None else cores:
            close = getattr(core, "close", None)
            if close is not None:
                close()


async def _watch(i: int, core: EngineCore, system: ActorSystem,
                 on_fatal: Callable[[BaseException], None]) -> None:
    """An idle engine actor does not talk to its core, so a dead child would go unseen until
    the next request placed there: poll the process instead, and fail as the actor would."""
    alive = getattr(core, "alive", None)
    if alive is None:
        return
    while alive():
        await trio.sleep(WATCH_INTERVAL_S)
    if system.stopped.is_set():
        return
    log.critical("engine core %d (pid %s) died; failing its requests", i,
                 getattr(core, "pid", None))
    system.registry.fail_all(ServerFailed())
    on_fatal(EngineCoreDied(f"engine core {i} exited"))


async def _cancel_when_stopped(handle: DataParallelSystem, scope: trio.CancelScope) -> None:
    """Once every actor system has ended, the watchers end too (an engine that left has
    ended before it left the list)."""
    while (running := [s for s in handle.systems if not s.stopped.is_set()]):
        await running[0].stopped.wait()
    scope.cancel()
