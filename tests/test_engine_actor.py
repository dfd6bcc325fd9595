"""The engine actor on the real default model, spoken to in messages only: controls answered
between steps, per-choice and whole-request aborts, refusals while paused, and shutdown
(NoMoreAdmits -> the actor finishes what the core holds -> the batch channel closes)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import trio

from actors.messages import Admit, Generate, Control
from actors.params.sampling import SamplingParams
from actors.runtime.engine_actor import BATCH_CREDITS, EngineActor
from actors.runtime.messages import (
    AbortChoices,
    BatchMessage,
    Delivery,
    EngineInbox,
    NoMoreAdmits,
    Retired,
)
from server_helpers import offline_llm


def _admit(rid: str, ids: list[int], params: SamplingParams) -> Admit:
    return Admit(f"{rid}-0", tuple(ids), Generate(params), arrival_time=time.monotonic())


def _actor(core):
    """An engine actor over `core` with its channels: (actor, inbox, batch_recv, credits,
    fatal failures). The metrics channel is large enough never to drop."""
    inbox_send, inbox_recv = trio.open_memory_channel[EngineInbox](32)
    batch_send, batch_recv = trio.open_memory_channel[BatchMessage](BATCH_CREDITS)
    credits = trio.Semaphore(BATCH_CREDITS)
    metrics_send, _metrics_recv = trio.open_memory_channel[object](10_000)
    fatal: list[BaseException] = []
    actor = EngineActor(core, inbox_recv, batch_send, credits, metrics_send, fatal.append)
    return actor, inbox_send, batch_recv, credits, fatal


def test_controls_aborts_and_closure():
    """Messages only: Admits in, AbortChoices for one choice and for a whole request, then
    NoMoreAdmits; every choice comes back Retired (beside the outputs) with its reason."""
    core = offline_llm().engine
    ids = offline_llm().tokenizer("Once upon a time", add_special_tokens=False)["input_ids"]
    params = SamplingParams(n=3, seed=1, temperature=1.0, max_tokens=40, ignore_eos=True)
    seen: dict[tuple[str, int], list[int]] = {}
    finished: dict[tuple[str, int], str | None] = {}
    retired: dict[tuple[str, int], str] = {}

    async def main() -> None:
        actor, inbox, batch_recv, credits, fatal = _actor(core)
        first_tokens = trio.Event()

        async def consume() -> None:
            async with batch_recv:
                async for message in batch_recv:
                    assert isinstance(message, Delivery)
                    for out in message.outputs:
                        assert (out.request_id, out.index) not in retired
                        seen.setdefault((out.request_id, out.index), []).extend(
                            out.new_token_ids)
                        if out.finished:
                            finished[out.request_id, out.index] = out.finish_reason
                    for r in message.retired:
                        assert isinstance(r, Retired)
                        assert (r.engine_id, r.index) not in retired  # once each
                        retired[r.engine_id, r.index] = r.reason
                    if len(seen) == 4:  # a-0 choices 0, 1, 2 and b-0
                        first_tokens.set()
                    credits.release()

        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
            nursery.start_soon(consume)
            ok = await actor.control(Control("reset_prefix_cache"))
            assert ok.ok and ok.error is None
            bad = await actor.control(Control("no_such_command"))
            assert not bad.ok and "no_such_command" in (bad.error or "")

            await inbox.send(_admit("a", ids, params))
            await inbox.send(_admit("b", ids, replace(params, n=1)))
            with trio.fail_after(60):
                await first_tokens.wait()
            # A control while requests run is answered between two steps.
            assert (await actor.control(Control("reset_prefix_cache"))).ok
            await inbox.send(AbortChoices("a-0", 1, "abort"))  # its siblings go on
            await inbox.send(AbortChoices("b-0", None, "abort"))  # a whole request
            await inbox.send(NoMoreAdmits())  # the actor ends once the core is empty
        assert not fatal
        assert retired == {("a-0", 0): "length", ("a-0", 1): "abort", ("a-0", 2): "length",
                           ("b-0", 0): "abort"}
        assert len(seen[("a-0", 0)]) == 40 and len(seen[("a-0", 2)]) == 40
        assert len(seen[("a-0", 1)]) < 40 and ("a-0", 1) not in finished
        assert not core.has_unfinished()
        # Ended: the actor no longer steps, a control is applied at once.
        assert (await actor.control(Control("reset_prefix_cache"))).ok

    trio.run(main)


def test_paused_admit_is_refused_by_message():
    """pause?mode=abort: an admit that arrives is answered Refused(GenerationPaused) and
    its choice Retired; the engine refuses new requests until resume (refusal())."""
    core = offline_llm().engine
    ids = offline_llm().tokenizer("Once upon a time", add_special_tokens=False)["input_ids"]
    params = SamplingParams(n=1, temperature=0.0, max_tokens=4)
    messages: list[object] = []

    async def main() -> None:
        actor, inbox, batch_recv, credits, fatal = _actor(core)

        async def consume() -> None:
            async with batch_recv:
                async for message in batch_recv:
                    messages.extend(message.retired)
                    credits.release()

        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
            nursery.start_soon(consume)
            assert actor.refusal() is None
            assert (await actor.control(Control("pause", (("mode", "abort"),)))).ok
            assert actor.refusal() is not None
            await inbox.send(_admit("p", ids, params))
            await inbox.send(NoMoreAdmits())
        assert not fatal and not core.has_unfinished()
        refused, gone = messages
        assert refused.engine_id == "p-0" and type(refused.error).__name__ == "GenerationPaused"
        assert gone == Retired("p-0", 0, "abort")

    trio.run(main)


class _Recording:
    """The real engine core, noting which commands ran on the Trio thread."""

    def __init__(self, core) -> None:
        self._core = core
        self.on_loop: dict[str, bool] = {}

    def __getattr__(self, name: str):
        return getattr(self._core, name)

    def control(self, command: Control):
        self.on_loop[command.command] = threading.current_thread() is threading.main_thread()
        return self._core.control(command)


def test_abandoned_controls_and_heavy_ones_off_the_loop():
    """A caller that leaves before its answer (a cancelled HTTP handler) is no failure: the
    actor keeps stepping, later controls are answered, nothing is fatal. Commands that load
    memory (a LoRA load included) run in the worker thread, never on the Trio thread."""
    core = _Recording(offline_llm().engine)
    ids = offline_llm().tokenizer("Once upon a time", add_special_tokens=False)["input_ids"]
    params = SamplingParams(n=1, temperature=0.0, max_tokens=60, ignore_eos=True)

    async def main() -> None:
        actor, inbox, batch_recv, credits, fatal = _actor(core)
        retired = trio.Event()

        async def consume() -> None:
            async with batch_recv:
                async for message in batch_recv:
                    if message.retired:
                        retired.set()
                    credits.release()

        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
            nursery.start_soon(consume)
            await inbox.send(_admit("a", ids, params))
            # Given up on at once: pause?mode=wait waits for the drain, far longer.
            with trio.move_on_after(0.01) as scope:
                await actor.control(Control("pause", (("mode", "wait"),)))
            assert scope.cancelled_caught
            with trio.fail_after(60):
                await retired.wait()
            await trio.sleep(0.2)  # the drained pause is answered to nobody meanwhile
            assert not fatal
            assert (await actor.control(Control("is_paused"))).value is True
            assert (await actor.control(Control("resume"))).ok
            result = await actor.control(Control("load_lora_adapter",
                                                 (("lora_id", 1), ("path", "/nonexistent"))))
            assert not result.ok  # LoRA is off in this engine: refused, never fatal
            await inbox.send(NoMoreAdmits())
        assert not fatal
        assert core.on_loop["load_lora_adapter"] is False
        assert core.on_loop["reset_prefix_cache"] is True  # light: between steps, on the loop

    trio.run(main)
