"""LoRA adapters on the real default model: PEFT adapters made with ``peft`` (random A and
nonzero B), our logits against transformers + peft's merged model on the same fp32 weights,
and one batch mixing three adapters and the base model equal to each run alone."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from actors.core.engine import EngineConfig, LLMEngine
from actors.messages import Control
from actors.params.sampling import SamplingParams
from hf_reference import gguf_reference
from lora_helpers import ALL_TARGETS, make_adapter

pytestmark = pytest.mark.slow

MiB = 1 << 20
# (rank, alpha, targets, rslora)
ADAPTERS = {
    "a": (8, 16, ALL_TARGETS, False),
    "b": (4, 8, ["q_proj", "v_proj"], False),
    "c": (16, 8, ["o_proj", "down_proj", "up_proj"], True),
}
PROMPT = "The capital of France is a city where many people like to walk along the river and"


@pytest.fixture(scope="module")
def reference(default_model_path: Path) -> Any:
    return gguf_reference(default_model_path)


@pytest.fixture(scope="module")
def adapters(reference: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """name -> (directory, transformers model with the adapter merged)."""
    out = {}
    for i, (name, (r, alpha, targets, rslora)) in enumerate(ADAPTERS.items()):
        d = tmp_path_factory.mktemp(f"lora-{name}")
        out[name] = (d, make_adapter(reference, d, seed=100 + i, rank=r, alpha=alpha,
                                     targets=targets, rslora=rslora))
    return out


def make_engine(loaded: Any, **overrides: Any) -> LLMEngine:
    args: dict[str, Any] = dict(model=str(loaded.source), dtype="float32",
                                kv_cache_memory=64 * MiB, max_model_len=512,
                                enable_lora=True, max_loras=3, max_lora_rank=16)
    args.update(overrides)
    return LLMEngine(EngineConfig(**args), loaded=loaded)


@pytest.fixture(scope="module")
def engine(default_model: tuple[Any, float], adapters: dict[str, Any]) -> LLMEngine:
    eng = make_engine(default_model[0])
    for i, (name, (d, _)) in enumerate(adapters.items(), start=1):
        res = eng.control(Control("load_lora_adapter", (("lora_id", i), ("path", str(d)))))
        assert res.ok, res.error
    return eng


LORA_IDS = {"base": 0, "a": 1, "b": 2, "c": 3}


def run(eng: LLMEngine, jobs: list[tuple[str, str]], max_tokens: int = 8) -> dict[str, Any]:
    """jobs: (request id, adapter name); all queued before the first step."""
    ids = eng.tokenizer.encode(PROMPT, add_special_tokens=False)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                            logprobs=0)
    for rid, name in jobs:
        eng.add_request(rid, ids, params, arrival_time=time.monotonic(),
                        lora_id=LORA_IDS[name])
    toks: dict[str, list[int]] = {rid: [] for rid, _ in jobs}
    lps: dict[str, list[float]] = {rid: [] for rid, _ in jobs}
    cached: dict[str, int] = {}
    batch_sizes = []
    while eng.has_unfinished():
        batch = eng.step()
        batch_sizes.append(len(batch.outputs))
        for o in batch.outputs:
            toks[o.request_id] += o.new_token_ids
            lps[o.request_id] += [lp.logprob for lp in o.new_logprobs or ()]
            cached[o.request_id] = o.num_cached_tokens
    return {"ids": ids, "tokens": toks, "logprobs": lps, "cached": cached,
            "max_batch": max(batch_sizes)}


@pytest.mark.parametrize("name", ["a", "b", "c"])
def test_logits_match_peft_merged(engine: LLMEngine, adapters: dict[str, Any],
                                  reference: Any, name: str) -> None:
    got = run(engine, [(f"parity-{name}", name)])
    toks, lps = got["tokens"][f"parity-{name}"], got["logprobs"][f"parity-{name}"]
    merged = adapters[name][1]
    full = torch.tensor([got["ids"] + toks])
    with torch.no_grad():
        ref_lp = torch.log_softmax(merged(full).logits[0].float(), -1)
        base_lp = torch.log_softmax(reference(full).logits[0].float(), -1)
    n = len(got["ids"])
    rows = range(n - 1, n - 1 + len(toks))
    assert toks == [int(ref_lp[r].argmax()) for r in rows]
    want = torch.tensor([float(ref_lp[r, t]) for r, t in zip(rows, toks)])
    assert torch.allclose(torch.tensor(lps), want, atol=2e-3), (lps, want)
    # The adapter changes the model: the base's logprobs of these tokens differ.
    base = torch.tensor([float(base_lp[r, t]) for r, t in zip(rows, toks)])
    assert (base - want).abs().max() > 0.05


def test_mixed_batch_equals_each_alone(engine: LLMEngine) -> None:
    names = ["base", "a", "b", "c"]
    alone = {n: run(engine, [(f"alone-{n}", n)]) for n in names}
    mixed = run(engine, [(f"mix-{n}", n) for n in names])
    assert mixed["max_batch"] == 4  # every step ran the four together
    for n in names:
        assert mixed["tokens"][f"mix-{n}"] == alone[n]["tokens"][f"alone-{n}"]
        assert torch.allclose(torch.tensor(mixed["logprobs"][f"mix-{n}"]),
                              torch.tensor(alone[n]["logprobs"][f"alone-{n}"]), atol=1e-4)
    # Different adapters really produced different continuations.
    assert len({tuple(mixed["tokens"][f"mix-{n}"]) for n in names}) > 1
    # The prompt (> one block) ran before under every adapter; the cache hits only under
    # the same adapter, never across.
    assert all(mixed["cached"][f"mix-{n}"] > 0 for n in names)
    fresh = run(engine, [("fresh-base", "base")])
    assert fresh["cached"]["fresh-base"] > 0


def test_no_block_shared_across_adapters(default_model: tuple[Any, float],
                                         adapters: dict[str, Any]) -> None:
    eng = make_engine(default_model[0], max_loras=1)
    res = eng.control(Control("load_lora_adapter", (("lora_id", 1), ("path",
                                                                      str(adapters["a"][0])))))
    assert res.ok
    first = run(eng, [("base-1", "base")])
    assert first["cached"]["base-1"] == 0
    on_adapter = run(eng, [("a-1", "a")])
    assert on_adapter["cached"]["a-1"] == 0  # the base's blocks are not the adapter's
    again = run(eng, [("a-2", "a")])
    assert again["cached"]["a-2"] > 0


def test_load_refusals_and_deferred_unload(default_model: tuple[Any, float],
                                           adapters: dict[str, Any], tmp_path: Path) -> None:
    eng = make_engine(default_model[0], max_loras=1, max_lora_rank=8)

    def load(lid: int, path: Any) -> Any:
        return eng.control(Control("load_lora_adapter", (("lora_id", lid), ("path", str(path)))))

    res = load(1, adapters["c"][0])  # rank 16 > 8
    assert not res.ok and "rank 16 is greater than max_lora_rank 8" in res.error
    res = load(1, tmp_path / "nowhere")
    assert not res.ok and res.reason == "invalid" and "adapter_config.json" in res.error
    assert load(1, adapters["a"][0]).ok
    res = load(2, adapters["b"][0])
    assert not res.ok and res.reason == "conflict" and "max-loras" in res.error
    # Unload while a request runs under it: the request finishes on the adapter; the slot
    # is reclaimed once nothing uses it.
    ids = eng.tokenizer.encode(PROMPT, add_special_tokens=False)
    eng.add_request("inflight", ids, SamplingParams(temperature=0.0, max_tokens=4,
                                                    ignore_eos=True), lora_id=1)
    eng.step()
    assert eng.control(Control("unload_lora_adapter", (("lora_id", 1),))).ok
    assert not load(2, adapters["b"][0]).ok  # still in use
    outs = []
    while eng.has_unfinished():
        outs += eng.step().outputs
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert load(2, adapters["b"][0]).ok
    assert not eng.control(Control("unload_lora_adapter", (("lora_id", 1),))).ok
