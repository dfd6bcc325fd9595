"""Value types of the command line (argparse `type=`): sizes with k/m/g suffixes, token
counts, name=path pairs, JSON lists, chat template kwargs, the reasoning-effort map, and
vLLM's JSON configs (--kv-events-config,
--structured-outputs-config, --profiler-config). Each raises argparse's
ArgumentTypeError, so a bad value is a usage error (exit 2) before anything loads. Range
checks of plain numbers are server.flag_checks'."""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any

from actors.config import PROFILE_MAX_BYTES, PROFILE_MAX_ITERATIONS


def lora_module(text: str) -> tuple[str, str]:
    """--lora-modules item: name=path, or vLLM's JSON object {"name", "path"}."""
    if text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not valid JSON: {text[:100]!r}") from None
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)
                and isinstance(obj.get("path"), str)):
            raise argparse.ArgumentTypeError('a JSON LoRA module needs "name" and "path"')
        return obj["name"], obj["path"]
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected name=path, got {text[:100]!r}")
    return name, path


def size(text: str) -> int:
    """Bytes, with an optional k/m/g/t suffix (powers of 1024): '2g', '512M', '1048576'."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    scale = 1024 ** " kmgt".index(m.group(2).lower() or " ")
    return int(float(m.group(1)) * scale)


_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def tokens(text: str) -> int:
    """A token count as vLLM reads one: '2048'; a decimal suffix k/m/g/t ('8k' = 8000,
    '25.6k' = 25600); a binary one K/M/G/T, whole numbers only ('8K' = 8192)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a token count: {text!r}")
    number, suffix = m.groups()
    if suffix in _BINARY:
        if not number.isdigit():
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean "
                f"to use {number}{suffix.lower()} instead?")
        return int(number) * _BINARY[suffix]
    return int(float(number) * _DECIMAL.get(suffix, 1))


def context_tokens(text: str) -> int | None:
    """--max-model-len: a token count, or 'auto' / -1 for the model's own (vLLM's)."""
    if text.strip().lower() in ("-1", "auto"):
        return None
    return tokens(text)


_STRUCTURED_BACKENDS = ("auto", "guidance", "xgrammar")


def kv_events_config(text: str) -> dict[str, Any] | None:
    """--kv-events-config: vLLM's KVEventsConfig as a JSON object; None when events are off."""
    from actors.core.kv_events import parse_kv_events_config

    try:
        return parse_kv_events_config(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def structured_config(text: str) -> dict[str, Any]:
    """--structured-outputs-config: 'backend=guidance,enable_in_reasoning=true' or
    '{"backend": "guidance", "enable_in_reasoning": true}'."""
    try:
        doc = json.loads(text) if text.lstrip().startswith("{") else dict(
            part.split("=", 1) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not key=value pairs nor a JSON object: {text!r}")
    doc = {str(k).strip().replace("-", "_"): v for k, v in doc.items()}
    known = ("backend", "fast_forward", "enable_in_reasoning")
    unknown = sorted(set(doc) - set(known))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown structured outputs setting(s): "
                                         f"{', '.join(unknown)} (known: {', '.join(known)})")
    backend = str(doc.get("backend", "auto")).strip()
    if backend not in _STRUCTURED_BACKENDS:
        raise argparse.ArgumentTypeError(f"backend must be one of "
                                         f"{', '.join(_STRUCTURED_BACKENDS)}, got {backend!r}")
    return {"backend": backend, "fast_forward": _switch(doc, "fast_forward", True),
            "enable_in_reasoning": _switch(doc, "enable_in_reasoning", False)}


def _switch(doc: dict[str, Any], key: str, default: bool) -> bool:
    value = doc.get(key, default)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    if not isinstance(value, bool):
        raise argparse.ArgumentTypeError(f"{key} must be true or false, got {value!r}")
    return value


_PROFILER_FLAGS = ("torch_profiler_with_stack", "torch_profiler_record_shapes",
                   "torch_profiler_with_memory", "torch_profiler_with_flops",
                   "torch_profiler_use_gzip")
# Bounds of one profiling session (actors.config): vLLM's max_iterations (0 or absent
# means our default, never unbounded) and growth of resident memory while it records.
_PROFILER_BOUNDS = ("max_iterations", "max_profile_bytes")


def profiler_config(text: str) -> dict[str, object]:
    """--profiler-config: vLLM's ProfilerConfig as JSON, the torch profiler only."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        raise argparse.ArgumentTypeError(f"not a JSON object: {text!r}")
    unknown = sorted(set(doc) - {"profiler", "torch_profiler_dir", *_PROFILER_FLAGS,
                                 *_PROFILER_BOUNDS})
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown profiler setting(s): {', '.join(unknown)}")
    if doc.get("profiler") != "torch":
        raise argparse.ArgumentTypeError(
            f"profiler must be 'torch' (the one profiler served), got {doc.get('profiler')!r}")
    directory = doc.get("torch_profiler_dir")
    if not isinstance(directory, str) or not directory.strip():
        raise argparse.ArgumentTypeError("torch_profiler_dir must be set when profiler is "
                                         "'torch'")
    for flag in _PROFILER_FLAGS:
        if not isinstance(doc.get(flag, False), bool):
            raise argparse.ArgumentTypeError(f"{flag} must be true or false")
    bounds = {"max_iterations": PROFILE_MAX_ITERATIONS, "max_profile_bytes": PROFILE_MAX_BYTES}
    for name, default in bounds.items():
        value = doc.get(name) or default  # vLLM's 0: "no limit" is our default bound
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer")
        bounds[name] = value
    return {**doc, **bounds,
            "torch_profiler_dir": os.path.abspath(os.path.expanduser(directory))}


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive integer: {text!r}")
    return value


def json_list(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = [s for s in text.split(",") if s]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise argparse.ArgumentTypeError("expected a JSON list of strings")
    return value


def template_kwargs(text: str) -> dict[str, Any]:
    """--default-chat-template-kwargs: a JSON object of keys a request's
    chat_template_kwargs may set (checked now, not on every request)."""
    from server.frontend.chat_template import RESERVED_KWARGS

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    bad = sorted(k for k in value if k in RESERVED_KWARGS or not k.isidentifier())
    if bad:
        raise argparse.ArgumentTypeError(f"chat template kwargs may not set {', '.join(bad)}")
    return value


def hf_overrides(text: str) -> dict[str, Any]:
    """--hf-overrides: a JSON object whose keys replace config.json's; what they describe
    is checked when the model loads (a classifier the server cannot build is refused
    there, with the reason)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def effort_map(text: str) -> dict[str, str]:
    """--reasoning-effort-map: a JSON object from request efforts (vLLM's values) to the
    strings the chat template receives instead, checked as vLLM checks it."""
    from server.api.common.chat_protocol import REASONING_EFFORTS

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise argparse.ArgumentTypeError(
            "must be a JSON object mapping reasoning efforts to strings")
    unknown = sorted(set(value) - set(REASONING_EFFORTS))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown efforts {unknown}; keys must be one of {list(REASONING_EFFORTS)}")
    return value


def size_text(n: int) -> str:
    """A byte count as size reads it back: 2147483648 -> '2g'."""
    for suffix, scale in (("t", 1 << 40), ("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{suffix}"
    return str(n)
