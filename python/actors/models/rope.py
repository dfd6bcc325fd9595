"""RotaryEmbedding: a cos/sin cache indexed by absolute positions, applied in place.

The cache is computed in float32 exactly as transformers computes its per-call tables
(position * inv_freq in float32, then cos/sin), so the flattened batch can gather rows
by position instead of recomputing them each step.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def inverse_frequencies(
    head_dim: int, theta: float, scaling: dict[str, Any] | None
) -> torch.Tensor:
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim)
    )
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "linear":  # positions divided by the factor
        return inv_freq / scaling["factor"]
    return _llama3_scale(inv_freq, scaling)


def _llama3_scale(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    # Llama 3.1: long wavelengths are divided by `factor`, short ones kept, the band between
    # interpolated smoothly.
    factor = s["factor"]
    low, high = s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(torch.nn.Module):
    """Holds cos/sin of shape [max_positions, head_dim // 2]; rotate-half (NeoX) layout."""

    def __init__(
        self, head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        inv_freq = inverse_frequencies(head_dim, theta, scaling)
        pos = torch.arange(max_positions, dtype=torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]
        # Not persistent: derived from config, never saved with the weights.
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin rows [T, 1, head_dim // 2] for the batch's positions; gathered once per
        step and shared by every layer."""
        if positions.numel() and int(positions.max()) >= self.cos.shape[0]:
            raise ValueError(
                f"position {int(positions.max())} exceeds the RoPE table "
                f"({self.cos.shape[0]} positions)"
            )
        cos = self.cos.index_select(0, positions).unsqueeze(1).to(dtype)
        sin = self.sin.index_select(0, positions).unsqueeze(1).to(dtype)
        return cos, sin


def apply_rotary_(q: torch.Tensor, k: torch.Tensor, cos_sin: tuple[torch.Tensor, ...]) -> None:
    """Rotates q [T, Hq, D] and k [T, Hk, D] in place."""
    cos, sin = cos_sin
    _rotate_(q, cos, sin)
    _rotate_(k, cos, sin)


def _rotate_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    # x1' = x1*cos - x2*sin ; x2' = x2*cos + x1*sin. Both read the old x1/x2, so keep copies.
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    x1.copy_(o1)
    x2.copy_(o2)
