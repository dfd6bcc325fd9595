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


@pytest.fixture(scope="session", autouse=True)
def llmserve_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private conversion cache for this test session (never the user's ~/.cache),
    set for every test and every server a test starts: each GGUF is converted once per
    session (Gemma 3's conversion alone takes ~25 s here)."""
    path = tmp_path_factory.mktemp("llmserve-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMSERVE_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="session")
def default_model(llmserve_cache_dir: Path, default_model_path: Path) -> tuple[Any, float]:
    """(LoadedModel, seconds) for the default model in float32, from the session's
    conversion cache (converted there by whichever test or server needed it first)."""
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

    kind: a transformers model_type ("llama", "gemma3_text", "qwen3_moe", ...); extra keyword
    ``max_shard_size`` is passed to save_pretrained to force sharding.
    """
    counter = iter(range(1000))

    def make(kind: str = "llama", max_shard_size: str | None = None, **overrides: Any) -> Path:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.for_model(kind, **{**TINY_SIZES, **overrides})
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


class IsaRecord:
    """Which kernel variants the tests executed, and which they skipped and why."""

    def __init__(self) -> None:
        self.runs: dict[str, set[str]] = {}
        self.skips: dict[tuple[str, str], str] = {}

    def ran(self, family: str, isa: str) -> None:
        self.runs.setdefault(family, set()).add(isa)

    def skipped(self, family: str, isa: str, why: str) -> None:
        self.skips[(family, isa)] = why


_ISA_RECORD = IsaRecord()


@pytest.fixture(scope="session")
def isa_record() -> IsaRecord:
    return _ISA_RECORD


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Says which CPU kernel variants the differential tests ran against scalar."""
    rec = _ISA_RECORD
    if not rec.runs and not rec.skips:
        return
    import llmcore

    order = llmcore.isa.ISAS
    lines = [f"CPU: runs {llmcore.cpu_isa()} at most; built: {llmcore.build_features()}"]
    for family in sorted(set(rec.runs) | {f for f, _ in rec.skips}):
        ran = sorted(rec.runs.get(family, ()), key=order.index)
        line = f"{family}: variants checked against scalar/reference: {', '.join(ran) or 'none'}"
        skips = [f"{i} ({why})" for (f, i), why in sorted(rec.skips.items()) if f == family]
        if skips:
            line += f"; skipped: {', '.join(skips)}"
        lines.append(line)
    terminalreporter.write_sep("=", "kernel ISA variants executed")
    for line in lines:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def plain_server() -> Iterator[Any]:
    """One `python -m server` with the test defaults and no other flag, shared by the modules
    that need nothing else (each server start costs seconds of CI time). Tests using it
    must leave it as they found it: no pause, sleep or weight change."""
    from server_helpers import ServerProcess

    srv = ServerProcess().wait_ready()
    yield srv
    assert srv.stop() == 0, srv.log()
