"""ServerConfig: every setting of `python -m server`, resolved from the command line.

The engine's settings are not repeated here: ``ServerConfig.engine`` is the EngineConfig
the engine is built from (``actors.config``, which imports nothing heavy). Each field the
command line sets carries its flag (``actors.flag_spec``); ``server.flag_parser`` builds the
parser from them and ``server.cli`` resolves the few settings that are more than one flag.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from actors.config import AdmissionWindow, EngineConfig
from actors.flag_spec import Flag, flag

from server.state_dir import STATE_DIR_ENV

# Environment variables that stand in for flags (read by server.cli).
KEY_ENV_VARS = ("LLMSERVE_API_KEY", "VLLM_API_KEY")  # --api-key
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"  # --enable-dev-endpoints
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"  # --allow-runtime-lora-updating


def _tool_call_parser_help() -> str:
    from server.frontend.chat.tool_parsers import tool_parser_names

    return ("how the model writes tool calls: one of "
            f"{', '.join(tool_parser_names())}; it serves tool_choice 'required' and named "
            "functions (constrained decoding), and with --enable-auto-tool-choice also "
            "'auto'. Default: none")


def _reasoning_parser_help() -> str:
    from server.frontend.chat.reasoning import names

    return ("how the model writes its reasoning: one of "
            f"{', '.join(names())}, or a name an llmserve.reasoning_parsers entry point "
            "registers; chat completions then answer the reasoning in message.reasoning "
            "(streamed: delta.reasoning) and content without it, and count "
            "completion_tokens_details.reasoning_tokens; /v1/messages answers it as thinking "
            "blocks and /v1/responses as reasoning items. Default: none (the text is content)")


@dataclass
class ServerConfig:
    # Every engine setting (model, context, KV cache, scheduling, seed, generation
    # defaults, max_logprobs): the engine is built from this very object.
    engine: EngineConfig = field(default_factory=EngineConfig)
    # The first is reported in responses and metrics; the command line's default is a
    # named model's name, else [] (the model's stem, found at load).
    served_model_names: list[str] = flag(
        factory=lambda: ["default"], name="--served-model-name", nargs="+",
        type="non_empty", cli_default=None, help="names clients use for the model "
        "(aliases); the first is reported in responses and metrics. Default: the model's "
        "name")
    host: str = flag("127.0.0.1", type="non_empty", help="interface to bind")
    port: int = flag(8000, type="integer", low=0, high=65535,
                     help="port to bind (0 picks a free one)")
    api_keys: list[str] = flag(
        factory=list, name="--api-key", nargs="+", type="non_empty", cli_default=None,
        help="API keys; every route except /health and /ping then needs one. Also read "
        f"from {' or '.join(KEY_ENV_VARS)}. Default: none (no authentication)")
    # chat
    chat_template: str | None = flag(None, type="chat_template", help="chat template file "
        "or literal Jinja text. Default: the tokenizer's")
    chat_template_content_format: str = flag(
        "auto", choices=("auto", "string", "openai"),
        help="how message content is passed to the template")
    trust_request_chat_template: bool = flag(
        False, help="allow requests to supply their own chat_template")
    # logprobs: tokens written "token_id:<id>" (a request's return_tokens_as_token_ids wins)
    return_tokens_as_token_ids: bool = flag(
        False, help="write every logprob token as 'token_id:<id>' instead of its text (for "
        "tokens that are not valid UTF-8 on their own); a request's "
        "return_tokens_as_token_ids overrides it")
    # tool calling: tool_choice "auto" and the parser that reads every tool choice's output
    enable_auto_tool_choice: bool = flag(False, help="let requests use tool_choice 'auto' "
        "(the model decides; needs --tool-call-parser)")
    tool_call_parser: str | None = flag(None, metavar="NAME", help=_tool_call_parser_help)
    tool_strict_level: str | None = flag(
        None, choices=("auto", "function", "parameter"), help="floor for constraining "
        "tool_choice 'auto' calls with a structural tag on the parser's call marker: 'auto' "
        "when a tool sets strict: true (its arguments then follow its schema), 'function' "
        "every call's name, 'parameter' every call's arguments too, as if every tool were "
        "strict. Parsers without a JSON call marker (mistral, pythonic, granite, "
        "qwen3_coder, openai) ignore it. Default: auto")
    # reasoning (server.frontend.chat.reasoning_plan): the parser that splits the output,
    # the template kwargs under every request's, the effort rewrite and the pre-0.34
    # output field
    reasoning_parser: str | None = flag(None, metavar="NAME", help=_reasoning_parser_help)
    # --structured-outputs-config enable_in_reasoning=true: constraints bind from the first
    # token instead of after the reasoning (server.frontend.reasoning_gate)
    structured_enable_in_reasoning: bool = False
    default_chat_template_kwargs: dict[str, object] | None = flag(
        None, type="template_kwargs", metavar="JSON", help="chat template kwargs every chat "
        "request gets under its own chat_template_kwargs (the request's win), e.g. "
        '\'{"enable_thinking": false}\'. Default: none')
    reasoning_effort_map: dict[str, str] | None = flag(
        None, type="effort_map", metavar="JSON", help="rewrites a request's reasoning effort "
        "(chat reasoning_effort, Responses reasoning.effort, Anthropic output_config.effort) "
        "before the chat template receives it, for templates that know fewer efforts, e.g. "
        '\'{"medium": "low", "xhigh": "max"}\'; efforts not listed pass unchanged. '
        "Default: none")
    reasoning_content_field: bool = flag(
        False, help="also answer the reasoning as reasoning_content (message and delta), "
        "beside reasoning, for clients that read the field's older name (vLLM before 0.34, "
        "llama.cpp, SGLang); needs --reasoning-parser")
    # streams and responses: tokens per streamed delta (a request's stream_interval is
    # raised to it), and vLLM's per-request timing metrics on responses
    stream_interval: int = flag(
        1, type="integer", low=1, help="tokens a stream gathers before it sends a chunk "
        "(its first and last go out at once); a request's stream_interval is raised to it. "
        "1: every step's tokens as they come")
    enable_per_request_metrics: bool = flag(
        False, help="answer a `metrics` object on completions, chat completions and "
        "Responses (time_to_first_token_ms, generation_time_ms, queue_time_ms, mean_itl_ms, "
        "tokens_per_second; null for n > 1 or several prompts); streams carry it on the "
        "usage chunk")
    # scale-out: /render, /derender, /inference/v1/generate and abort (403 when off)
    enable_scale_out: bool = flag(False, help="serve the scale-out routes: "
        "/v1/chat/completions/render, /v1/completions/render, their /derender, "
        "/inference/v1/generate and /inference/v1/abort_requests (403 otherwise)")
    tokens_only: bool = flag(False, help="serve the tokens-in/tokens-out routes (as "
        "--enable-scale-out, plus /abort_requests without an API key); generate then "
        "returns token ids only and refuses stop strings")
    # the Responses API's store (server.frontend.responses_store): None keeps no responses (the
    # CLI's default is a file in the state directory); bounded by count, bytes (the JSON
    # kept) and age (0: none). Each API key's client holds at most count/keys and bytes/keys.
    responses_store: Path | None = flag(
        None, type="path", metavar="PATH", help="SQLite file that keeps the Responses API's "
        f"responses (GET, previous_response_id, background). Default: ${STATE_DIR_ENV}"
        "/responses.sqlite, else ~/.local/state/llmserve/responses.sqlite",
        also=(Flag(name="--no-responses-store", switch=True, help="keep no responses: store "
                   "is ignored, background and previous_response_id find nothing"),))
    responses_store_max_count: int = flag(
        10_000, type="integer", low=1, help="responses kept; beyond, the oldest are evicted. "
        "With --api-key, each key's client may hold count/keys, and a client's writes evict "
        "its own oldest first")
    responses_store_max_bytes: int = flag(
        1 << 30, type="size", low=1, help="bytes of responses kept (their JSON; k/m/g "
        "suffixes), shared among the keys as the count is; a response larger than one key's "
        "share is not kept")
    responses_store_max_age: float = flag(30 * 24 * 3600.0, type="integer", low=0,
        help="seconds a response is kept (0: no age bound)")
    # engine cores, each in its own process with its own KV cache (1: one core, in-process)
    data_parallel_size: int = flag(
        1, aliases=("-dp",), type="integer", low=1, high=64, help="engine cores, each in its "
        "own process with its own KV cache, behind this one HTTP server; requests go to the "
        "least loaded (queued + running). 1: one in-process core")
    enable_elastic_ep: bool = flag(
        False, help="let POST /scale_elastic_ep add and remove engine cores while the server "
        "serves (vLLM's elastic data parallel); every core then runs in a process of its "
        "own, with --data-parallel-size 1 too")
    elastic_ep_max_dp_size: int | None = flag(
        None, type="integer", low=1, high=64, help="the most engine cores /scale_elastic_ep "
        "may run (needs --enable-elastic-ep). Default: what the machine holds, one a CPU "
        "and as many as 80%% of the memory available at start fits")
    # limits and admission
    max_queued_requests: int | None = flag(
        None, type="integer", low=0, help="sequences allowed to wait beyond --max-num-seqs "
        "before new requests get 503 + Retry-After. Default: 2 x --max-num-seqs")
    max_num_queued_tokens: int | None = flag(
        None, type="tokens", low=0, help="vLLM's prefill backlog bound: while the prompts "
        "of requests that have had no output yet (n choices counting n times, every "
        "data-parallel engine together) hold this many tokens or more, new requests get "
        "503 + Retry-After (8k = 8000, 8K = 8192). Default: no bound")
    max_body_bytes: int = flag(4 * 1024 * 1024, type="size", low=1,
                               help="largest request body (413 above)")
    # structured outputs: a constraint's bytes and subschemas (beyond: 400) and the grammar
    # compiles queued or running (beyond: 503); as actors.core.structured.cache's defaults
    max_grammar_bytes: int = flag(
        1 << 20, type="size", low=1, help="largest output constraint (JSON schema, regex, "
        "grammar, choices, structural tag; a forced tool choice's schema) in bytes, k/m "
        "suffixes; larger is a 400 naming the field, before it is compiled. Default: "
        "{default}")
    max_grammar_subschemas: int = flag(
        10_000, type="integer", low=1, help="most subschemas (JSON objects but the values of "
        "const, enum, default and examples) in a constraint's JSON schema or structural "
        "tag; more is a 400 naming the field, before it is compiled")
    max_pending_grammars: int = flag(
        32, type="integer", low=1, help="grammar compiles queued or running at once "
        "(smallest constraint first); a new one beyond takes the place of a larger queued "
        "one, or is a 503 with Retry-After. A compile that cannot start within 10 s is a 503 "
        "too, and one whose requests have all gone is dropped")
    # how long an idle engine's first step waits for the rest of a burst (actors.runtime.burst)
    admission_window: AdmissionWindow = field(default_factory=AdmissionWindow)
    drain_timeout: float = flag(30.0, type="seconds", help="seconds in-flight requests may "
        "take to finish after SIGTERM/SIGINT")
    # http
    max_connections: int = flag(1024, type="positive", help="open HTTP connections; beyond, "
        "a new connection gets 503 and is closed (keep it below `ulimit -n`)")
    h11_max_header_count: int = flag(100, type="positive",
                                     help="headers allowed in a request (431 above)")
    max_buffered_bytes: int = flag(
        8 * 1024 * 1024, type="size", help="output held for one client that reads slower "
        "than it is generated (its send queue and pending output); above, its connection is "
        "dropped and its request aborted")
    max_total_buffered_bytes: int = flag(
        256 * 1024 * 1024, type="size", help="the same for all clients together; above, the "
        "clients holding the most are dropped first")
    # WS /v1/realtime (server/api/openai/realtime*.py): each connection's and all of them
    # together's audio awaiting transcription, and when a client is closed
    realtime_max_chunk_bytes: int = flag(
        1024 * 1024, type="size", low=2, help="PCM16 bytes one input_audio_buffer.append "
        "may carry (decoded from its base64; k/m suffixes); a larger chunk is refused with "
        "an error event and dropped. Default: {default}")
    realtime_max_buffer_s: float = flag(
        120.0, type="seconds", low=1, help="seconds of audio one realtime connection may "
        "hold before it is transcribed; beyond, the connection is closed (1009)")
    realtime_max_total_buffer_bytes: int = flag(
        256 * 1024 * 1024, type="size", low=1, help="PCM16 bytes all realtime connections "
        "together may hold untranscribed; a chunk beyond closes its connection (1013, try "
        "again later). Default: {default}")
    realtime_idle_timeout: float = flag(
        60.0, type="seconds", low=0.1, help="seconds a realtime connection may send no "
        "event while none of its audio awaits transcription; then it is closed (1008)")
    realtime_max_lead_s: float = flag(
        120.0, type="seconds", low=1, help="seconds of audio a realtime client may send "
        "ahead of the wall clock (a file streamed faster than real time); beyond, it is "
        "closed (1008)")
    realtime_max_unsent_bytes: int = flag(
        1024 * 1024, type="size", low=1024, help="event bytes a realtime client may leave "
        "unread; beyond, it is closed (1008), and reset if it still reads nothing for "
        "LLMSERVE_STALL_TIMEOUT seconds. Default: {default}")
    enable_request_id_headers: bool = flag(
        False, help="echo X-Request-Id (or a new id) on every response")
    allowed_origins: list[str] = flag(factory=list, type="json_list", help="CORS origins "
        'allowed, as a JSON list (e.g. \'["https://a.example"]\')')
    enable_log_requests: bool = flag(False, negatable=True, help="log one line per request")
    log_level: str = flag("info", choices=("debug", "info", "warning", "error", "critical"),
                          help="log level")
    log_json: bool = flag(False, help="log as JSON lines")
    # operator routes (server/api/dev.py, profile.py) and the vendored Swagger UI at /docs
    enable_dev_endpoints: bool = flag(False, help="serve the operator routes (/pause, "
        "/resume, /sleep, /wake_up, /abort_requests, /reset_prefix_cache, the weight "
        "transfer's /start_weight_update, /update_weights, /finish_weight_update ..., "
        "/weight_info, /server_info, /collective_rpc ...); also on with "
        f"{DEV_MODE_ENV}=1. Behind the API key when one is set")
    max_weight_chunk_bytes: int = flag(
        256 * 1024 * 1024, type="size", low=1024, help="largest safetensors chunk one "
        "POST /update_weights may upload (application/octet-stream; 413 above). A weight "
        "update never stages more than one copy of the model, however many chunks come")
    profiler_config: dict[str, object] | None = flag(
        None, type="profiler_config", metavar="JSON", help="serve /start_profile and "
        '/stop_profile, as vLLM spells it: {"profiler": "torch", "torch_profiler_dir": '
        'DIR} (optional torch_profiler_with_stack, _record_shapes, _with_memory, '
        "_with_flops, _use_gzip). Default: none")
    enable_offline_docs: bool = flag(False, help="serve /docs as Swagger UI from assets "
        "shipped in the package (no CDN); otherwise /docs is a plain operation list")
    # pooling (server/api/pooling.py)
    runner: str = flag(
        "auto", choices=("auto", "generate", "pooling"), help="what the model serves: "
        "'pooling' the pooling routes only (/v1/embeddings, /pooling, /v2/embed, score and "
        "rerank), 'generate' the generation routes; 'auto' is pooling for an encoder (BERT) "
        "and generate otherwise")
    pooler_config: str | None = flag(
        None, metavar="JSON", help="pooling as vLLM spells it: '{\"pooling_type\": "
        '"LAST"|"MEAN"|"CLS", "use_activation" (or "normalize"): true}\'; on a generative '
        "model it also serves the pooling routes beside generation. Default: the model's "
        "sentence-transformers pooling, else LAST, normalized")
    max_pooling_inputs: int = flag(
        2048, type="integer", low=1, help="inputs one pooling request may carry (embeddings "
        "input, /v2/embed texts, score and rerank documents, each list); more is a 400 "
        "naming the field, before any tokenizing (2048 is the OpenAI embeddings API's own "
        "limit)")
    # LoRA (server/api/lora.py): adapters loaded at start (name, path)
    lora_modules: list[tuple[str, str]] = flag(
        factory=list, nargs="+", type="lora_module", metavar="NAME=PATH", help="adapters "
        'loaded at start: name=path, or vLLM\'s JSON {"name": ..., "path": ...}')
    allow_runtime_lora_updating: bool = flag(False, help="serve /v1/load_lora_adapter and "
        f"/v1/unload_lora_adapter; also on with {RUNTIME_LORA_ENV}=1. Behind the API key "
        "when one is set")

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
