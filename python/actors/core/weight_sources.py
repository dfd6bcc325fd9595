"""Where a weight update's tensors come from, read and checked before anything is staged.

Three transports, none of them a GPU's (no NCCL, no CUDA IPC):

- ``path``: a ``.safetensors`` file or a directory of them on the local filesystem (a
  file under /dev/shm is memory, not disk);
- ``shm``: a POSIX shared-memory segment (Python's ``multiprocessing.shared_memory``; on
  Linux the file ``/dev/shm/<name>``) holding the raw bytes of ``names`` back to back, in
  that order, each ``shape`` in ``dtype_names`` (torch's names: "bfloat16", "float32",
  "float16"), as vLLM's packed IPC buffer lays them out; ``tensor_sizes``, when given, must
  be each tensor's byte size;
- ``chunk``: one safetensors file's bytes, as an HTTP upload delivers them (``refused``:
  one the edge refused, its framing broken; it only ends the session).

Every tensor is checked against the model's ``Catalog`` (its checkpoint's names, shapes
and dtypes, read from the safetensors headers of the loaded model's directory; a GGUF
model's are the Hugging Face names its conversion wrote) before any tensor data is read:
an unknown name, another shape or a dtype that is not floating point is a ``WeightRefused``
naming the tensor. ``safetensors_header`` validates a chunk's framing (header size,
offsets inside the data, sizes that match dtype x shape, no overlaps): the HTTP edge runs
it before a chunk goes to an engine, the core runs it again.
"""

from __future__ import annotations

import json
import mmap
import re
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise
from math import prod
from pathlib import Path
from typing import Any

__all__ = ["Catalog", "ChunkEntry", "WeightRefused", "read_source", "safetensors_header"]

# safetensors dtype -> bytes per element (the floating ones can be loaded as weights)
ST_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8,
            "I32": 4, "I16": 2, "I8": 1, "U8": 1, "U16": 2, "U32": 4, "U64": 8, "BOOL": 1}
FLOAT_DTYPES = ("F32", "F16", "BF16")
# torch dtype names (vLLM's dtype_names) -> safetensors'
TORCH_NAMES = {"float32": "F32", "float": "F32", "float16": "F16", "half": "F16",
               "bfloat16": "BF16"}
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors library's own bound
SHM_DIR = Path("/dev/shm")
_SHM_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")


class WeightRefused(ValueError):
    """An update the model cannot take; the message names the tensor (or the framing)."""


@dataclass(frozen=True, slots=True)
class ChunkEntry:
    dtype: str  # safetensors' name
    shape: tuple[int, ...]
    begin: int  # byte offsets within the data section
    end: int


def safetensors_header(data: bytes | memoryview) -> tuple[dict[str, ChunkEntry], int]:
    """A safetensors file's tensors and where its data section starts; WeightRefused for
    any framing the format does not allow."""
    size = _header_size(data)
    if 8 + size > len(data):
        raise WeightRefused(f"not a safetensors file: a header of {size} bytes does not fit "
                            f"in {len(data)} bytes")
    return parse_header(bytes(data[8:8 + size]), len(data) - 8 - size), 8 + size


def _header_size(data: bytes | memoryview) -> int:
    if len(data) < 8:
        raise WeightRefused("not a safetensors file: fewer than 8 bytes")
    (size,) = struct.unpack("<Q", bytes(data[:8]))
    if size > MAX_HEADER_BYTES:
        raise WeightRefused(f"not a safetensors file: a header of {size} bytes")
    return size


