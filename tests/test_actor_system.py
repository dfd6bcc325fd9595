"""The engine side without HTTP: actors.runtime.system on the real default model.

A front end builds RequestStates, submits them through the handle and reads their Outboxes;
closing submissions ends every actor by closure once the work in flight is done.
"""

from __future__ import annotations

import trio

from actors.messages import Control
from actors.params.sampling import SamplingParams
from actors.runtime.request import PromptInput, RequestState
from actors.runtime.system import ActorSystem, run_actor_system
from server_helpers import default_tokenizer, offline_llm


async def read_all(state: RequestState) -> dict[int, str]:
    texts = {i: "" for i in range(state.num_choices)}
    while not state.outbox.done:
        for u in await state.outbox.get():
            texts[u.index] += u.text
    return texts


def test_submit_control_and_close():
    llm = offline_llm()
    ids = default_tokenizer()("Once upon a time", add_special_tokens=False)["input_ids"]
    params = SamplingParams(n=2, seed=3, temperature=1.0, max_tokens=12, ignore_eos=True)
    want = [o.text for o in llm.generate([ids], params)[0].outputs]
    fatal: list[BaseException] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            system: ActorSystem = await nursery.start(
                lambda task_status: run_actor_system(
                    llm.engine, default_tokenizer(), capacity=8, model_name="m",
                    on_fatal=fatal.append, task_status=task_status))
            assert system.capacity == 8 and system.info.vocab_size == llm.engine.info.vocab_size
            states = [RequestState(f"r{i}", [PromptInput(token_ids=list(ids))], params,
                                   max_model_len=system.info.max_model_len) for i in range(2)]
            for state in states:
                assert system.admission.try_acquire(state.num_choices)
                system.registry.add(state)
                await system.submit(state)
            assert (await system.control(Control("reset_prefix_cache"))).ok
            # Shutdown by closure while both requests are still in flight: they finish.
            system.close_submissions()
            got = [await read_all(state) for state in states]
            with trio.fail_after(60):
                await system.stopped.wait()
            for state in states:
                assert state.retired.is_set()
                system.registry.remove(state)
        for texts in got:
            assert [texts[0], texts[1]] == want
        assert not fatal and not llm.engine.has_unfinished()

    trio.run(main)
