"""Checkpoint tensors -> a model's parameters: the one copy loop every model class uses.

A checkpoint names its tensors one way (transformers' names, or what loader/gguf.py and
loader/whisper.py write under those names), a model names its parameters another, and
some of our parameters are *fused*: several checkpoint tensors stacked by rows into one
matrix so that one product does the work of several (q/k/v -> ``qkv``, gate/up ->
``gate_up``, per expert as well, Whisper's cross-attention k/v -> ``cross_kv``). A model
class says only how its names map; ``load_checkpoint`` does the rest:

- ``place(checkpoint name)`` -> (our parameter, part index or None for the whole
  parameter), or None for a tensor that has no home (an error);
- ``parts(our name)`` -> the row count of each part of a fused parameter, in stacking
  order (part i fills rows ``sum(parts[:i])`` up to ``+ parts[i]``), or None for a
  parameter that is not fused. A fused parameter may also come whole (Phi-3's checkpoint
  ships q/k/v already fused, under our own name);
- ``skip(checkpoint name)``: tensors the model does not run (a vision tower, rotary
  tables, a tied LM head's stored copy);
- ``convert(our name, tensor)``: a change of value on the way in (Gemma's norms fold
  their +1 into the stored weight);
- ``absent_zero(our name)``: the parts that are zero when the checkpoint lacks them
  (Whisper's k projections have no bias).

Every tensor's shape is checked against its slice before the copy, and at the end every
parameter must have been written, whole or part by part. Errors name the tensor:
``KeyError`` for a tensor with no home, ``ValueError`` for a shape that does not fit and
for parameters never written (the first five named, parts as ``name#i``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

__all__ = ["Place", "load_checkpoint"]

# (our parameter name, part index within a fused parameter, or None for all of it)
Place = tuple[str, int | None]


@torch.no_grad()
def load_checkpoint(
    module: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    place: Callable[[str], Place | None],
    parts: Callable[[str], Sequence[int] | None],
    *,
    skip: Callable[[str], bool] | None = None,
    convert: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
    absent_zero: Callable[[str], Sequence[int]] | None = None,
) -> None:
    """Copies every (checkpoint name, tensor) of ``weights`` into ``module``'s parameter
    (or fused part) that ``place`` names, then checks that nothing was left unwritten."""
    # Tied parameters are reachable under each of their names (an LM head tied to the
    # embedding); the completeness check walks each tensor once.
    params = dict(module.named_parameters(remove_duplicate=False))
    written: set[str] = set()
    for hf_name, tensor in weights:
        if skip is not None and skip(hf_name):
            continue
        found = place(hf_name)
        if found is None or found[0] not in params:
            raise KeyError(f"checkpoint tensor {hf_name!r} has no matching parameter")
        name, part = found
        dst = params[name] if part is None else _part(params[name], parts(name), part,
                                                      hf_name, name)
        if tuple(dst.shape) != tuple(tensor.shape):
            raise ValueError(f"{hf_name}: checkpoint shape {tuple(tensor.shape)} != "
                             f"expected {tuple(dst.shape)}")
        if convert is not None:
            tensor = convert(name, tensor)
        dst.copy_(tensor)
        written.add(name if part is None else f"{name}#{part}")
    missing: list[str] = []
    for name, p in module.named_parameters():
        if name in written:
            continue
        rows = parts(name)
        if rows is None:
            missing.append(name)
            continue
        for i in absent_zero(name) if absent_zero is not None else ():
            if f"{name}#{i}" not in written:
                _part(p, rows, i, name, name).zero_()
                written.add(f"{name}#{i}")
        missing += [f"{name}#{i}" for i in range(len(rows)) if f"{name}#{i}" not in written]
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ValueError(f"checkpoint lacks {len(missing)} tensors: {shown}")


def _part(param: torch.Tensor, rows: Sequence[int] | None, part: int, hf_name: str,
          name: str) -> torch.Tensor:
    """Rows of part ``part`` of fused ``param`` (a view: copies into it land in place)."""
    if rows is None or not 0 <= part < len(rows):
        raise ValueError(f"{hf_name}: {name} has no part {part}")
    return param.narrow(0, sum(rows[:part]), rows[part])
