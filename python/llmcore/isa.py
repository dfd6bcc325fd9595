"""The instruction sets of the CPU kernel families, and a cap to compare them.

Each family (attention, sampling, linear, elementwise) is compiled once per instruction set it
has (scalar; AVX2 + FMA; AVX-512 F/BW/VL/DQ; for linear also AMX, the tile kernels, where the
CPU has them and the kernel grants the process the tile state) and runs the widest one the CPU
supports, capped at
import by ``LLMCORE_ISA`` (attention), ``LLMCORE_SAMPLING_ISA``, ``LLMCORE_LINEAR_ISA`` and
``LLMCORE_ELEMENTWISE_ISA``. ``capped`` lowers that for a block of code, so one process can run
every variant against the scalar one::

    with llmcore.isa.capped("scalar"):
        ref = llm.generate(...)

The setting is process-wide: do not change it while another thread runs kernels whose results
must come from one variant.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from llmcore import _C

__all__ = ["FAMILIES", "FAMILY_ISAS", "ISAS", "capped", "cpu_isa", "current", "set_isa"]

ISAS = ("scalar", "avx2", "avx512", "amx")  # narrowest first
# The variants each family is built in (only linear has tile kernels; the others stop at
# avx512, and capping them at amx runs their avx512 ones).
FAMILY_ISAS: dict[str, tuple[str, ...]] = {
    "attention": ISAS[:3], "sampling": ISAS[:3], "linear": ISAS, "elementwise": ISAS[:3],
}

_GET: dict[str, Callable[[], str]] = {
    "attention": _C.attention_isa,
    "sampling": _C.sampling_isa,
    "linear": _C.linear_isa,
    "elementwise": _C.elementwise_isa,
}
_SET: dict[str, Callable[[str], str]] = {
    "attention": _C.set_attention_isa,
    "sampling": _C.set_sampling_isa,
    "linear": _C.set_linear_isa,
    "elementwise": _C.set_elementwise_isa,
}
FAMILIES = tuple(_GET)


def cpu_isa() -> str:
    """The widest instruction set this CPU runs among those built (``ISAS``)."""
    return _C.cpu_isa()


def current() -> dict[str, str]:
    """family -> the instruction set its kernels run with now."""
    return {f: get() for f, get in _GET.items()}


def set_isa(family: str, isa: str) -> str:
    """Caps one family at ``isa``; returns the one in effect (no wider than the CPU and the
    family's widest build allow). Unknown names raise ValueError."""
    if family not in _SET:
        raise ValueError(f"unknown kernel family {family!r}: one of {', '.join(FAMILIES)}")
    return _SET[family](isa)


@contextmanager
def capped(isa: str, families: tuple[str, ...] = FAMILIES) -> Iterator[dict[str, str]]:
    """Caps ``families`` at ``isa`` inside the block; yields family -> the one in effect, and
    restores the previous settings on exit."""
    before = current()
    try:
        yield {f: set_isa(f, isa) for f in families}
    finally:
        for f in families:
            _SET[f](before[f])
