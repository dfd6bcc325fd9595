"""A reader of CTranslate2's ``model.bin`` (binary version 6, what its converters write).

Layout (little-endian; a string is a uint16 length counting a trailing NUL, the bytes,
the NUL):

    uint32 binary version | string spec name | uint32 spec revision
    uint32 number of variables, then per variable:
        string name | uint8 rank | uint32 dim * rank | uint8 dtype id | uint32 byte count
        the bytes (row-major)
    uint32 number of aliases, then per alias: string alias | string variable name

dtype ids follow CTranslate2's ``DataType`` enum: 0 float32, 1 int8, 2 int16, 3 int32,
4 float16, 5 bfloat16. An int8-quantized matrix ``x/weight`` comes with a float32
``x/weight_scale`` (one scale per row); ``dequantized`` turns it back into floats.

The file is memory-mapped and variables are numpy views into it, so reading a 150 MB
model costs no copy until a tensor is converted. A model split into parts (a package
size limit) is joined by ``join_parts`` into a file the caller owns (the loader's cache),
never next to the parts.
"""

from __future__ import annotations

import mmap
import shutil
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Ct2Model", "join_parts", "read_model"]

SUPPORTED_BINARY_VERSIONS = (5, 6)
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_BF16_ID = 5


@dataclass(frozen=True)
class Ct2Model:
    spec: str  # e.g. "WhisperSpec"
    revision: int
    variables: dict[str, np.ndarray]  # views into the mapped file (bf16 as uint16)
    dtypes: dict[str, str]  # name -> "float32" | "int8" | "int16" | "int32" | "float16" | "bfloat16"
    aliases: dict[str, str]

    def get(self, name: str) -> np.ndarray:
        return self.variables[self.aliases.get(name, name)]

    def dequantized(self, name: str) -> np.ndarray:
        """Variable ``name`` as float32 (int8 rows times their ``_scale``; bf16 widened)."""
        key = self.aliases.get(name, name)
        arr = self.variables[key]
        kind = self.dtypes[key]
        if kind == "int8":
            scale = self.variables.get(key + "_scale")
            if scale is None:
                raise ValueError(f"int8 variable {name!r} has no {name}_scale")
            s = np.asarray(scale, dtype=np.float32).reshape(-1, *([1] * (arr.ndim - 1)))
            return arr.astype(np.float32) / s  # CTranslate2 stores x * scale
        if kind == "bfloat16":
            return (arr.astype(np.uint32) << 16).view(np.float32)
        return arr.astype(np.float32)


class _Reader:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.at = buf, 0

    def take(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.buf):
            raise ValueError("model.bin is truncated")
        out = struct.unpack_from(fmt, self.buf, self.at)
        self.at += size
        return out

    def string(self) -> str:
        (n,) = self.take("<H")
        raw = bytes(self.buf[self.at: self.at + n])
        if len(raw) != n or not raw.endswith(b"\0"):
            raise ValueError("model.bin holds a malformed string")
        self.at += n
        return raw[:-1].decode("utf-8")


def read_model(path: str | Path) -> Ct2Model:
    """Parses ``path`` (mapped read-only; the arrays stay valid while referenced)."""
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    r = _Reader(memoryview(mm))
    (version,) = r.take("<I")
    if version not in SUPPORTED_BINARY_VERSIONS:
        raise ValueError(f"{path}: CTranslate2 binary version {version} is not supported "
                         f"({', '.join(map(str, SUPPORTED_BINARY_VERSIONS))})")
    spec = r.string()
    (revision,) = r.take("<I")
    (count,) = r.take("<I")
    variables: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    for _ in range(count):
        name = r.string()
        (rank,) = r.take("<B")
        shape = r.take(f"<{rank}I") if rank else ()
        type_id, nbytes = r.take("<BI")
        if type_id == _BF16_ID:
            np_dtype, label = np.dtype(np.uint16), "bfloat16"
        elif type_id in _DTYPES:
            np_dtype = np.dtype(_DTYPES[type_id])
            label = np_dtype.name
        else:
            raise ValueError(f"{path}: variable {name!r} has unknown dtype id {type_id}")
        if nbytes != int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize:
            raise ValueError(f"{path}: variable {name!r} declares {nbytes} bytes for "
                             f"shape {shape} of {label}")
        if r.at + nbytes > len(r.buf):
            raise ValueError(f"{path} is truncated (in variable {name!r})")
        arr = np.frombuffer(mm, dtype=np_dtype, count=nbytes // np_dtype.itemsize,
                            offset=r.at).reshape(shape)
        r.at += nbytes
        variables[name], dtypes[name] = arr, label
    aliases: dict[str, str] = {}
    if r.at < len(r.buf):
        (n_alias,) = r.take("<I")
        for _ in range(n_alias):
            alias = r.string()
            aliases[alias] = r.string()
    return Ct2Model(spec, revision, variables, dtypes, aliases)


def join_parts(parts: Sequence[Path], dest: Path) -> None:
    """Concatenates ``parts`` in order into ``dest`` (streamed; a model is 100s of MB)."""
    with open(dest, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                shutil.copyfileobj(f, out, 16 << 20)
