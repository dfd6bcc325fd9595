"""Shared fixtures. Tests never reach the network: the hub is forced offline before
transformers is imported anywhere."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The default model's GGUF file (skips when the package is not installed)."""
    from actors.loader import DefaultModelMissing, default_model_path

    try:
        return default_model_path()
    except DefaultModelMissing as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def llmserve_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private conversion cache for this test session (never the user's ~/.cache)."""
    path = tmp_path_factory.mktemp("llmserve-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMSERVE_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="session")
def default_model(llmserve_cache_dir: Path, default_model_path: Path) -> tuple[Any, float]:
    """(LoadedModel, seconds) for the default model in float32, converted into the session
    cache on first use (so the first load includes the GGUF conversion)."""
    import torch

    from actors.loader import load_model

    torch.set_num_threads(2)
    t0 = time.perf_counter()
    loaded = load_model(default_model_path, dtype="float32")
    return loaded, time.perf_counter() - t0


def _randomize_(model: Any, seed: int) -> None:
    # transformers initialises norms to 1 and biases to 0; parity on such weights would not
    # notice a missing norm or bias, so every parameter gets random values.
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                p.copy_(0.5 * noise)
            else:
                p.copy_(0.08 * noise)


TINY_SIZES = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


@pytest.fixture
def make_tiny_model(tmp_path: Path) -> Callable[..., Path]:
    """make_tiny_model(kind, **config overrides) -> a saved HF directory with random weights.

    kind: "llama", "mistral" or "qwen2" (transformers' config classes); extra keyword
    ``max_shard_size`` is passed to save_pretrained to force sharding.
    """
    counter = iter(range(1000))

    def make(kind: str = "llama", max_shard_size: str | None = None, **overrides: Any) -> Path:
        import torch
        from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

        config_cls = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config}[kind]
        cfg = config_cls(**{**TINY_SIZES, **overrides})
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        i = next(counter)
        _randomize_(model, seed=1234 + i)
        out = tmp_path / f"{kind}-{i}"
        kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
        model.save_pretrained(out, **kwargs)
        return out

    return make


@pytest.fixture
def tiny_llama_dir(make_tiny_model: Callable[..., Path]) -> Path:
    return make_tiny_model("llama")
