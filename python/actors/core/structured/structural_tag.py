"""Structural tags for the llguidance backend: free text in which each trigger, once the
model writes it, starts one of the tags that begin with it (its begin string, content
under a JSON schema, its end string), then free text again.

Two spellings of a tag list are read, as xgrammar reads them:

- the legacy form, `{"triggers": [...], "structures": [{"begin", "schema", "end"}]}`;
- the `format` form with a `triggered_tags` format, `{"type": "structural_tag", "format":
  {"type": "triggered_tags", "triggers": [...], "tags": [{"type": "tag", "begin",
  "content": {"type": "json_schema", "json_schema": ...}, "end"}], "stop_after_first":
  bool}}`, the subset vLLM builds for tool calls. `stop_after_first` ends the output
  after the first tag (one tool call at most); `at_least_one` is refused (a tag is never
  forced here: tool choice "required" constrains the output to JSON instead).

A trigger that is one of the tokenizer's special tokens is matched as that token (its text
never appears in the text a model writes otherwise); any other trigger is matched as text,
lazily, so the free text ends at its first occurrence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from actors.core.structured.spec import StructuredSpec


@dataclass(frozen=True)
class TagItem:
    trigger: str
    begin: str
    schema: dict[str, Any] | bool
    end: str


def read_tags(spec: StructuredSpec) -> tuple[list[TagItem], bool]:
    """The tags of a structural tag and whether the output stops after the first one."""
    tag = spec.structural_tag()
    if "format" in tag and "structures" not in tag:
        return _read_format(spec, tag["format"])
    triggers, structures = tag.get("triggers"), tag.get("structures")
    _check_triggers(spec, triggers)
    if not isinstance(structures, list) or not structures:
        raise spec.refuse("a structural tag needs a list of non-empty 'triggers' and a "
                          "non-empty list of 'structures'")
    items = []
    for i, s in enumerate(structures):
        if not isinstance(s, dict):
            raise spec.refuse(f"structures[{i}] needs string 'begin' and 'end'")
        items.append(_item(spec, f"structures[{i}]", triggers, s, s.get("schema", True)))
    return items, False


def _read_format(spec: StructuredSpec, fmt: Any) -> tuple[list[TagItem], bool]:
    if not isinstance(fmt, dict) or fmt.get("type") != "triggered_tags":
        raise spec.refuse("of the structural tag 'format' types only 'triggered_tags' is "
                          "supported by the guidance backend")
    if fmt.get("at_least_one"):
        raise spec.refuse("'at_least_one' structural tags are not supported by the "
                          "guidance backend")
    triggers, tags = fmt.get("triggers"), fmt.get("tags")
    _check_triggers(spec, triggers)
    if not isinstance(tags, list) or not tags:
        raise spec.refuse("a 'triggered_tags' format needs a non-empty list of 'tags'")
    items = []
    for i, t in enumerate(tags):
        where = f"format.tags[{i}]"
        content = t.get("content") if isinstance(t, dict) else None
        if not isinstance(content, dict) or content.get("type") not in ("json_schema",
                                                                        "any_text"):
            raise spec.refuse(f"{where} needs a 'json_schema' or 'any_text' content")
        schema = content.get("json_schema", True) if content["type"] == "json_schema" else None
        items.append(_item(spec, where, triggers, t, schema))
    return items, bool(fmt.get("stop_after_first"))


def _check_triggers(spec: StructuredSpec, triggers: Any) -> None:
    if not isinstance(triggers, list) or not triggers or not all(
            isinstance(t, str) and t for t in triggers):
        raise spec.refuse("a structural tag needs a list of non-empty 'triggers' and a "
                          "non-empty list of 'structures'")


def _item(spec: StructuredSpec, where: str, triggers: list[str], s: dict[str, Any],
          schema: Any) -> TagItem:
    if not all(isinstance(s.get(k), str) for k in ("begin", "end")):
        raise spec.refuse(f"{where} needs string 'begin' and 'end'")
    trigger = next((t for t in triggers if s["begin"].startswith(t)), None)
    if trigger is None:
        raise spec.refuse(f"{where}.begin {s['begin']!r} starts with none of the triggers")
    if schema is None:
        schema = True  # any text is read as the loosest content this backend offers
    if not isinstance(schema, (dict, bool)):
        raise spec.refuse(f"{where}.schema must be a JSON schema object")
    return TagItem(trigger, s["begin"], schema, s["end"])


def _text(s: str) -> str:
    return json.dumps(s) if s else ""


def to_lark(items: list[TagItem], stop_after_first: bool, special: frozenset[str]) -> str:
    """The llguidance Lark grammar of the tags (schemas already prepared)."""
    options = " | ".join(f"tag_{i}" for i in range(len(items)))
    start = (f"start: TAG_TEXT | {options}" if stop_after_first
             else f"start: ({options})* TAG_TEXT")
    lines = ["%llguidance {}", start, r"TAG_TEXT: /(.|\n)*/"]
    for i, item in enumerate(items):
        schema = item.schema if isinstance(item.schema, dict) else (
            {} if item.schema else {"not": {}})
        body = f"{_text(item.begin[len(item.trigger):])} %json {json.dumps(schema)} " \
               f"{_text(item.end)}"
        if item.trigger in special:
            lines.append(f"tag_{i}: TAG_TEXT {item.trigger} {body}")
        else:
            lines.append(f"tag_{i}_trig[lazy]: TAG_TEXT {_text(item.trigger)}")
            lines.append(f"tag_{i}: tag_{i}_trig {body}")
    return "\n".join(lines) + "\n"
