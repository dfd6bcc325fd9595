"""server.frontend.service on the real default model, in this process: the API-neutral
deltas a stream yields add up to what collect returns, logprobs carry each token's decoded
text, usage counts every prompt and choice, an idle wait is reported without losing output,
and a consumer that stops early retires its request.

One server (Supervisor) for the module, driven without HTTP: the service is what the
OpenAI routes read today and what the Anthropic and Responses routes will read.
"""

from __future__ import annotations

from contextlib import aclosing

import pytest
import trio
from server_helpers import BASE_ARGS, default_tokenizer, free_port

from actors.params.sampling import SamplingParams
from actors.runtime.request import PromptInput
from server.frontend import service
from server.frontend.context import context_of
from server.frontend.service import ChoiceDelta, Finished, Idle

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "Once upon a time"]


async def with_server(body) -> None:
    """Run `body(srv)` against a freshly started in-process server."""
    from server.cli import parse_args
    from server.supervisor import Supervisor

    config = parse_args(["--port", str(free_port()), *BASE_ARGS, "--log-level", "warning"])
    async with trio.open_nursery() as nursery:
        sup = await nursery.start(Supervisor(config).run)
        try:
            await body(sup.srv)
        finally:
            nursery.cancel_scope.cancel()


def inputs() -> list[PromptInput]:
    return [PromptInput(text=p, add_special_tokens=True) for p in PROMPTS]


async def idle(srv, timeout: float = 10) -> None:
    """Retirement is asynchronous (the reaper): wait until no request is registered and
    every admission slot is back."""
    with trio.fail_after(timeout):
        while len(srv.registry) or srv.admission.in_use:
            await trio.sleep(0.01)


async def test_stream_adds_up_to_collect():
    tok = default_tokenizer()
    params = SamplingParams(max_tokens=6, temperature=0.0, logprobs=2)

    async def body(srv) -> None:
        gen = await service.start(context_of(srv), "streamed", inputs(), params)
        assert gen.num_choices == 2 and gen.n == 1
        assert [p.text for p in gen.prompts] == PROMPTS
        deltas: list[ChoiceDelta] = []
        finished = []
        async with aclosing(gen.stream()) as events:
            async for ev in events:
                (deltas if isinstance(ev, ChoiceDelta) else finished).append(ev)
        assert len(finished) == 1 and isinstance(finished[0], Finished)

        ctx = context_of(srv)
        whole = await (await service.start(ctx, "collected", inputs(), params)).collect()
        for choice in whole.choices:
            mine = [d for d in deltas if d.index == choice.index]
            assert "".join(d.text for d in mine) == choice.text
            assert [t for d in mine for t in d.token_ids] == choice.token_ids
            assert len(choice.token_ids) == 6 and choice.finish_reason == "length"
            assert mine[-1].finish_reason == "length"
            # generated_tokens counts the choice's tokens so far, this delta's included.
            counts = [d.generated_tokens for d in mine]
            assert counts[-1] == 6 and counts == sorted(counts)
            assert all(d.generated_tokens - len(d.token_ids) == prev
                       for d, prev in zip(mine, [0, *counts[:-1]]))
            streamed_lps = [e for d in mine for e in d.logprobs]
            assert [e.token_id for e in choice.logprobs] == choice.token_ids
            assert [(e.token_id, e.logprob) for e in streamed_lps] == \
                [(e.token_id, e.logprob) for e in choice.logprobs]
            for entry in choice.logprobs:
                assert entry.text == tok.decode([entry.token_id], skip_special_tokens=False)
                assert entry.bytes == entry.text.encode()
                assert len(entry.top) == 2
                assert entry.top[0].logprob >= entry.top[1].logprob
                for alt in entry.top:
                    assert alt.text == tok.decode([alt.token_id], skip_special_tokens=False)
        prompt_tokens = sum(len(tok(p)["input_ids"]) for p in PROMPTS)
        assert whole.usage.prompt_tokens == prompt_tokens
        assert whole.usage.completion_tokens == 12
        assert whole.usage.total_tokens == prompt_tokens + 12
        assert finished[0].usage == whole.usage
        assert whole.prompt_logprobs == [None, None]
        await idle(srv)

    await with_server(body)


async def test_idle_is_reported_and_nothing_is_lost():
    params = SamplingParams(max_tokens=8, temperature=0.0)

    async def body(srv) -> None:
        ctx = context_of(srv)
        reference = await (await service.start(ctx, "ref", inputs()[:1], params)).collect()
        gen = await service.start(context_of(srv), "idle", inputs()[:1], params)
        idles, text = 0, ""
        # Far shorter than one engine step (tens of ms here), yet long enough that the
        # waiting loop does not spin and starve the step thread of the GIL.
        async with aclosing(gen.stream(idle_after=2e-3)) as events:
            async for ev in events:
                idles += isinstance(ev, Idle)
                if isinstance(ev, ChoiceDelta):
                    text += ev.text
        assert idles > 0
        assert text == reference.choices[0].text
        await idle(srv)

    await with_server(body)


async def test_prompt_logprobs_and_n():
    params = SamplingParams(max_tokens=2, temperature=1.0, seed=3, n=2, prompt_logprobs=1)

    async def body(srv) -> None:
        whole = await (await service.start(context_of(srv), "n", inputs(), params)).collect()
        assert [c.index for c in whole.choices] == [0, 1, 2, 3]
        assert len(whole.prompt_logprobs) == 2
        gen_prompts = [len(default_tokenizer()(p)["input_ids"]) for p in PROMPTS]
        for lps, length in zip(whole.prompt_logprobs, gen_prompts):
            assert lps is not None and len(lps) == length
            assert lps[0] is None
            assert all(e is not None and e.rank >= 1 and e.text for e in lps[1:])
            assert len(lps[1:]) == length - 1
        await idle(srv)

    await with_server(body)


async def test_a_consumer_that_stops_early_retires_the_request():
    params = SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True)

    async def body(srv) -> None:
        gen = await service.start(context_of(srv), "early", inputs()[:1], params)
        assert len(srv.registry) == 1
        async with aclosing(gen.stream()) as events:
            async for ev in events:
                if isinstance(ev, ChoiceDelta) and ev.token_ids:
                    break
        # 1000 tokens take ten seconds or more here; retiring takes a step or two.
        await idle(srv, timeout=3)

    await with_server(body)
