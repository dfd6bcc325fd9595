"""The README's flag list (the paragraph that begins "`python -m server --help` lists
every flag") against the parser: every flag the parser takes is in the list, with its
aliases and --no- forms, and every flag the list names is one the parser takes.

Flags are read from the paragraph's code spans; `--[no-]x` names --x and --no-x.
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
START = "`python -m server --help` lists every"


def flag_list() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(START) + len(START)
    return text[start:text.index("\n\n", start)]


def documented_flags() -> set[str]:
    found: set[str] = set()
    for span in re.findall(r"`([^`]*)`", flag_list()):
        for name in re.findall(r"(?<![\w-])(--?(?:\[no-\])?[a-z0-9][a-z0-9-]*)", span):
            if "[no-]" in name:
                found |= {name.replace("[no-]", ""), name.replace("[no-]", "no-")}
            else:
                found.add(name)
    return found


def parser_flags() -> set[str]:
    from server.cli import build_parser

    return {option for action in build_parser()._actions
            for option in action.option_strings if option not in ("-h", "--help")}


def test_the_readme_lists_every_flag_of_the_parser():
    missing = parser_flags() - documented_flags()
    assert not missing, f"flags missing from the README's flag list: {sorted(missing)}"


def test_every_flag_the_readme_lists_exists():
    unknown = documented_flags() - parser_flags()
    assert not unknown, f"the README's flag list names flags the parser lacks: {sorted(unknown)}"


def test_the_flag_list_is_read_as_meant():
    # the reader itself: a --[no-] spelling, an alias and a flag in a span with its value
    documented = documented_flags()
    assert {"--batch-invariant", "--no-batch-invariant", "-dp", "-q",
            "--quantization-activations", "--lora-modules"} <= documented
