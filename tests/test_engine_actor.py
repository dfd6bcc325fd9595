"""The engine actor on the real default model: controls answered between steps, per-choice
and whole-request aborts, and shutdown by closure (admit channel closed -> the actor finishes
what the core holds -> the batch channel closes)."""

from __future__ import annotations

import threading
from dataclasses import replace

import trio

from actors.messages import Control, RequestOutput
from actors.params.sampling import SamplingParams
from actors.runtime.engine_actor import BATCH_CREDITS, EngineActor
from actors.runtime.request import Choice, EngineRequest, Registry, RequestState
from server_helpers import offline_llm


def _request(registry: Registry, rid: str, ids: list[int], params: SamplingParams
             ) -> tuple[RequestState, EngineRequest]:
    state = RequestState(rid, [], params, max_model_len=1024)
    req = EngineRequest(f"{rid}-0", 0, params, ids, admitted_at=state.arrival,
                        choices=[Choice(i, i) for i in range(params.n)])
    state.engine_requests.append(req)
    registry.add(state)
    registry.add_engine_requests(state)
    return state, req


def _actor(core, registry: Registry):
    """An engine actor over `core` with its channels: (actor, admit_send, batch_recv,
    fatal failures). The metrics channel is large enough never to drop."""
    admit_send, admit_recv = trio.open_memory_channel[EngineRequest](8)
    batch_send, batch_recv = trio.open_memory_channel[tuple[RequestOutput, ...]](BATCH_CREDITS)
    metrics_send, _metrics_recv = trio.open_memory_channel[object](10_000)
    fatal: list[BaseException] = []
    actor = EngineActor(core, registry, admit_recv, batch_send, metrics_send, fatal.append)
    return actor, admit_send, batch_recv, fatal


def test_controls_aborts_and_closure():
    core = offline_llm().engine
    ids = offline_llm().tokenizer("Once upon a time", add_special_tokens=False)["input_ids"]
    params = SamplingParams(n=3, seed=1, temperature=1.0, max_tokens=40, ignore_eos=True)
    seen: dict[tuple[str, int], list[int]] = {}
    finished: dict[tuple[str, int], str | None] = {}

    async def main() -> None:
        registry = Registry()
        actor, admit_send, batch_recv, fatal = _actor(core, registry)
        first_tokens = trio.Event()

        async def consume() -> None:
            async with batch_recv:
                async for outputs in batch_recv:
                    for out in outputs:
                        seen.setdefault((out.request_id, out.index), []).extend(
                            out.new_token_ids)
                        if out.finished:
                            finished[out.request_id, out.index] = out.finish_reason
                    if len(seen) == 4:  # a-0 choices 0, 1, 2 and b-0
                        first_tokens.set()
                    actor.credits.release()

        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
            nursery.start_soon(consume)
            ok = await actor.control(Control("reset_prefix_cache"))
            assert ok.ok and ok.error is None
            bad = await actor.control(Control("no_such_command"))
            assert not bad.ok and "no_such_command" in (bad.error or "")

            state, req = _request(registry, "a", ids, params)
            other_state, other = _request(registry, "b", ids, replace(params, n=1))
            await admit_send.send(req)
            await admit_send.send(other)
            with trio.fail_after(60):
                await first_tokens.wait()
            # A control while requests run is answered between two steps.
            assert (await actor.control(Control("reset_prefix_cache"))).ok
            actor.abort_nowait(req, 1)  # one choice: its siblings go on
            actor.abort_nowait(other)  # a whole request
            await admit_send.aclose()  # closure: the actor ends once the core is empty
            with trio.fail_after(60):
                await state.retired.wait()
                await other_state.retired.wait()
        assert not fatal
        assert [c.finish_reason for c in req.choices] == ["length", "abort", "length"]
        assert other.choices[0].finish_reason == "abort" and other.done
        assert len(seen[("a-0", 0)]) == 40 and len(seen[("a-0", 2)]) == 40
        assert len(seen[("a-0", 1)]) < 40 and ("a-0", 1) not in finished
        assert not core.has_unfinished()
        # Closed: the actor no longer steps, a control is applied at once.
        assert (await actor.control(Control("reset_prefix_cache"))).ok

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
        registry = Registry()
        actor, admit_send, batch_recv, fatal = _actor(core, registry)

        async def consume() -> None:
            async with batch_recv:
                async for _ in batch_recv:
                    actor.credits.release()

        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
            nursery.start_soon(consume)
            state, _req = _request(registry, "a", ids, params)
            await admit_send.send(_req)
            # Given up on at once: pause?mode=wait waits for the drain, far longer.
            with trio.move_on_after(0.01) as scope:
                await actor.control(Control("pause", (("mode", "wait"),)))
            assert scope.cancelled_caught
            with trio.fail_after(60):
                await state.retired.wait()
            await trio.sleep(0.2)  # the drained pause is answered to nobody meanwhile
            assert not fatal
            assert (await actor.control(Control("is_paused"))).value is True
            assert (await actor.control(Control("resume"))).ok
            result = await actor.control(Control("load_lora_adapter",
                                                 (("lora_id", 1), ("path", "/nonexistent"))))
            assert not result.ok  # LoRA is off in this engine: refused, never fatal
            await admit_send.aclose()
        assert not fatal
        assert core.on_loop["load_lora_adapter"] is False
        assert core.on_loop["reset_prefix_cache"] is True  # light: between steps, on the loop

    trio.run(main)
