"""The weight-update transports (actors.core.weight_sources): a safetensors chunk's framing,
the checks against the model's catalog before any data is read, shared memory laid out as
vLLM's packed buffer, a path; and the weight-version spans a choice reports."""

from __future__ import annotations

import json
import re
import struct
from multiprocessing import shared_memory

import pytest
import torch
from actors.core.weight_sources import Catalog, WeightRefused, read_source, safetensors_header
from actors.runtime.request import Choice
from safetensors.torch import save, save_file

CATALOG = Catalog({"w": ((2, 3), "BF16"), "b": ((3,), "BF16")})


def raw_chunk(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def read(source: dict) -> dict:
    return dict(read_source(source, CATALOG))


def test_a_chunk_is_read_with_its_dtype():
    w = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    got = read({"kind": "chunk", "data": save({"w": w, "b": torch.ones(3)})})
    assert torch.equal(got["w"], w) and got["w"].dtype == torch.float32
    assert torch.equal(got["b"], torch.ones(3))


@pytest.mark.parametrize("header, data, words", [
    ({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 48]}}, b"\0" * 24,
     "lie outside"),
    ({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}}, b"\0" * 24,
     "20 bytes for shape [2, 3] of F32"),
    ({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2, "unknown dtype"),
    ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b"", "non-negative"),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12,
     "share bytes"),
    ([1, 2], b"", "not a JSON object"),
])
def test_broken_framing_is_refused(header, data, words):
    with pytest.raises(WeightRefused, match=re.escape(words)):
        safetensors_header(raw_chunk(header, data))


def test_framing_refusals_of_the_length_prefix():
    for data, words in [(b"\1\2", "fewer than 8"),
                        (struct.pack("<Q", 1 << 40), "a header of"),
                        (struct.pack("<Q", 50) + b"{}", "does not fit")]:
        with pytest.raises(WeightRefused, match=re.escape(words)):
            safetensors_header(data)


@pytest.mark.parametrize("tensors, words", [
    ({"w": torch.zeros(3, 2)}, "'w' has shape [3, 2], the model's is [2, 3]"),
    ({"x": torch.zeros(3)}, "'x' is not a weight of this model"),
    ({"b": torch.zeros(3, dtype=torch.int32)}, "'b' has dtype I32"),
    ({}, "holds no tensors"),
])
def test_the_catalog_names_the_tensor(tensors, words):
    with pytest.raises(WeightRefused, match=re.escape(words)):
        read({"kind": "chunk", "data": save(tensors)})


def test_a_refusal_comes_before_any_tensor():
    # the good tensor first, the bad one after: nothing is yielded at all
    source = read_source({"kind": "chunk", "data": save({"b": torch.ones(3),
                                                        "x": torch.ones(1)})}, CATALOG)
    with pytest.raises(WeightRefused, match=re.escape("'x'")):
        next(source)


def test_shared_memory_in_vllms_packed_layout():
    w = torch.randn(2, 3).to(torch.bfloat16)
    b = torch.randn(3)
    raw = w.view(torch.uint8).numpy().tobytes() + b.view(torch.uint8).numpy().tobytes()
    shm = shared_memory.SharedMemory(create=True, size=len(raw) + 5)  # room to spare
    try:
        shm.buf[:len(raw)] = raw
        source = {"kind": "shm", "shm_name": shm.name, "names": ["w", "b"],
                  "dtype_names": ["bfloat16", "float32"], "shapes": [[2, 3], [3]],
                  "tensor_sizes": [12, 12]}
        got = read(source)
        assert torch.equal(got["w"], w) and torch.equal(got["b"], b)
        with pytest.raises(WeightRefused, match=re.escape("tensor_sizes says 10 bytes")):
            read({**source, "tensor_sizes": [10, 12]})
        three = {"names": ["w", "b", "b"], "dtype_names": ["bfloat16", "float32", "float32"],
                 "shapes": [[2, 3], [3], [3]], "tensor_sizes": None}
        with pytest.raises(WeightRefused, match="holds 29 bytes; the tensors named take 36"):
            read({**source, **three})
    finally:
        shm.close()
        shm.unlink()
    with pytest.raises(WeightRefused, match=re.escape("no shared-memory segment")):
        read({**source, "tensor_sizes": None})
    with pytest.raises(WeightRefused, match=re.escape("shm_name must be")):
        read({**source, "shm_name": "../etc/passwd"})


def test_a_path_file_or_directory(tmp_path):
    save_file({"w": torch.ones(2, 3)}, str(tmp_path / "a.safetensors"))
    save_file({"b": torch.zeros(3)}, str(tmp_path / "b.safetensors"))
    assert set(read({"kind": "path", "path": str(tmp_path)})) == {"w", "b"}
    assert set(read({"kind": "path", "path": str(tmp_path / "b.safetensors")})) == {"b"}
    (tmp_path / "c.safetensors").write_bytes(b"junk")
    with pytest.raises(WeightRefused, match="c.safetensors: not a safetensors file"):
        read({"kind": "path", "path": str(tmp_path)})


def test_weight_version_spans_over_output_tokens():
    choice = Choice(0, 0)
    assert choice.version_spans() == ()
    for version, n in [("default", 1), ("default", 3), ("v1", 0), ("v1", 2), ("v2", 1)]:
        choice.track_version(version, n)
    assert choice.version_spans() == (("default", 0, 4), ("v1", 4, 6), ("v2", 6, 7))
