"""LoRA adapters for the Llama decoder: PEFT checkpoints, slot tensors, the batched apply.

An adapter adds ``scale * (x A^T) B^T`` to a projection's output (A [r, in], B [out, r],
scale = lora_alpha / r, or lora_alpha / sqrt(r) under rsLoRA). The base weights are never
merged, so one step can serve rows of several adapters and of the base model together
(the punica / S-LoRA scheme): every row carries the slot of its adapter (-1: base), rows
are grouped by slot, and each group adds its own delta.

Storage: ``LoraStacks`` holds ``max_loras`` slots per projection site of every layer, each
padded to ``max_lora_rank``. Our projections are fused (q/k/v as one matrix, gate/up as
another), so a site's A stacks its sub-targets' A rows ([n_sub * R, in]) and its B is
block-diagonal ([out, n_sub * R]): one pair of matmuls per site and group, and a target an
adapter lacks (or rank padding) is zeros, which add exactly nothing. ``scale`` is folded
into B when an adapter is written into its slot.

The model reads the step's ``LoraBatch`` from a thread-local (``active``), set by the
runner around the forward pass: the projection call sites of llama.py call ``apply``,
which returns at once when no row of the step has an adapter.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from actors.models.config import ModelConfig

__all__ = ["LoraAdapter", "LoraBatch", "LoraError", "LoraStacks", "active", "apply",
           "load_adapter"]

# PEFT target module -> (our fused site, sub-target index within it)
TARGETS: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv", 0), "k_proj": ("qkv", 1), "v_proj": ("qkv", 2),
    "o_proj": ("o", 0),
    "gate_proj": ("gate_up", 0), "up_proj": ("gate_up", 1),
    "down_proj": ("down", 0),
}
SITES = ("qkv", "o", "gate_up", "down")


class LoraError(ValueError):
    """An adapter that cannot be served (bad path, format, rank or shapes)."""


def _site_dims(cfg: ModelConfig, site: str) -> tuple[int, list[int]]:
    """(input size, output size of each sub-target) of a fused site."""
    if site == "qkv":
        return cfg.hidden_size, [cfg.q_size, cfg.kv_size, cfg.kv_size]
    if site == "o":
        return cfg.q_size, [cfg.hidden_size]
    if site == "gate_up":
        return cfg.hidden_size, [cfg.intermediate_size, cfg.intermediate_size]
    return cfg.intermediate_size, [cfg.hidden_size]


@dataclass(frozen=True)
class LoraAdapter:
    """A validated PEFT adapter: per (layer, PEFT target) its A [r, in] and B [out, r]."""

    path: str
    rank: int
    scale: float
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


def load_adapter(path: str | Path, cfg: ModelConfig, max_rank: int) -> LoraAdapter:
    """Reads ``adapter_config.json`` + ``adapter_model.safetensors`` (or ``.bin``) from a
    directory and checks it against the model; raises LoraError saying what is wrong."""
    from safetensors.torch import load_file

    d = Path(path)
    conf_file = d / "adapter_config.json"
    if not conf_file.is_file():
        raise LoraError(f"no adapter_config.json in {str(path)!r}")
    try:
        conf = json.loads(conf_file.read_text())
    except (OSError, ValueError) as exc:
        raise LoraError(f"adapter_config.json in {str(path)!r} is not valid JSON: {exc}") from exc
    rank = int(conf.get("r") or 0)
    if rank <= 0:
        raise LoraError("adapter_config.json has no positive rank 'r'")
    if rank > max_rank:
        raise LoraError(f"LoRA rank {rank} is greater than max_lora_rank {max_rank}.")
    for key, bad in (("use_dora", True), ("fan_in_fan_out", True)):
        if conf.get(key) == bad:
            raise LoraError(f"adapters with {key}={bad} are not supported")
    if conf.get("bias", "none") != "none":
        raise LoraError("adapters with trained biases (bias != 'none') are not supported")
    if conf.get("modules_to_save"):
        raise LoraError("adapters with modules_to_save are not supported")
    if conf.get("rank_pattern") or conf.get("alpha_pattern"):
        raise LoraError("adapters with per-module rank_pattern/alpha_pattern are not supported")
    alpha = float(conf.get("lora_alpha") or rank)
    scale = alpha / math.sqrt(rank) if conf.get("use_rslora") else alpha / rank

    st_file, bin_file = d / "adapter_model.safetensors", d / "adapter_model.bin"
    if st_file.is_file():
        tensors = load_file(str(st_file))
    elif bin_file.is_file():
        tensors = torch.load(str(bin_file), map_location="cpu", weights_only=True)
    else:
        raise LoraError(f"no adapter_model.safetensors in {str(path)!r}")

    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        parts = name.split(".")
        try:
            li = parts.index("layers")
            layer, target, which = int(parts[li + 1]), parts[-3], parts[-2]
        except (ValueError, IndexError) as exc:
            raise LoraError(f"adapter tensor {name!r} is not a layer projection") from exc
        if target not in TARGETS or which not in ("lora_A", "lora_B"):
            raise LoraError(f"adapter tensor {name!r}: only q/k/v/o_proj and "
                            "gate/up/down_proj LoRA weights are supported")
        if not 0 <= layer < cfg.num_layers:
            raise LoraError(f"adapter tensor {name!r}: the model has {cfg.num_layers} layers")
        pairs.setdefault((layer, target), {})[which] = t
    weights = {}
    for (layer, target), ab in pairs.items():
        if set(ab) != {"lora_A", "lora_B"}:
            raise LoraError(f"layer {layer} {target}: lora_A and lora_B must both be present")
        site, sub = TARGETS[target]
        in_size, outs = _site_dims(cfg, site)
        a, b = ab["lora_A"], ab["lora_B"]
        if tuple(a.shape) != (rank, in_size) or tuple(b.shape) != (outs[sub], rank):
            raise LoraError(f"layer {layer} {target}: A {tuple(a.shape)} / B {tuple(b.shape)} "
                            f"do not fit rank {rank} and the model's {in_size} -> {outs[sub]}")
        weights[(layer, target)] = (a.float(), b.float())
    if not weights:
        raise LoraError(f"adapter in {str(path)!r} holds no LoRA weights")
    return LoraAdapter(str(path), rank, scale, weights)


class LoraStacks:
    """``max_loras`` slots of adapter weights for every site of every layer."""

    def __init__(self, cfg: ModelConfig, max_loras: int, max_rank: int,
                 dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        """dtype, device: the model's activations' (the deltas are added to them)."""
        self.cfg, self.max_loras, self.max_rank = cfg, max_loras, max_rank
        self.device = torch.device(device)
        r = max_rank
        self.a: dict[str, torch.Tensor] = {}  # site -> [layers, slots, n_sub * R, in]
        self.b: dict[str, torch.Tensor] = {}  # site -> [layers, slots, out, n_sub * R]
        for site in SITES:
            in_size, outs = _site_dims(cfg, site)
            n = len(outs)
            self.a[site] = torch.zeros(cfg.num_layers, max_loras, n * r, in_size, dtype=dtype,
                                       device=device)
            self.b[site] = torch.zeros(cfg.num_layers, max_loras, sum(outs), n * r, dtype=dtype,
                                       device=device)

    def write(self, slot: int, adapter: LoraAdapter) -> None:
        """Puts an adapter into a slot (zeroing what was there first)."""
        self.clear(slot)
        r, rk = self.max_rank, adapter.rank
        for (layer, target), (a, b) in adapter.weights.items():
            site, sub = TARGETS[target]
            _, outs = _site_dims(self.cfg, site)
            lo = sum(outs[:sub])
            self.a[site][layer, slot, sub * r: sub * r + rk] = a
            self.b[site][layer, slot, lo: lo + outs[sub], sub * r: sub * r + rk] = b * adapter.scale

    def clear(self, slot: int) -> None:
        for site in SITES:
            self.a[site][:, slot].zero_()
            self.b[site][:, slot].zero_()

    def batch(self, row_slots: np.ndarray) -> LoraBatch | None:
        """The step's grouping of its rows by slot (-1: base); None when no row has one."""
        used = np.unique(row_slots)
        used = used[used >= 0]
        if not len(used):
            return None
        if len(used) == 1 and (row_slots == used[0]).all():
            return LoraBatch(self, [(int(used[0]), None)])
        groups = [(int(s), torch.from_numpy(np.flatnonzero(row_slots == s)).to(self.device))
                  for s in used]
        return LoraBatch(self, groups)


