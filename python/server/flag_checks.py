"""Argparse value types that refuse what the server could not start with.

Each check runs while the command line is parsed, so a bad value ends the process with
argparse's usage message and exit code 2 instead of a traceback after the model has loaded.
The config fields name them (``type="dtype"``, ``low=1``) and ``server.flag_parser`` applies
them.
Values that need the model to judge (a --max-model-len beyond its positions, a KV cache too
small for one sequence) are the engine's to refuse at load.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

N = TypeVar("N", int, float)

# actors.loader.dtype.DTYPE_CHOICES, repeated so that parsing needs no engine imports
# (tests/test_server_limits.py checks they agree); "float" is vLLM's spelling of float32.
DTYPES = ("auto", "float32", "bfloat16")
DTYPE_ALIASES = {"float": "float32"}
UNSUPPORTED_DTYPES = ("float16", "half")


def _fail(message: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(message)


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _fail(f"not an integer: {text!r}") from None


def in_range(parse: Callable[[str], N], low: N, high: N | None = None) -> Callable[[str], N]:
    """`parse`, then refuse values outside [low, high]."""
    def check(text: str) -> N:
        value = parse(text)
        if value is None:  # the parser's "not set" (e.g. --max-model-len auto)
            return value
        if value < low or (high is not None and value > high):
            bounds = f"at least {low}" if high is None else f"in [{low}, {high}]"
            raise _fail(f"must be {bounds}, got {text!r}")
        return value

    check.__name__ = getattr(parse, "__name__", "value")
    return check


def seconds(text: str) -> float:
    """A finite, non-negative number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise _fail(f"must be a finite number of seconds >= 0, got {text!r}")
    return value


def milliseconds(text: str) -> float:
    """A finite, non-negative number of milliseconds, returned in seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise _fail(f"must be a finite number of milliseconds >= 0, got {text!r}")
    return value / 1000


def non_empty(text: str) -> str:
    if not text.strip():
        raise _fail("must not be empty")
    return text


def dtype(text: str) -> str:
    name = DTYPE_ALIASES.get(text, text)
    if name in UNSUPPORTED_DTYPES:
        raise _fail(f"{text} is not supported (the kernels compute in float32 with float32 or "
                    "bfloat16 weights); use bfloat16 for half-size weights")
    if name not in DTYPES:
        raise _fail(f"must be one of {', '.join(DTYPES + tuple(DTYPE_ALIASES))}, got {text!r}")
    return name


def model_path(text: str) -> str:
    from actors.loader.default_model import NAMED_MODELS  # standard library only

    path = Path(text).expanduser()
    if text in NAMED_MODELS and not path.exists():
        return text  # a named model (gemma-3-270m, whisper-base ...): found when it loads
    if path.is_dir() or (path.is_file() and path.suffix == ".gguf"):
        return text
    if not path.exists():
        raise _fail(f"{text!r} does not exist (nor is it one of the named models: "
                    f"{', '.join(NAMED_MODELS)})")
    raise _fail(f"{text!r} is neither a model directory nor a .gguf file")


def generation_config(text: str) -> str:
    if text in ("auto", "vllm") or (Path(text) / "generation_config.json").is_file():
        return text
    raise _fail(f"must be 'auto', 'vllm' or a folder holding generation_config.json, "
                f"got {text!r}")


def chat_template(text: str) -> str:
    """A template file or literal template text that loads and parses."""
    from server.frontend.chat_template import load_template_arg, parse_template

    try:
        source = load_template_arg(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _fail(str(exc)) from None
    problem = parse_template(source or "")
    if problem is not None:
        raise _fail(problem)
    return text
