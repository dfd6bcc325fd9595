"""llmcore: the compiled inference core (block pool, KV store, paged attention, sampling,
linear layers, mixture-of-experts layers, and the elementwise operations of a decoder layer).

Tensors cross through ``__dlpack__`` (torch or numpy, zero copy, borrowed for the
call); integer arrays through the buffer protocol. The GIL is released while the
kernels run.
"""

from __future__ import annotations

from llmcore._C import (
    OutOfBlocksError,
    abi_version,
    build_features,
    cpu_isa,
    get_num_threads,
    set_num_threads,
    version,
)
from llmcore.attention import *  # noqa: F403
from llmcore.block_pool import *  # noqa: F403
from llmcore.elementwise import *  # noqa: F403
from llmcore.linear import *  # noqa: F403
from llmcore.linear import __all__ as _linear_all  # the function shadows the module
from llmcore.moe import *  # noqa: F403
from llmcore.sampling import *  # noqa: F403

from llmcore import isa
from llmcore import attention as _attention
from llmcore import block_pool as _block_pool
from llmcore import elementwise as _elementwise
from llmcore import moe as _moe
from llmcore import sampling as _sampling

__all__ = [
    "OutOfBlocksError",
    "abi_version",
    "build_features",
    "cpu_isa",
    "get_num_threads",
    "isa",
    "set_num_threads",
    "version",
    *_attention.__all__,
    *_block_pool.__all__,
    *_elementwise.__all__,
    *_linear_all,
    *_moe.__all__,
    *_sampling.__all__,
]
