"""KV cache groups: which layers share a block table, and where their KV lives.

A model whose layers mix full and sliding-window attention (Gemma 3: five of six layers see
the last 512 positions; Gemma 2: every other layer; Mistral: all layers) needs, in a
sliding layer, only the KV of the window of each token still to compute. As vLLM's hybrid
KV cache manager does, the layers are cut into groups of equal size, each group of one
window (None: full attention); a sequence holds one block table per group, and the KV
manager frees a sliding group's blocks once they fall wholly behind the window of every
token the sequence has left to compute. A long sequence then holds about window /
block_size blocks per sliding group, whatever its length.

Every group has ``num_slots`` layers (the fewest layers any window has; a window whose
layer count it does not divide gets a last, smaller group), so a block id means the same
bytes in every group: one page of ``num_slots`` layers' K and V. All groups draw their
blocks from one ``llmcore.BlockPool``. The caches are ``num_slots`` K tensors and as many V
tensors, each [num_blocks, num_kv_heads, block_size, head_size]; layer l keeps its KV in
slot tensor ``slot_of[l]``, at the blocks of its sequence's table of group ``group_of[l]``::

    Gemma 3 270M: 18 layers, layers 5, 11, 17 full, the others window 512 -> 6 groups of 3
      group 0 (full)        layers  5 11 17      slots 0 1 2
      group 1 (window 512)  layers  0  1  2      slots 0 1 2
      group 2 (window 512)  layers  3  4  6      slots 0 1 2
      ...                                         (a block id: 3 layers' K and V)

Group 0 is the first full-attention group when the model has one (its blocks carry the
published prefix-cache events). A model with no sliding layer, or with the hybrid manager
turned off (the windows still apply in the attention kernel; no block is freed early), is
one group of every layer: one slot per layer, the single block table of before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["KVGroups", "max_blocks_per_seq"]


@dataclass(frozen=True, slots=True)
class KVGroups:
    windows: tuple[int | None, ...]  # per group: the window its blocks are freed by
    layers: tuple[tuple[int, ...], ...]  # per group: its layers, in order (slot = index)
    num_slots: int  # layers per group (the last group of a window may have fewer)

    @classmethod
    def single(cls, num_layers: int) -> KVGroups:
        """Every layer in one group that keeps all its blocks."""
        return cls((None,), (tuple(range(num_layers)),), num_layers)

    @classmethod
    def from_windows(cls, windows: Sequence[int | None], hybrid: bool = True) -> KVGroups:
        """Groups for per-layer windows (None or 0: full attention). ``hybrid`` False, or
        no sliding layer: one group that keeps every block."""
        wins = [int(w) if w else None for w in windows]
        if not hybrid or all(w is None for w in wins) or not wins:
            return cls.single(len(wins))
        by_window: dict[int | None, list[int]] = {}
        for layer, w in enumerate(wins):
            by_window.setdefault(w, []).append(layer)
        # Full attention first (group 0), then the windows by their first layer.
        order = sorted(by_window, key=lambda w: (w is not None, by_window[w][0]))
        size = min(len(v) for v in by_window.values())
        g_windows: list[int | None] = []
        g_layers: list[tuple[int, ...]] = []
        for w in order:
            layers = by_window[w]
            for i in range(0, len(layers), size):
                g_windows.append(w)
                g_layers.append(tuple(layers[i: i + size]))
        return cls(tuple(g_windows), tuple(g_layers), size)

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def num_layers(self) -> int:
        return sum(len(g) for g in self.layers)

    def group_of(self) -> list[int]:
        """Per layer: its group."""
        out = [0] * self.num_layers
        for g, layers in enumerate(self.layers):
            for layer in layers:
                out[layer] = g
        return out

    def slot_of(self) -> list[int]:
        """Per layer: the slot tensor its KV lives in."""
        out = [0] * self.num_layers
        for layers in self.layers:
            for slot, layer in enumerate(layers):
                out[layer] = slot
        return out

    def max_blocks_per_seq(self, num_tokens: int, max_chunk: int, block_size: int) -> int:
        return max_blocks_per_seq(self.windows, num_tokens, max_chunk, block_size)

    def num_blocks(self, memory: int, block_bytes: int, max_model_len: int, max_chunk: int,
                   block_size: int) -> int:
        """The blocks of ``block_bytes`` (one page: num_slots layers) ``memory`` holds;
        ValueError when that is fewer than one sequence of max_model_len holds at once."""
        n = max(1, memory // block_bytes)
        need = self.max_blocks_per_seq(max_model_len, max_chunk, block_size)
        if n < need:
            raise ValueError(
                f"kv_cache_memory={memory} bytes holds {n} blocks of {block_size} tokens, "
                f"fewer than one sequence of max_model_len={max_model_len} needs ({need}); "
                "raise it or lower max_model_len")
        return n

    def describe(self) -> str:
        if self.num_groups == 1 and self.windows[0] is None:
            return f"{self.num_slots} layers a block"
        wins = ", ".join(str(w or "full") for w in self.windows)
        return f"{self.num_groups} KV cache groups of {self.num_slots} layers (windows {wins})"


def max_blocks_per_seq(windows: Sequence[int | None], num_tokens: int, max_chunk: int,
                       block_size: int) -> int:
    """The most blocks one sequence of ``num_tokens`` tokens holds at once over groups of
    these windows, computing at most ``max_chunk`` tokens a step: every block in a full
    group; in a sliding group the blocks of [s - window + 1, s + chunk) for the step that
    computes from s, one more for a misaligned start and one for a parent whose window
    stays at its fork point (KVManager._trim)."""
    full = -(-num_tokens // block_size)
    total = 0
    for w in windows:
        bounded = full if w is None else -(-(w - 1 + max_chunk) // block_size) + 2
        total += min(full, bounded)
    return total
