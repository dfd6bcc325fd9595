"""loader/weights.py: the one checkpoint copy loop, on a module small enough to read.

The model classes' own name maps are covered by loading real checkpoints (test_models,
test_families, test_pooling, test_whisper_model); here the loop's rules: parts land in
their rows, a fused parameter may come whole, shapes are checked per part, what is never
written is named, absent parts can load as zeros.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from actors.loader.weights import Place, load_checkpoint


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Parameter(torch.full((5, 2), float("nan")))  # parts of 2, 1, 2 rows
        self.bias = nn.Parameter(torch.full((5,), float("nan")))
        self.norm = nn.Parameter(torch.full((2,), float("nan")))


_PARTS = {"q": ("qkv", 0), "k": ("qkv", 1), "v": ("qkv", 2), "qkv": ("qkv", None),
          "q_b": ("bias", 0), "k_b": ("bias", 1), "v_b": ("bias", 2), "norm": ("norm", None)}


def _place(hf: str) -> Place | None:
    return _PARTS.get(hf)


def _parts(name: str) -> tuple[int, ...] | None:
    return (2, 1, 2) if name in ("qkv", "bias") else None


def _load(weights: list[tuple[str, torch.Tensor]], **kw) -> _Tiny:
    m = _Tiny()
    load_checkpoint(m, weights, _place, _parts, **kw)
    return m


def _full() -> list[tuple[str, torch.Tensor]]:
    return [("q", torch.tensor([[1.0, 2], [3, 4]])), ("k", torch.tensor([[5.0, 6]])),
            ("v", torch.tensor([[7.0, 8], [9, 10]])), ("q_b", torch.tensor([1.0, 2])),
            ("k_b", torch.tensor([3.0])), ("v_b", torch.tensor([4.0, 5])),
            ("norm", torch.tensor([0.5, 0.25]))]


def test_parts_are_stacked_by_rows_in_order() -> None:
    m = _load(_full()[::-1])  # the order of the checkpoint does not matter
    assert torch.equal(m.qkv, torch.arange(1.0, 11).reshape(5, 2))
    assert torch.equal(m.bias, torch.arange(1.0, 6))


def test_a_fused_parameter_may_come_whole() -> None:
    whole = torch.arange(10.0).reshape(5, 2)
    m = _load([("qkv", whole)] + [w for w in _full() if w[0] not in "qkv"])
    assert torch.equal(m.qkv, whole)


def test_skip_and_convert() -> None:
    m = _load(_full() + [("rotary", torch.zeros(3))], skip=lambda hf: hf == "rotary",
              convert=lambda name, t: t + 1 if name == "norm" else t)
    assert torch.equal(m.norm, torch.tensor([1.5, 1.25]))
    assert torch.equal(m.qkv[0], torch.tensor([1.0, 2]))


def test_a_tensor_with_no_home_is_named() -> None:
    with pytest.raises(KeyError, match="'rotary' has no matching parameter"):
        _load(_full() + [("rotary", torch.zeros(3))])


def test_a_part_of_the_wrong_shape_is_named() -> None:
    bad = [(n, torch.zeros(2, 2)) if n == "k" else (n, t) for n, t in _full()]
    with pytest.raises(ValueError, match=r"k: checkpoint shape \(2, 2\) != expected \(1, 2\)"):
        _load(bad)


def test_what_was_never_written_is_named_part_by_part() -> None:
    with pytest.raises(ValueError, match=r"lacks 2 tensors: qkv#1, norm$"):
        _load([w for w in _full() if w[0] not in ("k", "norm")])
    with pytest.raises(ValueError, match=r"lacks 7 tensors: qkv#0, qkv#1, qkv#2, bias#0, "
                                         r"bias#1 \.\.\.$"):
        _load([])


def test_absent_parts_can_load_as_zeros() -> None:
    m = _load([w for w in _full() if w[0] != "k_b"],
              absent_zero=lambda name: (1,) if name == "bias" else ())
    assert torch.equal(m.bias, torch.tensor([1.0, 2, 0, 4, 5]))
    with pytest.raises(ValueError, match=r"lacks 1 tensors: qkv#1$"):
        _load([w for w in _full() if w[0] not in ("k", "k_b")],
              absent_zero=lambda name: (1,) if name == "bias" else ())
