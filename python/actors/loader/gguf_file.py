"""A GGUF file (little-endian, version 2 or 3) read without building an object per metadata
element.

    f = GGUFFile(path)
    f.get("general.architecture")          # metadata, None (or a default) when absent
    f.types("gemma3.context_length")       # (GGUFValueType.UINT32,), as gguf-py's field.types
    f.array_len("tokenizer.ggml.tokens")   # an array's length, without reading it
    for t in f.tensors: t.name, t.tensor_type, t.shape, t.data

gguf-py's GGUFReader makes a numpy view per element of every metadata array: seconds for a
262k-token vocabulary (tokens, scores and types), paid on every load. Here the header is
walked once with ``struct`` over a memoryview of one read-only ``np.memmap`` of the file;
scalars, strings and arrays of up to ``max_array`` elements become Python values, and a
longer array is only stepped over (its position kept) and read when ``get`` first asks for
it. Values are what gguf-py's ``ReaderField.contents()`` gives: ints, floats (a float32 as
its double), bools, str, lists; an array of arrays is a nested list (gguf-py flattens it).

Tensors are gguf-py's ``ReaderTensor`` facts: ``shape`` in the file's order (innermost
first), ``data`` a view of the memmap with gguf-py's dtype and numpy shape (F32/F16/F64 and
the integer types as themselves; every other type, BF16 included, as uint8 rows of
``quant_shape_to_byte_shape``), so ``gguf.quants.dequantize(t.data, t.tensor_type)`` works on
it unchanged.

Everything read is bounds-checked against the file's size before it is read or allocated: a
truncated or malformed file (bad magic, an unsupported version, a count or length past the
end, an unknown type, a tensor whose data lies past the end) is refused with a ValueError
naming the file. Big-endian files are refused (gguf-py byte-swaps them; llama.cpp on
little-endian hosts does not load them either).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import quant_shape_to_byte_shape

__all__ = ["GGUFFile", "GGUFTensor"]

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp refuses more
_MAX_NESTING = 8  # arrays of arrays deeper than this are refused (no key has even one level)
_SCALARS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
_NUMPY = {kind: np.dtype(fmt.replace("?", "b1")) for kind, fmt in _SCALARS.items()}
# gguf-py's element dtypes of unquantized tensors; every other type is read as bytes
_TENSOR_DTYPES = {
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}
# the fewest bytes an element of each kind takes (a string: its length; an array: its header)
_MIN_SIZE = {**{k: struct.calcsize(f) for k, f in _SCALARS.items()},
             GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType  # an IntEnum: int() the ggml number, .name its name
    shape: tuple[int, ...]  # the file's order, innermost first (gguf-py's ReaderTensor.shape)
    n_elements: int
    n_bytes: int
    data_offset: int  # from the start of the file
    data: np.ndarray = field(repr=False)  # read-only view of the file's memmap


@dataclass(frozen=True, slots=True)
class _Skipped:
    """An array stepped over: where its elements start, their kind, how many."""

    offset: int
    kind: GGUFValueType
    count: int


class GGUFFile:
    """The header, metadata and tensors of one GGUF file (see the module docstring)."""

    def __init__(self, path: str | Path, max_array: int = 1024) -> None:
        self.path = Path(path)
        size = self.path.stat().st_size
        if size < 24:
            raise ValueError(f"{self.path}: not a GGUF file ({size} bytes)")
        self._mm = np.memmap(self.path, mode="r")
        self._buf = memoryview(self._mm)
        self._size = size
        self._max_array = max_array
        self._values: dict[str, Any] = {}
        self._types: dict[str, tuple[GGUFValueType, ...]] = {}
        if bytes(self._buf[:4]) != _MAGIC:
            raise ValueError(f"{self.path} is not a GGUF file (magic {bytes(self._buf[:4])!r})")
        self.version, n_tensors, n_kv = struct.unpack_from("<IQQ", self._buf, 4)
        if self.version not in _VERSIONS:
            raise ValueError(f"{self.path}: GGUF version {self.version} is not supported "
                             "(little-endian 2 or 3)")
        off = self._count_fits(24, n_kv, 8 + 4 + 1, "metadata entries")
        for _ in range(n_kv):
            key, off = self._string(off)
            if key in self._values:
                raise ValueError(f"{self.path}: metadata key {key!r} appears twice")
            (raw,) = self._unpack("<I", off)
            kind = self._kind(raw, key)
            self._values[key], self._types[key], off = self._value(kind, off + 4, key, top=True)
        self.alignment = _DEFAULT_ALIGNMENT
        if "general.alignment" in self._values:
            if self._types["general.alignment"] != (GGUFValueType.UINT32,):
                raise ValueError(f"{self.path}: general.alignment is not a uint32")
            self.alignment = int(self._values["general.alignment"])
            if self.alignment == 0 or self.alignment & (self.alignment - 1):
                raise ValueError(f"{self.path}: general.alignment {self.alignment} is not a "
                                 "power of two")
        infos = []
        off = self._count_fits(off, n_tensors, 8 + 4 + 4 + 8, "tensor infos")
        for _ in range(n_tensors):
            info, off = self._tensor_info(off)
            infos.append(info)
        self.data_offset = -(-off // self.alignment) * self.alignment
        self.tensors = self._tensors(infos)

    # -- metadata --------------------------------------------------------------------------

    def __contains__(self, key: str) -> bool:
        return key in self._values

    def keys(self) -> list[str]:
        """The metadata keys in the file's order."""
        return list(self._values)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` (a long array is read now, once), or ``default``."""
        if key not in self._values:
            return default
        value = self._values[key]
        if isinstance(value, _Skipped):
            value = self._values[key] = self._elements(value, key)[0]
        return value

    def types(self, key: str) -> tuple[GGUFValueType, ...]:
        """gguf-py's ``field.types``: (kind,), or (ARRAY, [ARRAY, ...] element kind)."""
        return self._types[key]

    def array_len(self, key: str) -> int:
        """The number of elements of the array ``key`` (without reading a skipped one)."""
        value = self._values[key]
        if isinstance(value, _Skipped):
            return value.count
        if not isinstance(value, list):
            raise ValueError(f"{self.path}: metadata {key!r} is not an array")
        return len(value)

    # -- parsing ---------------------------------------------------------------------------

    def _need(self, off: int, n: int, what: str) -> None:
        if n < 0 or off + n > self._size:
            raise ValueError(f"{self.path}: {what} runs past the end of the file "
                             f"({off + n} > {self._size} bytes; truncated or malformed)")

    def _unpack(self, fmt: str, off: int, what: str = "the header") -> tuple[Any, ...]:
        self._need(off, struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self._buf, off)

    def _count_fits(self, off: int, count: int, min_size: int, what: str) -> int:
        """``off``, once ``count`` items of at least ``min_size`` bytes can follow it."""
        self._need(off, count * min_size, f"{count} {what}")
        return off

    def _string(self, off: int) -> tuple[str, int]:
        (n,) = self._unpack("<Q", off)
        self._need(off + 8, n, f"a string of {n} bytes at offset {off}")
        return str(self._buf[off + 8:off + 8 + n], "utf-8", "replace"), off + 8 + n

    def _kind(self, raw: int, key: str) -> GGUFValueType:
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise ValueError(f"{self.path}: metadata {key!r} has unknown type {raw}") from None

    def _value(self, kind: GGUFValueType, off: int, key: str, top: bool = False,
               depth: int = 0) -> tuple[Any, tuple[GGUFValueType, ...], int]:
        """(value, types, offset after it) of one value of ``kind`` at ``off``; a top-level
        array longer than max_array is a _Skipped."""
        if kind == GGUFValueType.STRING:
            value, off = self._string(off)
            return value, (kind,), off
        if kind != GGUFValueType.ARRAY:
            (value,) = self._unpack(_SCALARS[kind], off, f"metadata {key!r}")
            return value, (kind,), off + _MIN_SIZE[kind]
        arr = self._array_at(off, key, depth)
        types = self._array_types(arr, key, depth)
        if top and arr.count > self._max_array:
            return arr, types, self._skip(arr, key, depth)
        elements, end = self._elements(arr, key, depth)
        return elements, types, end

    def _array_at(self, off: int, key: str, depth: int) -> _Skipped:
        """The array whose header is at ``off``, once its elements can fit in the file."""
        if depth > _MAX_NESTING:
            raise ValueError(f"{self.path}: metadata {key!r} nests arrays deeper than "
                             f"{_MAX_NESTING}")
        raw, count = self._unpack("<IQ", off, f"metadata {key!r}")
        arr = _Skipped(off + 12, self._kind(raw, key), count)
        self._count_fits(arr.offset, count, _MIN_SIZE[arr.kind], f"array elements of {key!r}")
        return arr

    def _array_types(self, arr: _Skipped, key: str, depth: int) -> tuple[GGUFValueType, ...]:
        if arr.kind != GGUFValueType.ARRAY:
            return GGUFValueType.ARRAY, arr.kind
        if arr.count == 0:  # an empty array of arrays: the inner kind is unknown
            return GGUFValueType.ARRAY, GGUFValueType.ARRAY
        inner = self._array_at(arr.offset, key, depth + 1)
        return GGUFValueType.ARRAY, *self._array_types(inner, key, depth + 1)

    def _elements(self, arr: _Skipped, key: str, depth: int = 0) -> tuple[list[Any], int]:
        """The elements of an array and the offset after it."""
        if arr.kind in _NUMPY:
            dtype = _NUMPY[arr.kind]
            values = np.frombuffer(self._buf, dtype, arr.count, arr.offset).tolist()
            return values, arr.offset + arr.count * dtype.itemsize
        values, off = [], arr.offset
        for _ in range(arr.count):
            value, _types, off = self._value(arr.kind, off, key, depth=depth + 1)
            values.append(value)
        return values, off

    def _skip(self, arr: _Skipped, key: str, depth: int) -> int:
        """The offset after an array, its elements unread."""
        if arr.kind in _NUMPY:
            return arr.offset + arr.count * _NUMPY[arr.kind].itemsize
        off = arr.offset
        if arr.kind == GGUFValueType.STRING:
            unpack, buf, end = struct.Struct("<Q").unpack_from, self._buf, self._size - 8
            for _ in range(arr.count):
                if off > end:
                    self._need(off, 8, f"array elements of {key!r}")
                off += 8 + unpack(buf, off)[0]
            self._need(off, 0, f"array elements of {key!r}")
            return off
        for _ in range(arr.count):  # arrays of arrays
            off = self._skip(self._array_at(off, key, depth + 1), key, depth + 1)
        return off

    # -- tensors ---------------------------------------------------------------------------

    def _tensor_info(self, off: int) -> tuple[tuple[str, tuple[int, ...], int, int], int]:
        name, off = self._string(off)
        (n_dims,) = self._unpack("<I", off)
        if n_dims > _MAX_DIMS:
            raise ValueError(f"{self.path}: tensor {name!r} has {n_dims} dimensions "
                             f"(at most {_MAX_DIMS})")
        dims = self._unpack(f"<{n_dims}Q", off + 4)
        raw, rel = self._unpack("<IQ", off + 4 + 8 * n_dims)
        return (name, dims, raw, rel), off + 4 + 8 * n_dims + 12

    def _tensors(self, infos: list[tuple[str, tuple[int, ...], int, int]]) -> list[GGUFTensor]:
        out, seen = [], set()
        for name, dims, raw, rel in infos:
            if name in seen:
                raise ValueError(f"{self.path}: tensor {name!r} appears twice")
            seen.add(name)
            try:
                kind = GGMLQuantizationType(raw)
                block, type_size = GGML_QUANT_SIZES[kind]
            except (ValueError, KeyError):
                raise ValueError(f"{self.path}: tensor {name!r} has unknown type {raw}") from None
            n_elements = math.prod(dims)
            np_shape = tuple(reversed(dims))
            dtype = _TENSOR_DTYPES.get(kind)
            if dtype is None and not np_shape:
                raise ValueError(f"{self.path}: tensor {name!r} is a {kind.name} scalar")
            if np_shape and np_shape[-1] % block:
                raise ValueError(f"{self.path}: tensor {name!r} rows of {np_shape[-1]} are not "
                                 f"whole {kind.name} blocks of {block}")
            n_bytes = n_elements * type_size // block
            start = self.data_offset + rel
            self._need(start, n_bytes, f"the data of tensor {name!r}")
            if dtype is None:
                dtype, np_shape = np.uint8, quant_shape_to_byte_shape(np_shape, kind)
            data = self._mm[start:start + n_bytes].view(dtype).reshape(np_shape)
            out.append(GGUFTensor(name, kind, tuple(dims), n_elements, n_bytes, start, data))
        return out