class LoraBatch:
    """One step's adapter groups: (slot, its row indices; None = every row)."""

    __slots__ = ("stacks", "groups")

    def __init__(self, stacks: LoraStacks,
                 groups: list[tuple[int, torch.Tensor | None]]) -> None:
        self.stacks, self.groups = stacks, groups

    def add_(self, y: torch.Tensor, x: torch.Tensor, layer: int, site: str) -> None:
        # F.linear (A and B are in weight layout): ``x @ a.T`` on a strided view takes a
        # path ~70x slower on CPU for these small shapes. On the CPU the products run on
        # one torch thread: they are tiny, and torch's parallel regions leave workers
        # spinning on the cores the core's own thread pool runs the next layer on (240
        # products a step: 47 ms on two torch threads, 15 ms on one, here).
        a_all, b_all = self.stacks.a[site][layer], self.stacks.b[site][layer]
        threads = torch.get_num_threads() if y.device.type == "cpu" else 1
        if threads > 1:
            torch.set_num_threads(1)
        try:
            for slot, rows in self.groups:
                a, b = a_all[slot], b_all[slot]
                if rows is None:
                    y.add_(F.linear(F.linear(x, a), b))
                else:
                    y.index_add_(0, rows, F.linear(F.linear(x.index_select(0, rows), a), b))
        finally:
            if threads > 1:
                torch.set_num_threads(threads)


_local = threading.local()


@contextmanager
def active(batch: LoraBatch | None) -> Iterator[None]:
    """Makes ``batch`` the adapters of the forward pass run inside (this thread)."""
    prev = getattr(_local, "batch", None)
    _local.batch = batch
    try:
        yield
    finally:
        _local.batch = prev


def apply(y: torch.Tensor, x: torch.Tensor, layer: int, site: str) -> torch.Tensor:
    """y (a projection of x) plus the active adapters' deltas for their rows, in place."""
    batch = getattr(_local, "batch", None)
    if batch is not None:
        batch.add_(y, x, layer, site)
    return y
