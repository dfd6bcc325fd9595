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

from collections.abc import Sequence as _Sequence

import numpy as _np
import numpy.typing as _npt

_Ints = _Sequence[int] | _npt.NDArray[_np.integer[Any]]

class BlockPoolStats:
    """A snapshot of a BlockPool's counters (read-only)."""

    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def num_free(self) -> int: ...
    @property
    def num_used(self) -> int: ...
    @property
    def num_cached(self) -> int: ...
    @property
    def num_free_cached(self) -> int: ...
    @property
    def queries(self) -> int: ...
    @property
    def hits(self) -> int: ...
    @property
    def evictions(self) -> int: ...
    def as_dict(self) -> dict[str, int]: ...
    def __eq__(self, other: object) -> bool: ...

class BlockPool:
    """A fixed pool of KV blocks with ref counts and a prefix cache. Not thread-safe."""

    def __init__(self, num_blocks: int, block_size: int) -> None: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    def num_free(self) -> int: ...
    def allocate(self, n: int) -> list[int]: ...
    def fork(self, ids: _Ints) -> None: ...
    def free(self, ids: _Ints) -> None: ...
    def commit(self, block_id: int, parent_hash: int, tokens: _Ints) -> int: ...
    def match_prefix(
        self, tokens: _Ints, extra_key: int = 0, max_blocks: int | None = None
    ) -> list[int]: ...
    def ref_count(self, block_id: int) -> int: ...
    def reset_cache(self) -> None: ...
    def stats(self) -> BlockPoolStats: ...
    def check(self) -> None: ...

def hash_root(extra_key: int = 0) -> int: ...
def block_hash(parent: int, tokens: _Ints) -> int: ...

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

import numpy as _np
import numpy.typing as _npt

MAX_TOP_LOGPROBS: int
NO_TOKEN: int

def sample(
    logits: Any,
    temperature: _npt.ArrayLike,
    top_k: _npt.ArrayLike,
    top_p: _npt.ArrayLike,
    min_p: _npt.ArrayLike,
    repetition_penalty: _npt.ArrayLike,
    presence_penalty: _npt.ArrayLike,
    frequency_penalty: _npt.ArrayLike,
    seed: _npt.ArrayLike,
    position: _npt.ArrayLike,
    *,
    prompt_tokens: tuple[_npt.ArrayLike, _npt.ArrayLike] | None = None,
    output_tokens: tuple[_npt.ArrayLike, _npt.ArrayLike] | None = None,
    logit_bias: tuple[_npt.ArrayLike, _npt.ArrayLike, _npt.ArrayLike] | None = None,
    banned_tokens: tuple[_npt.ArrayLike, _npt.ArrayLike] | None = None,
    allowed_bitmask: _npt.ArrayLike | None = None,
    use_bitmask: _npt.ArrayLike | None = None,
    num_top_logprobs: int = 0,
    logprobs_mode: str = "raw",
    stream: int = 0,
) -> tuple[
    _npt.NDArray[_np.int32],
    _npt.NDArray[_np.float32],
    _npt.NDArray[_np.int32],
    _npt.NDArray[_np.int32],
    _npt.NDArray[_np.float32],
]: ...
def rng_uniform(seed: int, position: int, index: _npt.ArrayLike) -> _npt.NDArray[_np.float32]: ...

#
#
# ---------------------------------------------------------------- linear

def linear(x: Any, weight: Any, bias: Any = None, out: Any = None) -> Any: ...
def linear_isa() -> str: ...

#
#
# ---------------------------------------------------------------- elementwise

def rms_norm(x: Any, weight: Any, eps: float, out: Any, residual: Any = None) -> Any: ...
def silu_mul(x: Any, out: Any) -> Any: ...
def rope(q: Any, k: Any, cos: Any, sin: Any) -> None: ...
def set_elementwise_isa(isa: str) -> str: ...
def set_linear_isa(isa: str) -> str: ...

class PackedWeight:
    def __init__(self, weight: Any) -> None: ...
    @property
    def shape(self) -> tuple[int, int]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    def rows(self, ids: Any, out: Any) -> Any: ...
