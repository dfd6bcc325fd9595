"""Command-line flags as metadata of config fields: each setting is written once.

A field of ``EngineConfig``, ``AdmissionWindow`` or ``ServerConfig`` that the server's
command line sets is declared with ``flag(...)`` instead of ``field(...)``: its default,
and beside it the flag's name, aliases, value type, range, choices and help. The server
(``server.flag_parser``) builds its argparse parser from these and copies the parsed values
back into the configs field by field, as vLLM's ``EngineArgs`` derives ``vllm serve``'s
flags from its config classes. So ``--help``, the range checks and the copy cannot drift
from the field.

A value type is named, not imported (``type="tokens"``): parsers live on the server's side
(``server.flag_checks``, ``server.flag_types``), and this module, like ``actors.config``,
imports only the standard library so that ``--help`` loads no engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["FIELD_DEFAULT", "Flag", "flag", "flags_of"]



class _FieldDefault:
    def __repr__(self) -> str:
        return "FIELD_DEFAULT"


# Flag.cli_default's "the field's own default".
FIELD_DEFAULT: Any = _FieldDefault()


@dataclass(frozen=True)
class Flag:
    """One command-line flag of a config field.

    ``help`` may hold ``{default}``, replaced by the default as the flag would read it
    back (2g, not 2147483648); help that mentions no default gets argparse's
    "(default: X)". A callable ``help`` is called when the parser is built (text that
    needs an import the config module must not make).
    """

    help: str | Callable[[], str]
    name: str = ""  # "" : "--" + the field's name, "_" written "-"
    aliases: tuple[str, ...] = ()  # vLLM's short spellings: "-dp", "-q"
    # A value type of server.flag_parser.VALUE_TYPES ("integer", "size", "tokens" ...);
    # None: the text itself, or a switch for a bool field.
    type: str | None = None
    low: float | None = None  # the range the value must lie in (inclusive); None: open
    high: float | None = None
    # The accepted words; a mapping also gives the value each word stands for
    # (--linear-routing on|off for a bool).
    choices: tuple[str, ...] | Mapping[str, object] | None = None
    negatable: bool = False  # a bool switch with its --no- form
    switch: bool = False  # a store-true switch on a field that is not a bool
    nargs: str | None = None
    metavar: str | None = None
    # The command line's default where it differs from the field's (vLLM's serve seeds
    # with 0; --quantization auto). FIELD_DEFAULT: the field's.
    cli_default: object = FIELD_DEFAULT


def flag(default: Any = dataclasses.MISSING, *, factory: Callable[[], Any] | None = None,
         also: tuple[Flag, ...] = (), **spec: Any) -> Any:
    """A dataclass field whose value a command-line flag sets (``spec``: Flag's fields).

    ``also`` adds flags that the command line resolves into the same field (such as
    --no-responses-store beside --responses-store)."""
    meta = {"flags": (Flag(**spec), *also)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def flags_of(field: dataclasses.Field) -> tuple[Flag, ...]:
    """The flags declared on a config field (none for a field the command line leaves)."""
    return field.metadata.get("flags", ())
