"""ProcessEngineCore: the engine core in a child process gives the tokens the in-process
LLMEngine gives for the same calls, raises the child's refusals in the parent with their
type, and leaves no process behind."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from actors.config import EngineConfig
from actors.core.engine import LLMEngine
from actors.core.process import EngineCoreDied, ProcessEngineCore
from actors.core.protocol import EngineCore
from actors.errors import RequestRefused
from actors.messages import Abort, Admit, Control, Generate, TokenBatch
from actors.params.sampling import SamplingParams

pytestmark = pytest.mark.slow

MiB = 1 << 20
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
SAMPLED = SamplingParams(n=4, seed=3, temperature=1.0, max_tokens=6, ignore_eos=True)


def config(loaded: Any) -> EngineConfig:
    return EngineConfig(model=str(loaded.source), dtype="float32", kv_cache_memory=64 * MiB,
                        max_model_len=256, num_threads=1)


def drive(core: EngineCore, prompts: list[list[int]]) -> list[TokenBatch]:
    """A greedy prompt and a seeded n=4 one; choice 2 is aborted after the third step."""
    core.add(Admit("greedy", tuple(prompts[0]), Generate(GREEDY), 0.0))
    core.add(Admit("sampled", tuple(prompts[1]), Generate(SAMPLED), 1.0))
    batches = []
    while core.has_unfinished():
        batches.append(core.step())
        if len(batches) == 3:
            core.abort(Abort("sampled", 2))
    return batches


@pytest.fixture(scope="module")
def loaded(default_model: tuple[Any, float]) -> Any:
    return default_model[0]


@pytest.fixture(scope="module")
def prompts(loaded: Any) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(loaded.model_dir))
    return [tok.encode(t, add_special_tokens=False)
            for t in ("The capital of France is", "Once upon a time")]


@pytest.fixture(scope="module")
def in_process(loaded: Any, prompts: list[list[int]]) -> list[TokenBatch]:
    engine = LLMEngine(config(loaded), loaded=loaded)
    return drive(engine, prompts)


def tokens(batches: list[TokenBatch]) -> dict[tuple[str, int], list[int]]:
    out: dict[tuple[str, int], list[int]] = {}
    for b in batches:
        for o in b.outputs:
            out.setdefault((o.request_id, o.index), []).extend(o.new_token_ids)
    return out


def test_child_process_core_matches_in_process(loaded, prompts, in_process) -> None:
    with ProcessEngineCore(config(loaded)) as core:
        assert isinstance(core, EngineCore)
        assert core.info.vocab_size == loaded.config.vocab_size
        assert core.info.max_model_len == 256
        batches = drive(core, prompts)
        assert batches == in_process  # every output, step by step, to the bit
        got = tokens(batches)
        assert len(got[("greedy", 0)]) == 6
        assert [len(got[("sampled", i)]) for i in (0, 1, 3)] == [6, 6, 6]
        assert len(got[("sampled", 2)]) < 6  # aborted midway
        assert len({tuple(got[("sampled", i)]) for i in (0, 1, 3)}) == 3
        stats = core.stats()
        assert (stats.num_running, stats.num_waiting, stats.kv_usage) == (0, 0, 0.0)
        assert core.control(Control("reset_prefix_cache")).ok
        assert not core.control(Control("no such command")).ok

        with pytest.raises(RequestRefused, match="at least one token"):
            core.add(Admit("empty", (), Generate(GREEDY), 2.0))
        with pytest.raises(RequestRefused, match="max_model_len"):
            core.add(Admit("long", tuple(range(1, 300)), Generate(GREEDY), 2.0))
        core.add(Admit("twice", tuple(prompts[0]), Generate(GREEDY), 2.0))
        with pytest.raises(RequestRefused, match="already in flight"):
            core.add(Admit("twice", tuple(prompts[0]), Generate(GREEDY), 2.0))
        assert core.has_unfinished()  # a refusal leaves the core as it was
        proc = core._proc
    assert proc.exitcode == 0  # closed cleanly, and reaped
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)
    with pytest.raises(EngineCoreDied):
        core.step()


def test_a_dead_child_is_reported_not_waited_for(loaded) -> None:
    core = ProcessEngineCore(config(loaded))
    os.kill(core.pid, signal.SIGKILL)
    with pytest.raises(EngineCoreDied):
        core.step()
    core.close()
    assert core._proc.exitcode == -signal.SIGKILL
