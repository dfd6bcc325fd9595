"""ServerConfig: every setting of `python -m server`, resolved from the command line.

The engine's settings are not repeated here: ``ServerConfig.engine`` is the EngineConfig
the engine is built from (``actors.config``, which imports nothing heavy).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from actors.config import AdmissionWindow, EngineConfig


@dataclass
class ServerConfig:
    # Every engine setting (model, context, KV cache, scheduling, seed, generation
    # defaults, max_logprobs): the engine is built from this very object.
    engine: EngineConfig = field(default_factory=EngineConfig)
    served_model_names: list[str] = field(default_factory=lambda: ["default"])
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: list[str] = field(default_factory=list)
    # chat
    chat_template: str | None = None
    chat_template_content_format: str = "auto"
    trust_request_chat_template: bool = False
    # tool calling: tool_choice "auto" and the parser that reads every tool choice's output
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    # scale-out: /render, /derender, /inference/v1/generate and abort (403 when off)
    enable_scale_out: bool = False
    tokens_only: bool = False  # the generate routes on, stop strings and text output off
    # the Responses API's store (server.frontend.responses_store): None keeps no responses (the
    # CLI's default is a file in the state directory); bounded by count, bytes (the JSON
    # kept) and age (0: none). Each API key's client holds at most count/keys and bytes/keys.
    responses_store: Path | None = None
    responses_store_max_count: int = 10_000
    responses_store_max_bytes: int = 1 << 30
    responses_store_max_age: float = 30 * 24 * 3600.0
    # engine cores, each in its own process with its own KV cache (1: one core, in-process)
    data_parallel_size: int = 1
    # limits and admission
    max_queued_requests: int | None = None  # None: 2 x max_num_seqs
    max_body_bytes: int = 4 * 1024 * 1024
    # structured outputs: a constraint's bytes and subschemas (beyond: 400) and the grammar
    # compiles queued or running (beyond: 503); as actors.core.structured.cache's defaults
    max_grammar_bytes: int = 1 << 20
    max_grammar_subschemas: int = 10_000
    max_pending_grammars: int = 32
    # how long an idle engine's first step waits for the rest of a burst (actors.runtime.burst)
    admission_window: AdmissionWindow = field(default_factory=AdmissionWindow)
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
    # operator routes (server/api/dev.py, profile.py) and the vendored Swagger UI at /docs
    enable_dev_endpoints: bool = False  # --enable-dev-endpoints or VLLM_SERVER_DEV_MODE=1
    profiler_config: dict[str, object] | None = None  # --profiler-config: /start_profile
    enable_offline_docs: bool = False
    # pooling (server/api/pooling.py): --runner pooling serves the pooling routes only;
    # --pooler-config (vLLM's JSON) sets the pooling and, on a generative model, adds the
    # pooling routes beside generation
    runner: str = "auto"  # auto | generate | pooling
    pooler_config: str | None = None
    max_pooling_inputs: int = 2048  # inputs (or documents) per pooling request; beyond, 400
    # LoRA (server/api/lora.py): adapters loaded at start (name, path); the runtime load and
    # unload routes (--allow-runtime-lora-updating or VLLM_ALLOW_RUNTIME_LORA_UPDATING=1)
    lora_modules: list[tuple[str, str]] = field(default_factory=list)
    allow_runtime_lora_updating: bool = False

    # A read-only view for the wiring that names the model; it holds nothing, so it
    # cannot drift from ``engine``.
    @property
    def model(self) -> str | None:
        return self.engine.model


def env_number(name: str, default: float, environ: Mapping[str, str] | None = None,
               unit: str = "") -> float:
    """A positive finite number from the environment variable `name`, else `default`;
    anything else is a startup error naming the variable (and the unit, when given)."""
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        what = f"a positive number of {unit}" if unit else "a positive number"
        raise ValueError(f"{name} must be {what}, got {raw!r}")
    return value


def env_seconds(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """A positive number of seconds from the environment variable `name`, else `default`."""
    return env_number(name, default, environ, unit="seconds")
