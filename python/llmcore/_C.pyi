"""Typed stubs of the compiled module llmcore._C."""

from __future__ import annotations

from typing import Any

class OutOfBlocksError(RuntimeError): ...

def version() -> str: ...
def build_features() -> str: ...
def abi_version() -> int: ...
def set_num_threads(n: int) -> None: ...
def get_num_threads() -> int: ...

# ---------------------------------------------------------------- block pool
# (stubs for the block pool bindings go here)

#
#
#
#
# ---------------------------------------------------------------- attention
# (stubs for the attention bindings go here)

#
#
#
#
# ---------------------------------------------------------------- sampling
# (stubs for the sampling bindings go here)
