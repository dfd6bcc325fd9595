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


def test_logprobs_carry_their_token_texts():
    """The tokenizer actor decodes every token a logprob names (sampled, alternatives, prompt
    tokens) in its worker thread: each TokenLogprob carries text and top_texts."""
    llm = offline_llm()
    tok = default_tokenizer()
    ids = tok("The capital of France is", add_special_tokens=False)["input_ids"]
    params = SamplingParams(max_tokens=5, temperature=0.0, logprobs=3, prompt_logprobs=2)

    def text(t: int) -> str:
        return tok.backend_tokenizer.decode([t], skip_special_tokens=False)

    async def main() -> tuple[list, list]:
        async with trio.open_nursery() as nursery:
            system: ActorSystem = await nursery.start(
                lambda task_status: run_actor_system(
                    llm.engine, tok, capacity=4, model_name="m", on_fatal=print,
                    task_status=task_status))
            state = RequestState("lp", [PromptInput(token_ids=list(ids))], params,
                                 max_model_len=system.info.max_model_len)
            system.registry.add(state)
            await system.submit(state)
            lps, prompt_lps = [], None
            while not state.outbox.done:
                for u in await state.outbox.get():
                    lps.extend(u.logprobs)
                    prompt_lps = u.prompt_logprobs or prompt_lps
            system.close_submissions()
        return lps, prompt_lps

    lps, prompt_lps = trio.run(main)
    assert len(lps) == 5 and prompt_lps is not None and len(prompt_lps) == len(ids)
    for lp in [*lps, *prompt_lps[1:]]:
        assert lp.text == text(lp.token_id) and lp.text
        assert len(lp.top_texts) == len(lp.top) >= 2
        assert list(lp.top_texts) == [text(t) for t, _ in lp.top]


def test_prefill_backlog_counts_prompts_until_their_first_output():
    """--max-num-queued-tokens' count: each choice's prompt from its admit to its first
    output or its retirement (an abort included), n choices n times."""
    llm = offline_llm()
    ids = default_tokenizer()("Once upon a time", add_special_tokens=False)["input_ids"]
    params = SamplingParams(n=2, seed=3, temperature=1.0, max_tokens=4)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            system: ActorSystem = await nursery.start(
                lambda task_status: run_actor_system(
                    llm.engine, default_tokenizer(), capacity=8, model_name="m",
                    on_fatal=print, task_status=task_status))
            assert (await system.control(Control("pause", (("mode", "keep"),)))).ok
            states = [RequestState(f"r{i}", [PromptInput(token_ids=list(ids))], params,
                                   max_model_len=system.info.max_model_len) for i in range(2)]
            for state in states:
                assert system.admission.try_acquire(state.num_choices)
                system.registry.add(state)
                await system.submit(state)
                await state.ready.wait()
            assert system.queued_prompt_tokens == 2 * 2 * len(ids)  # held before any step
            system.abort(states[1])
            with trio.fail_after(30):
                await states[1].retired.wait()
            assert system.queued_prompt_tokens == 2 * len(ids)
            assert (await system.control(Control("resume"))).ok
            await read_all(states[0])
            assert system.queued_prompt_tokens == 0
            system.close_submissions()
            with trio.fail_after(60):
                await system.stopped.wait()

    trio.run(main)
