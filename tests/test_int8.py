"""int8 weights for any checkpoint (``--quantization int8``): the Q8_0 blocks made at load
are gguf-py's, and a model's logits on them stay near the fp32 path of the same weights
(max abs difference and top-1 agreement over a fixed input, bounds measured and stated)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from actors.loader import load_model
from actors.loader.int8 import q8_0_blocks
from accuracy_helpers import accuracy, logits_of

gguf = pytest.importorskip("gguf")


def test_blocks_are_gguf_q8_0() -> None:
    """Scales to the bit; quants equal except at exact halves (we round them to even,
    gguf-py away from zero), which move by one step."""
    w = torch.randn(256, 192, generator=torch.Generator().manual_seed(5)) * 0.05
    w[3, 32:64] = 0  # an all-zero block: scale 0, quants 0
    ref = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q8_0).reshape(256, 6, 34)
    got = q8_0_blocks(w).reshape(256, 6, 34)
    np.testing.assert_array_equal(got[..., :2], ref[..., :2])
    diff = got[..., 2:].view(np.int8).astype(int) - ref[..., 2:].view(np.int8).astype(int)
    scaled = w.reshape(256, 6, 32) / (w.reshape(256, 6, 32).abs().amax(-1, keepdim=True) / 127)
    ties = (scaled.abs() - scaled.abs().floor() == 0.5).numpy()
    assert (np.abs(diff) <= 1).all() and not diff[~ties].any()
    assert not got[3, 1].any()
    with pytest.raises(ValueError, match="multiple of 32"):
        q8_0_blocks(torch.zeros(4, 48))


def test_tiny_checkpoint_logits_against_fp32(make_tiny_model: Any) -> None:
    """A Hugging Face checkpoint (tiny random Qwen2: Llama with a qkv bias): every matrix in Q8_0,
    the logits of a 40-token input near the fp32 path of the same weights."""
    path: Path = make_tiny_model("qwen2")
    ref_model = load_model(path, dtype="float32")
    q = load_model(path, quantization="int8")
    assert q.model.weight_formats() == {"q8_0": 3 * 4 + 1}, q.model.weight_formats()
    ids = [int(i) for i in torch.randint(0, 320, (40,), generator=torch.Generator().manual_seed(1))]
    ref = logits_of(ref_model, ids)
    acc = accuracy(logits_of(q, ids), ref)
    print(f"tiny qwen2 int8 vs fp32 over {len(ids)} positions: {acc}, logits spread "
          f"{float(ref.std()):.2f}")
    # Measured: max 0.033 (logits' std 0.6), top-1 1.0. A wrong layout or scale is off by
    # the logits' whole spread.
    assert acc["max_abs"] < 0.1 and acc["top1"] >= 0.95, acc


TEXT = ("The history of the lighthouse begins with fires lit on hilltops to guide ships. "
        "Later, towers of stone carried lamps and mirrors, and keepers lived beside them, "
        "trimming wicks through the night so that sailors could find the harbour.")


@pytest.mark.slow
def test_default_model_logits_against_fp32(default_model: tuple[Any, float]) -> None:
    """The default model (its fp32 safetensors directory, a HF checkpoint): int8 against
    the fp32 path of the same weights over a fixed text, every position."""
    from transformers import AutoTokenizer

    fp32 = default_model[0]
    q = load_model(fp32.model_dir, quantization="int8")
    assert q.model.weight_formats() == {"q8_0": 121}, q.model.weight_formats()
    ids = AutoTokenizer.from_pretrained(str(fp32.model_dir)).encode(TEXT, add_special_tokens=False)
    acc = accuracy(logits_of(q, ids), logits_of(fp32, ids))
    print(f"default model int8 vs fp32 over {len(ids)} positions: {acc}")
    # Measured on AVX2: max 1.16-1.31, top-1 1.0 (the embedding kept fp32: 1.27, 0.978, so the
    # LM head is quantized too); as gguf's Q4_1 path, the int8 activations dominate.
    assert acc["max_abs"] < 2.0 and acc["top1"] >= 0.95, acc


def test_flag_reaches_the_engine_config() -> None:
    from server.cli import parse_args

    assert parse_args(["--quantization", "int8"]).engine.quantization == "int8"
    assert parse_args(["-q", "int8"]).engine.quantization == "int8"
