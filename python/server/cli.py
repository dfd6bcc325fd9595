"""Command line of `python -m server` (flag names follow `vllm serve` where one exists).

The flags are not written here: each is declared on the config field it sets
(``server.config.ServerConfig``, ``actors.config.EngineConfig``, ``AdmissionWindow``) and
``server.flag_parser`` builds the parser and copies the values back. What is left here is
what no single field can say: checks across flags, and settings resolved from several
flags, the environment or the model.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from actors.loader.default_model import NAMED_MODELS
from actors.loader.dtype import resolve_quantization
from actors.params.pooling import PoolerConfig

from server.frontend.chat import reasoning
from server.frontend.chat.tool_parsers import UnknownToolParserError, check_tool_parser_flags
from server.config import DEV_MODE_ENV, KEY_ENV_VARS, RUNTIME_LORA_ENV, ServerConfig
from server.flag_parser import build, field_values, parser_for
from server.state_dir import default_responses_store, store_path_problem


def build_parser() -> argparse.ArgumentParser:
    """Every flag of ServerConfig's fields, its engine's and admission window's included."""
    return parser_for(ServerConfig, prog="python -m server",
                      description="Serve a model over an OpenAI-compatible HTTP API.")


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The checks that read more than one flag, or more than a flag's text."""
    try:
        check_tool_parser_flags(args.enable_auto_tool_choice, args.tool_call_parser)
    except UnknownToolParserError as exc:
        parser.error(str(exc))
    if args.reasoning_parser is not None:
        try:
            reasoning.get(args.reasoning_parser)
        except reasoning.UnknownReasoningParserError as exc:
            parser.error(str(exc))
    elif args.reasoning_content_field:
        parser.error("--reasoning-content-field needs --reasoning-parser")
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
    if args.elastic_ep_max_dp_size is not None:
        if not args.enable_elastic_ep:
            parser.error("--elastic-ep-max-dp-size needs --enable-elastic-ep")
        if args.elastic_ep_max_dp_size < args.data_parallel_size:
            parser.error("--elastic-ep-max-dp-size must be greater than or equal to the "
                         f"initial data_parallel_size ({args.data_parallel_size}).")


def _resolve(args: argparse.Namespace, values: dict[str, Any]) -> None:
    """The settings that are more than their own flag's value: another flag's, an
    environment variable's or the model's say."""
    model = values["model"]
    values["quantization"] = resolve_quantization(values["quantization"], model,
                                                  values["dtype"])
    structured = values.pop("structured_outputs_backend")  # --structured-outputs-config
    if structured:
        values["structured_outputs_backend"] = structured["backend"]
        values["structured_fast_forward"] = structured["fast_forward"]
        values["structured_enable_in_reasoning"] = structured["enable_in_reasoning"]
    kv_events = values["extra"]  # --kv-events-config; None when events are off
    values["extra"] = {"kv_events_config": kv_events} if kv_events else {}
    # a named model (gemma-3-270m, whisper-tiny.en) is served by its name; a path by its
    # stem, later
    values["served_model_names"] = values["served_model_names"] or (
        [model] if model in NAMED_MODELS else [])
    values["api_keys"] = list(values["api_keys"] or [
        v for v in (os.environ.get(k) for k in KEY_ENV_VARS) if v][:1])
    values["responses_store"] = None if args.no_responses_store else (
        values["responses_store"] or default_responses_store())
    values["enable_dev_endpoints"] = values["enable_dev_endpoints"] or (
        os.environ.get(DEV_MODE_ENV, "").strip() in ("1", "true", "True"))
    values["allow_runtime_lora_updating"] = values["allow_runtime_lora_updating"] or (
        os.environ.get(RUNTIME_LORA_ENV, "").strip().lower() in ("1", "true"))


def parse_args(argv: list[str] | None = None) -> ServerConfig:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check(parser, args)
    values = field_values(ServerConfig, args)
    _resolve(args, values)
    return build(ServerConfig, values)


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    from server.supervisor import serve  # heavy imports only once the flags are good

    return serve(config)


if __name__ == "__main__":
    sys.exit(main())
