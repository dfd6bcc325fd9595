"""Burst admission (actors.runtime.burst): the rules of the idle engine's wait on a virtual
clock, the engine actor taking a burst into one step on the real default model (and an
abort during the wait), and the burst's prompts tokenized together (prompt_prep) with the
results of one encode per text."""

from __future__ import annotations

from dataclasses import replace

import pytest
import trio
import trio.testing

from actors.config import AdmissionWindow
from actors.errors import PromptTooLong, RequestRefused, TokenOutOfVocab
from actors.messages import Admit, Generate
from actors.params.sampling import SamplingParams
from actors.runtime.burst import STEP_FRACTION, Arrivals
from actors.runtime.engine_actor import BATCH_CREDITS, EngineActor
from actors.runtime.messages import (
    AbortChoices,
    BatchMessage,
    EngineInbox,
    NoMoreAdmits,
    StepTokens,
)
from actors.runtime.prompt_bounds import PromptCharBound
from actors.runtime.prompt_prep import PromptPreparer
from actors.runtime.request import PromptInput, RequestState
from server_helpers import default_tokenizer, offline_llm

WINDOW = AdmissionWindow(cap_s=0.050, quiet_s=0.002)
PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def _req(name: str, tokens: int, n: int = 1) -> Admit:
    return Admit(f"{name}-0", (1,) * tokens, Generate(replace(PARAMS, n=n)), arrival_time=0.0)


def _run(fn) -> None:
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def test_window_settings_are_checked():
    assert AdmissionWindow().enabled and not AdmissionWindow(cap_s=0).enabled
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            AdmissionWindow(cap_s=bad)
        with pytest.raises(ValueError):
            AdmissionWindow(quiet_s=bad)


def test_lone_request_waits_only_the_rest_of_the_quiet_gap():
    async def main() -> None:
        arrivals = Arrivals(WINDOW)
        arrivals.arrived(1)
        await trio.sleep(0.0005)  # its tokenization
        admitted = [_req("a", 10)]
        arrivals.settled(1)
        waited = await arrivals.gather(admitted, 2048, 128)
        assert waited == pytest.approx(0.0015)
        # Long after the last arrival: no wait at all.
        await trio.sleep(1)
        assert await arrivals.gather(admitted, 2048, 128) == 0

    _run(main)


