"""The `system_fingerprint` every completion reports.

vLLM reports `vllm-<version>-<hash8>` where the hash covers the configuration that shapes
outputs; clients compare it to tell whether two answers came from the same backend setup.
Ours has the same form: `llmserve-<version>-<hash8>` over the model and the settings that
change what it generates. Computed once per server.
"""

from __future__ import annotations

import hashlib

from server import __version__
from server.config import ServerConfig

# The settings that change outputs; addresses, keys and logging do not. All but
# chat_template are the engine's (config.engine).
_KEYS = ("model", "max_model_len", "dtype", "kv_cache_dtype", "block_size", "seed",
         "generation_config", "chat_template", "max_logprobs")


def system_fingerprint(config: ServerConfig, model_root: str) -> str:
    engine = config.engine
    parts = [f"{key}={getattr(engine if hasattr(engine, key) else config, key)!r}"
             for key in _KEYS]
    parts.append(f"root={model_root!r}")
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:8]
    return f"llmserve-{__version__}-{digest}"
