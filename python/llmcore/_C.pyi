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
