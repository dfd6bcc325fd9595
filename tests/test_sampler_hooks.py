"""The sampler's constrained-decoding seam on the real default model: a logits processor
and a token mask registered for one choice change its greedy output as they should, leave
the other rows of the batch alone, and are forgotten once the choice ends."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from actors import SamplingParams
from actors.core.engine import LLMEngine
from actors.core.runner.sampler import SamplingHooks
from actors.messages import Admit, Generate

pytestmark = pytest.mark.slow

MiB = 1 << 20
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def engine(default_model: tuple[Any, float]) -> LLMEngine:
    from actors.config import EngineConfig

    loaded = default_model[0]
    return LLMEngine(EngineConfig(model=str(loaded.source), dtype="float32",
                                  kv_cache_memory=64 * MiB, max_model_len=512), loaded=loaded)


def run(engine: LLMEngine, prompts: dict[str, list[int]], max_tokens: int = 8,
        hooks: dict[str, SamplingHooks] | None = None) -> dict[str, list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for rid, h in (hooks or {}).items():
        engine.runner.set_sampling_hooks(rid, 0, h)
    for rid, ids in prompts.items():
        engine.add(Admit(rid, tuple(ids), Generate(params), time.monotonic()))
    out: dict[str, list[int]] = {rid: [] for rid in prompts}
    while engine.has_unfinished():
        for o in engine.step().outputs:
            out[o.request_id].extend(o.new_token_ids)
    return out


@pytest.fixture(scope="module")
def prompt(engine: LLMEngine) -> list[int]:
    return engine.tokenizer.encode(PROMPT, add_special_tokens=False)


@pytest.fixture(scope="module")
def free(engine: LLMEngine, prompt: list[int]) -> list[int]:
    return run(engine, {"free": prompt})["free"]


class Ban:
    """Bans one token; records the outputs it was shown."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.seen: list[list[int]] = []

    def __call__(self, output_ids, logits) -> None:
        self.seen.append(list(output_ids))
        logits[self.token] = float("-inf")


class OnlyThese:
    """A token mask allowing a fixed set; records what it accepted."""

    def __init__(self, tokens: set[int]) -> None:
        self.tokens = tokens
        self.fills = 0
        self.accepted: list[int] = []

    def fill_bitmask(self, row: np.ndarray) -> None:
        assert row.dtype == np.int32 and (row == -1).all()  # arrives all ones
        self.fills += 1
        bits = np.zeros(row.shape[0], dtype=np.uint32)
        for t in self.tokens:
            bits[t // 32] |= np.uint32(1) << np.uint32(t % 32)
        row[:] = bits.view(np.int32)

    def accept(self, token_id: int) -> None:
        self.accepted.append(token_id)

    def rollback(self, num_tokens: int) -> None:
        del self.accepted[len(self.accepted) - num_tokens:]


def test_a_logits_processor_bans_a_token(engine, prompt, free) -> None:
    banned = free[2]
    ban = Ban(banned)
    got = run(engine, {"ban": prompt, "free2": prompt},
              hooks={"ban": SamplingHooks(logits_processors=(ban,))})
    assert got["ban"][:2] == free[:2]  # the same until the banned token would come
    assert got["ban"][2] != banned and banned not in got["ban"]
    assert got["free2"] == free  # the other row of the batch is untouched
    assert ban.seen == [got["ban"][:i] for i in range(8)]  # outputs so far, every step
    run(engine, {"next": prompt}, max_tokens=1)  # the plan after the end tells the runner
    assert not engine.runner._hooks and engine.runner._num_hooked == 0


def test_a_token_mask_restricts_output_to_its_set(engine, prompt, free) -> None:
    allowed = {free[1], free[3], 30, 28, 314}  # a few tokens, some not the greedy ones
    mask = OnlyThese(allowed)
    got = run(engine, {"mask": prompt, "free3": prompt},
              hooks={"mask": SamplingHooks(token_mask=mask)})
    assert set(got["mask"]) <= allowed and len(got["mask"]) == 8
    assert got["mask"] != free
    assert mask.fills == 8 and mask.accepted == got["mask"]
    assert got["free3"] == free


def test_a_token_mask_and_allowed_token_ids_combine(engine, prompt) -> None:
    mask = OnlyThese({30, 28, 314, 198})
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True,
                            allowed_token_ids=[28, 314, 7042])
    engine.runner.set_sampling_hooks("both", 0, SamplingHooks(token_mask=mask))
    engine.add(Admit("both", tuple(prompt), Generate(params), time.monotonic()))
    got: list[int] = []
    while engine.has_unfinished():
        for o in engine.step().outputs:
            got.extend(o.new_token_ids)
    assert len(got) == 6 and set(got) <= {28, 314}
