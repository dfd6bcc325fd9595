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

class AttentionPlan:
    """Validated attention metadata of one step, shared by every layer's calls."""

    def __init__(
        self,
        query_start: Any,
        seq_lens: Any,
        block_tables: Any,
        slot_mapping: Any | None,
        device: str = "cpu",
        num_blocks: int = 0,
        stream: int = 0,
    ) -> None: ...
    @property
    def num_seqs(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def device(self) -> str: ...

def attention_isa() -> str: ...
def kv_store(
    plan: AttentionPlan, k: Any, v: Any, k_cache: Any, v_cache: Any, stream: int = 0
) -> None: ...
def paged_attention(
    plan: AttentionPlan,
    q: Any,
    k_cache: Any,
    v_cache: Any,
    out: Any,
    scale: float,
    sliding_window: int = 0,
    softcap: float = 0.0,
    stream: int = 0,
) -> None: ...

#
#
#
#
# ---------------------------------------------------------------- sampling
# (stubs for the sampling bindings go here)
