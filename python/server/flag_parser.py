"""The argparse parser built from the configs' flag metadata, and its values copied back.

Each config field declared with ``actors.flag_spec.flag`` becomes one flag (with its
aliases and any ``also`` flags); a field whose default is a config dataclass
(``ServerConfig.engine``, ``.admission_window``) contributes its own fields' flags in their
place. So the flags appear in field order, and the field is the one place that says a
setting's name, default, type, range and help.

Value types are named in the metadata and resolved here (``VALUE_TYPES``): a parser from
``server.flag_checks`` or ``server.flag_types``, wrapped in the declared range, and the
inverse that writes a default the way the flag reads it (``2g``, ``50.0`` ms). A default
is handed to argparse as that text, which argparse parses like a typed-in value, so the
default shown by ``--help`` is one the flag accepts.

``field_values`` reads the parsed namespace back into one value per field name; ``build``
makes the config objects from such values (a field without a value keeps its default).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from actors.flag_spec import FIELD_DEFAULT, Flag, flags_of

from server import flag_checks as check
from server import flag_types as ft

# name -> (the parser of a typed-in value, the text a default is written as; None: as is)
VALUE_TYPES: dict[str, tuple[Callable[[str], Any], Callable[[Any], str] | None]] = {
    "int": (int, None),
    "integer": (check.integer, lambda n: str(int(n))),
    "tokens": (ft.tokens, None),
    "context_tokens": (ft.context_tokens, None),
    "size": (ft.size, ft.size_text),
    "positive": (ft.positive, None),
    "seconds": (check.seconds, None),
    "milliseconds": (check.milliseconds, lambda s: str(s * 1000)),
    "non_empty": (check.non_empty, None),
    "dtype": (check.dtype, None),
    "model_path": (check.model_path, None),
    "generation_config": (check.generation_config, None),
    "chat_template": (check.chat_template, None),
    "path": (Path, None),
    "json_list": (ft.json_list, None),
    "template_kwargs": (ft.template_kwargs, None),
    "hf_overrides": (ft.hf_overrides, None),
    "effort_map": (ft.effort_map, None),
    "lora_module": (ft.lora_module, None),
    "kv_events_config": (ft.kv_events_config, None),
    "structured_config": (ft.structured_config, None),
    "profiler_config": (ft.profiler_config, None),
}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" unless the help text already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower():
            return text
        return super()._get_help_string(action) or ""


def flagged_fields(cls: type) -> Iterator[tuple[dataclasses.Field, tuple[Flag, ...]]]:
    """Every (field, flags) of `cls` with flags, nested config dataclasses in place."""
    for f in dataclasses.fields(cls):
        nested = f.default_factory
        if isinstance(nested, type) and dataclasses.is_dataclass(nested):
            yield from flagged_fields(nested)
        elif flags_of(f):
            yield f, flags_of(f)


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def _shown(spec: Flag, value: Any) -> Any:
    """`value` as the flag would be given it (the text of a size, ms ...); else as is."""
    show = VALUE_TYPES[spec.type][1] if spec.type else None
    if isinstance(spec.choices, Mapping):
        return next(word for word, v in spec.choices.items() if v == value)
    return show(value) if show is not None and value is not None else value


def _flag_name(f: dataclasses.Field, spec: Flag) -> str:
    return spec.name or "--" + f.name.replace("_", "-")


def dest(f: dataclasses.Field, spec: Flag) -> str:
    """The attribute of argparse's namespace that holds `spec`'s value."""
    return _flag_name(f, spec).lstrip("-").replace("-", "_")


def _add(parser: argparse.ArgumentParser, f: dataclasses.Field, spec: Flag) -> None:
    default = _field_default(f)
    help_text = spec.help() if callable(spec.help) else spec.help
    help_text = help_text.replace("{default}", str(_shown(spec, default)))
    kw: dict[str, Any] = {"help": help_text}
    if spec.switch or (f.type in ("bool", bool) and spec.choices is None):
        kw["action"] = argparse.BooleanOptionalAction if spec.negatable else "store_true"
        kw["default"] = False if spec.switch else default
    else:
        cli_default = default if spec.cli_default is FIELD_DEFAULT else spec.cli_default
        kw["default"] = _shown(spec, cli_default)
        if spec.type is not None:
            parse = VALUE_TYPES[spec.type][0]
            if spec.low is not None or spec.high is not None:
                parse = check.in_range(parse, spec.low, spec.high)
            kw["type"] = parse
        if spec.choices is not None:
            kw["choices"] = list(spec.choices)
        if spec.nargs is not None:
            kw["nargs"] = spec.nargs
        if spec.metavar is not None:
            kw["metavar"] = spec.metavar
    parser.add_argument(_flag_name(f, spec), *spec.aliases, **kw)


def parser_for(cls: type, **kwargs: Any) -> argparse.ArgumentParser:
    """An argparse parser with every flag declared on `cls`'s fields (nested included)."""
    parser = argparse.ArgumentParser(formatter_class=HelpFormatter, **kwargs)
    for f, specs in flagged_fields(cls):
        for spec in specs:
            _add(parser, f, spec)
    return parser


def field_values(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """Field name -> the value its (first) flag parsed to, as the field holds it."""
    values: dict[str, Any] = {}
    for f, (spec, *_) in flagged_fields(cls):
        value = getattr(args, dest(f, spec))
        if isinstance(spec.choices, Mapping):
            value = spec.choices[value]
        elif f.type in ("float", float) and isinstance(value, int):  # an integer flag
            value = float(value)
        assert f.name not in values, f"two config fields named {f.name}"
        values[f.name] = value
    return values


def build(cls: type, values: Mapping[str, Any]) -> Any:
    """A `cls` whose fields (nested configs' too) take `values`; the rest their defaults."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        nested = f.default_factory
        if isinstance(nested, type) and dataclasses.is_dataclass(nested):
            kwargs[f.name] = build(nested, values)
        elif f.name in values:
            kwargs[f.name] = values[f.name]
    return cls(**kwargs)
