"""ServerConfig: every setting of `python -m server`, resolved from the command line."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class ServerConfig:
    model: str | None = None  # None: the bundled default model
    served_model_names: list[str] = field(default_factory=lambda: ["default"])
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: list[str] = field(default_factory=list)
    # engine
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    kv_cache_memory: int | None = None
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"  # fcfs | priority
    dtype: str = "auto"
    seed: int = 0
    generation_config: str = "auto"
    # chat
    chat_template: str | None = None
    chat_template_content_format: str = "auto"
    trust_request_chat_template: bool = False
    # limits and admission
    max_logprobs: int = 20
    max_queued_requests: int | None = None  # None: 2 x max_num_seqs
    max_body_bytes: int = 4 * 1024 * 1024
    drain_timeout: float = 30.0
    # http
    max_connections: int = 1024  # open connections; beyond, new ones get 503 and close
    h11_max_header_count: int = 100  # headers in a request; beyond, 431
    max_buffered_bytes: int = 8 * 1024 * 1024  # output held for one slow client
    max_total_buffered_bytes: int = 256 * 1024 * 1024  # output held for all slow clients
    enable_request_id_headers: bool = False
    allowed_origins: list[str] = field(default_factory=list)
    enable_log_requests: bool = False
    log_level: str = "info"
    log_json: bool = False


def env_seconds(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """A positive number of seconds from the environment variable `name`, else `default`;
    anything else is a startup error naming the variable."""
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{name} must be a positive number of seconds, got {raw!r}")
    return value