def parse_header(raw: bytes, available: int) -> dict[str, ChunkEntry]:
    """The entries of a safetensors header whose data section holds `available` bytes."""
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise WeightRefused("not a safetensors file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise WeightRefused("not a safetensors file: its header is not a JSON object")
    entries: dict[str, ChunkEntry] = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(spec, dict):
            raise WeightRefused(f"{name!r}: its header entry is not an object")
        dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
        if dtype not in ST_SIZES:
            raise WeightRefused(f"{name!r}: unknown dtype {str(dtype)[:20]!r}")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise WeightRefused(f"{name!r}: shape must be a list of non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= available):
            raise WeightRefused(f"{name!r}: data_offsets {str(offsets)[:60]} lie outside the "
                                f"{available} bytes of data")
        if offsets[1] - offsets[0] != prod(shape) * ST_SIZES[dtype]:
            raise WeightRefused(f"{name!r}: {offsets[1] - offsets[0]} bytes for shape "
                                f"{shape} of {dtype}")
        entries[name] = ChunkEntry(dtype, tuple(shape), offsets[0], offsets[1])
    spans = sorted((e.begin, e.end) for e in entries.values() if e.end > e.begin)
    if any(a[1] > b[0] for a, b in pairwise(spans)):
        raise WeightRefused("not a safetensors file: two tensors share bytes")
    return entries


class Catalog:
    """The model's checkpoint tensors: name -> (shape, safetensors dtype)."""

    def __init__(self, entries: Mapping[str, tuple[tuple[int, ...], str]]) -> None:
        self.entries = dict(entries)

    @classmethod
    def of_dir(cls, model_dir: Path) -> Catalog:
        from actors.loader.hf import safetensors_files

        entries: dict[str, tuple[tuple[int, ...], str]] = {}
        for f in safetensors_files(model_dir):
            with open(f, "rb") as fh:
                size = _header_size(fh.read(8))
                raw = fh.read(size)
                found = parse_header(raw, fh.seek(0, 2) - 8 - size)
            entries.update({k: (e.shape, e.dtype) for k, e in found.items()})
        return cls(entries)

    def check(self, name: str, shape: tuple[int, ...], dtype: str, where: str = "") -> None:
        at = f"{where}: " if where else ""
        if name not in self.entries:
            raise WeightRefused(f"{at}{name!r} is not a weight of this model")
        expected, model_dtype = self.entries[name]
        if tuple(shape) != expected:
            raise WeightRefused(f"{at}{name!r} has shape {list(shape)}, the model's is "
                                f"{list(expected)}")
        if dtype not in FLOAT_DTYPES:
            raise WeightRefused(f"{at}{name!r} has dtype {dtype}; weights are sent as "
                                f"{', '.join(FLOAT_DTYPES)} (the model's is {model_dtype})")


def read_source(source: Mapping[str, Any], catalog: Catalog) -> Iterator[tuple[str, Any]]:
    """(name, tensor) of an update source, every tensor checked before the first is read.
    The tensors are copies: nothing refers to the source once it is read."""
    kind = source.get("kind")
    if kind == "path":
        yield from _read_path(str(source.get("path", "")), catalog)
    elif kind == "shm":
        yield from _read_shm(source, catalog)
    elif kind == "chunk":
        yield from _read_chunk(memoryview(source["data"]), catalog, "chunk")
    elif kind == "refused":  # the HTTP edge refused it; the session ends all the same
        raise WeightRefused(str(source.get("error", "refused")))
    else:
        raise WeightRefused(f"unknown update source {str(kind)[:40]!r}")


def _read_chunk(data: memoryview, catalog: Catalog, where: str) -> Iterator[tuple[str, Any]]:
    import torch

    entries, start = safetensors_header(data)
    if not entries:
        raise WeightRefused(f"{where} holds no tensors")
    for name, e in entries.items():
        catalog.check(name, e.shape, e.dtype, where)
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    for name, e in entries.items():
        raw = bytearray(data[start + e.begin:start + e.end])
        yield name, torch.frombuffer(raw, dtype=dtypes[e.dtype]).reshape(e.shape) \
            if raw else torch.empty(e.shape, dtype=dtypes[e.dtype])


def _read_path(path: str, catalog: Catalog) -> Iterator[tuple[str, Any]]:
    from actors.loader.hf import safetensors_files

    p = Path(path)
    if not path:
        raise WeightRefused("the path is empty")
    if p.is_dir():
        files = safetensors_files(p)
    elif not p.is_file():
        raise WeightRefused(f"{path} does not exist")
    elif p.suffix != ".safetensors":
        raise WeightRefused(f"{path} is not a .safetensors file")
    else:
        files = [p]
    if not files:
        raise WeightRefused(f"{path} holds no .safetensors files")
    maps = []
    try:
        for f in files:  # every header checked before any tensor is read
            with open(f, "rb") as fh:
                if fh.seek(0, 2) == 0:
                    raise WeightRefused(f"{f.name}: not a safetensors file: it is empty")
                maps.append((f, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)))
            try:
                entries, _ = safetensors_header(memoryview(maps[-1][1]))
            except WeightRefused as exc:
                raise WeightRefused(f"{f.name}: {exc}") from None
            for name, e in entries.items():
                catalog.check(name, e.shape, e.dtype, f.name)
        for f, mm in maps:
            yield from _read_chunk(memoryview(mm), catalog, f.name)
    finally:
        for _f, mm in maps:
            try:
                mm.close()
            except BufferError:  # a view still refers to it; the GC closes it
                pass


def _read_shm(source: Mapping[str, Any], catalog: Catalog) -> Iterator[tuple[str, Any]]:
    import torch

    name = str(source.get("shm_name", "")).lstrip("/")
    if not _SHM_NAME.fullmatch(name):
        raise WeightRefused("shm_name must be a shared-memory segment's name (letters, "
                            "digits, '.', '_', '-')")
    names, dtype_names, shapes = source["names"], source["dtype_names"], source["shapes"]
    sizes = source.get("tensor_sizes")
    layout: list[tuple[str, torch.dtype, tuple[int, ...], int]] = []
    for i, tensor in enumerate(names):
        st_dtype = TORCH_NAMES.get(dtype_names[i], str(dtype_names[i]).upper())
        shape = tuple(shapes[i])
        catalog.check(tensor, shape, st_dtype)
        nbytes = prod(shape) * ST_SIZES[st_dtype]
        if sizes is not None and sizes[i] != nbytes:
            raise WeightRefused(f"{tensor!r}: tensor_sizes says {sizes[i]} bytes, shape "
                                f"{list(shape)} of {dtype_names[i]} is {nbytes}")
        layout.append((tensor, getattr(torch, dtype_names[i]), shape, nbytes))
    path = SHM_DIR / name
    if not path.is_file():
        raise WeightRefused(f"no shared-memory segment named {name!r}")
    with open(path, "rb") as fh:
        total = sum(n for *_, n in layout)
        size = fh.seek(0, 2)
        if size < total:
            raise WeightRefused(f"shared-memory segment {name!r} holds {size} bytes; the "
                                f"tensors named take {total}")
        if total == 0:
            return
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            offset = 0
            for tensor, dtype, shape, nbytes in layout:
                raw = bytearray(mm[offset:offset + nbytes])
                offset += nbytes
                yield tensor, (torch.frombuffer(raw, dtype=dtype).reshape(shape) if raw
                               else torch.empty(shape, dtype=dtype))