def test_waits_for_requests_being_tokenized_then_for_quiet():
    async def main() -> None:
        arrivals = Arrivals(WINDOW)
        admitted = [_req("a", 10)]
        arrivals.arrived(1)
        arrivals.arrived(2)  # a request with two prompts
        arrivals.settled(1)

        async def front_door_and_tokenizer() -> None:
            await trio.sleep(0.009)  # beyond the quiet gap: what is pending keeps the wait
            arrivals.arrived(1)
            await trio.sleep(0.001)
            admitted.extend([_req("b", 10), _req("b1", 10)])
            arrivals.settled(2)
            await trio.sleep(0.0005)
            admitted.append(_req("c", 10))
            arrivals.settled(1)  # nothing pending, but c arrived 1.5 ms ago: wait on
            await trio.sleep(0.0003)
            arrivals.arrived(1)
            await trio.sleep(0.001)
            admitted.append(_req("d", 10))
            arrivals.settled(1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(front_door_and_tokenizer)
            waited = await arrivals.gather(admitted, 2048, 128)
        assert [r.request_id for r in admitted] == ["a-0", "b-0", "b1-0", "c-0", "d-0"]
        assert waited == pytest.approx(0.0108 + 0.002)  # d's arrival, then a quiet gap
        assert arrivals.pending == 0

    _run(main)


def test_cap_bounds_the_wait_and_adapts_to_the_step_time():
    async def main() -> None:
        arrivals = Arrivals(WINDOW)
        arrivals.arrived(2)
        arrivals.settled(1)  # the other one never comes in time
        assert await arrivals.gather([_req("a", 10)], 2048, 128) == pytest.approx(0.050)
        arrivals.note_step(0.040)
        assert arrivals.cap() == pytest.approx(STEP_FRACTION * 0.040)
        assert await arrivals.gather([_req("a", 10)], 2048, 128) == pytest.approx(0.010)
        arrivals.note_step(1.0)  # slow steps: the configured cap is the ceiling
        assert arrivals.cap() == pytest.approx(0.050)
        off = Arrivals(AdmissionWindow(cap_s=0))
        off.arrived(3)
        assert await off.gather([], 2048, 128) == 0

    _run(main)


def test_a_full_step_ends_the_wait():
    async def main() -> None:
        arrivals = Arrivals(WINDOW)
        arrivals.arrived(5)
        arrivals.settled(2)
        assert await arrivals.gather([_req("a", 1000), _req("b", 1048)], 2048, 128) == 0
        assert await arrivals.gather([_req("a", 10, n=3), _req("b", 10)], 2048, 4) == 0

    _run(main)


def _actor(core, arrivals: Arrivals):
    inbox_send, inbox_recv = trio.open_memory_channel[EngineInbox](8)
    batch_send, batch_recv = trio.open_memory_channel[BatchMessage](BATCH_CREDITS)
    credits = trio.Semaphore(BATCH_CREDITS)
    metrics_send, metrics_recv = trio.open_memory_channel[object](10_000)
    fatal: list[BaseException] = []
    actor = EngineActor(core, inbox_recv, batch_send, credits, metrics_send, fatal.append,
                        arrivals)
    return actor, inbox_send, batch_recv, credits, metrics_recv, fatal


def test_engine_actor_takes_a_burst_into_its_first_step():
    """Three requests, the last two still 'being tokenized' when the first reaches the idle
    engine: no step runs until they are in, then one step admits all three. An abort during
    the wait retires its request without it ever reaching the core."""
    core = offline_llm().engine
    ids = default_tokenizer()("Once upon a time", add_special_tokens=False)["input_ids"]
    # A cap and gap far beyond any scheduling delay: the test never depends on timing.
    arrivals = Arrivals(AdmissionWindow(cap_s=600, quiet_s=0))
    admitted: list[int] = []
    retired: dict[str, str] = {}

    def admit(rid: str) -> Admit:
        return Admit(f"{rid}-0", tuple(ids), Generate(PARAMS), arrival_time=0.0)

    async def main() -> None:
        actor, inbox, batch_recv, credits, metrics_recv, fatal = _actor(core, arrivals)

        async def consume() -> None:
            async with batch_recv:
                async for message in batch_recv:
                    retired.update((r.engine_id, r.reason) for r in message.retired)
                    credits.release()

        async def metrics() -> None:
            async for event in metrics_recv:
                if isinstance(event, StepTokens) and event.num_admitted_sequences:
                    admitted.append(event.num_admitted_sequences)

        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
            nursery.start_soon(consume)
            nursery.start_soon(metrics)
            arrivals.arrived(4)
            await inbox.send(admit("a"))
            await trio.testing.wait_all_tasks_blocked()
            assert not core.has_unfinished() and arrivals.pending == 3  # waiting, not stepping
            await inbox.send(admit("b"))
            await inbox.send(AbortChoices("b-0", None, "abort"))
            await inbox.send(admit("c"))
            await trio.testing.wait_all_tasks_blocked()
            assert not core.has_unfinished()
            await inbox.send(admit("d"))
            await inbox.send(NoMoreAdmits())
            with trio.fail_after(120):
                while len(retired) < 4:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        assert not fatal
        assert admitted == [3]  # a, c and d in one step; b aborted before the core saw it
        assert retired == {"a-0": "length", "b-0": "abort", "c-0": "length", "d-0": "length"}
        assert arrivals.pending == 0 and not core.has_unfinished()

    trio.run(main)


def _state(rid: str, prompts: list[PromptInput], **params) -> RequestState:
    return RequestState(rid, prompts, SamplingParams(max_tokens=4, **params),
                        max_model_len=1024)


def test_a_burst_is_tokenized_together_with_the_results_of_encode():
    tok = default_tokenizer()
    backend = tok.backend_tokenizer
    prep = PromptPreparer(backend, PromptCharBound(backend), tok.vocab_size)
    texts = ["Once upon a time", "The lighthouse keeper wrote", "héllo wörld ✓"]
    good = _state("good", [PromptInput(text=t) for t in texts]
                  + [PromptInput(text=texts[0], add_special_tokens=False),
                     PromptInput(render=lambda: "rendered text"),
                     PromptInput(token_ids=[1, 2, 3])])
    out_of_vocab = _state("oov", [PromptInput(token_ids=[tok.vocab_size + 5])])
    too_long = _state("long", [PromptInput(text="word " * 20_000)])

    def broken() -> str:
        raise RuntimeError("template failed")

    render_error = _state("render", [PromptInput(render=broken)])
    # Its first prompt's refusal is the one reported, not its second's.
    first_bad = _state("first", [PromptInput(token_ids=[]), PromptInput(text="x " * 20_000)])
    truncated = _state("trunc", [PromptInput(text=texts[1])], truncate_prompt_tokens=2)
    results = prep.prepare_each([good, out_of_vocab, too_long, render_error, first_bad,
                                 truncated])

    want = [backend.encode(t).ids for t in texts] + [
        backend.encode(texts[0], add_special_tokens=False).ids,
        backend.encode("rendered text").ids, [1, 2, 3]]
    assert [r.token_ids for r in results[0]] == want
    assert [r.text for r in results[0][:5]] == [*texts, texts[0], "rendered text"][:5]
    assert isinstance(results[1], TokenOutOfVocab)
    assert isinstance(results[2], PromptTooLong)
    assert isinstance(results[3], RuntimeError) and str(results[3]) == "template failed"
    assert isinstance(results[4], RequestRefused) and "empty" in str(results[4])
    cut = backend.encode(texts[1]).ids[-2:]
    assert results[5][0].token_ids == cut
    assert results[5][0].text == backend.decode(cut, skip_special_tokens=False)
