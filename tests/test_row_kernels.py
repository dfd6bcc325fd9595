"""Each row's kernel family by its role (actors.models.row_kernels): the split kernel sends
generated-token rows to the dot kernels on the stored matrix and prompt rows to the tiles on
the prompt matrix, row for row; and the default model, its quantized matrices' prompt rows on
bf16 copies where the CPU has AMX, gives a sequence the same tokens and logprobs alone, in a
batch that mixes prompts with decodes, and with its prompt chunked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import llmcore
import numpy as np
import pytest
import torch

from actors import LLM, SamplingParams
from actors.models import row_kernels


def _quantized(n: int, k: int, seed: int) -> llmcore.PackedWeight:
    gguf = pytest.importorskip("gguf")
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.05
    blocks = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1)
    return llmcore.PackedWeight.from_gguf(3, blocks, n, k)


def test_split_sends_each_row_to_its_family() -> None:
    stored = _quantized(48, 96, 1)
    copy = llmcore.PackedWeight(stored.rows(np.arange(48), torch.empty((48, 96),
                                                                      dtype=torch.bfloat16)))
    x = torch.randn(21, 96)
    bias = torch.randn(48)
    gen = np.zeros(21, bool)
    gen[[0, 3, 4, 20]] = True
    kernel = row_kernels.split_kernel(stored, copy)
    dot = row_kernels.dot(x, stored, bias, torch.empty(21, 48))
    tiles = row_kernels.tiles(x, copy, bias, torch.empty(21, 48))
    with row_kernels.active(row_kernels.RowSplit.of(gen)):
        got = kernel(x, None, bias, torch.full((21, 48), float("nan")))
    # a row's result does not depend on the others: each equals its family's, bit for bit
    assert torch.equal(got[gen], dot[gen]) and torch.equal(got[~gen], tiles[~gen])
    with row_kernels.active(row_kernels.RowSplit.of(np.ones(21, bool))):
        assert torch.equal(kernel(x, None, bias, torch.empty(21, 48)), dot)
    with row_kernels.active(row_kernels.RowSplit.of(np.zeros(21, bool))):
        assert torch.equal(kernel(x, None, bias, torch.empty(21, 48)), tiles)
    assert torch.equal(kernel(x, None, bias, torch.empty(21, 48)), tiles)  # no split: prompt


@pytest.fixture(scope="module")
def invariant_llm(default_model_path: Path) -> Any:
    if default_model_path.suffix != ".gguf":
        pytest.skip("the default model is not a GGUF file here")
    llm = LLM(str(default_model_path), quantization="gguf", enable_prefix_caching=False,
              max_num_batched_tokens=256)
    return llm


def _run(llm: Any, prompts: list[str], n: int = 12) -> list[tuple[str, list[float]]]:
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, logprobs=1))
    return [(o.outputs[0].text, [lp.logprob for lp in o.outputs[0].logprobs]) for o in outs]


def test_default_model_rows_are_invariant(invariant_llm: Any) -> None:
    model = invariant_llm.engine.loaded.model
    assert model._row_kernels
    if llmcore.isa.current()["linear"] == "amx":
        assert model._prompt_copies, "prompt rows should run on bf16 copies where AMX is"
    prompts = [f"Tell me about harbour number {i}. " * (3 + 14 * (i % 4)) for i in range(10)]
    alone = [_run(invariant_llm, [p])[0] for p in prompts]
    # all at once: the long prompts are chunked at 256 tokens and share steps with the
    # decodes of the short ones
    together = _run(invariant_llm, prompts)
    assert together == alone
