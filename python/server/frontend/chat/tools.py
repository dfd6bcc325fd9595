"""Tool choice of a chat request (a `ChatRequest`, whichever dialect built it), the request
side: which choice a request makes, the checks vLLM makes of `tools` and `tool_choice`
(400s naming the field), what the choice changes in the SamplingParams, and the assistant
history the chat template receives.

- `"none"` (and no tools): the output is plain content; tools still reach the template.
- `"auto"` (also `tools` without `tool_choice`): the server's `--tool-call-parser` reads the
  output; without `--enable-auto-tool-choice` it is a 400, as vLLM answers it.
- `"required"` and a named function: generation is constrained to the tool-call JSON
  (`tool_choice_schema`, carried as `SamplingParams.structured`) and read back by the
  forced parsers. vLLM serves them only when a tool-call parser is configured; so does this.

Some parsers' markers are special tokens, which the detokenizer would drop: for those an
`"auto"` request's output keeps special tokens, as vLLM's parsers set it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from actors.errors import RequestRefused
from actors.params.sampling import SamplingParams
from actors.params.structured import StructuredSpec

from server.config import ServerConfig
from server.errors import bad_request
from server.frontend.chat.request import ChatRequest
from server.frontend.chat.tool_parsers import ToolParser, get_tool_parser
from server.frontend.chat.tool_parsers.strict import strict_tool_tag
from server.frontend.chat.tool_parsers.tool_schema import (
    ToolChoiceError,
    forced_tool_parser,
    named_function,
    tool_choice_schema,
)
from server.json_depth import MAX_JSON_DEPTH, text_nesting_depth

logger = logging.getLogger(__name__)

_CORRECT_NAMED = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tool choice means for its generation and its response."""

    choice: str  # "none", "auto", "required" or "named"
    tools: list[dict[str, Any]] | None  # as the template receives them
    parser: ToolParser | None = None  # None: the output is content as it is
    schema: dict[str, Any] | None = None  # the constraint of "required" and named
    keep_special_tokens: bool = False
    parallel_tool_calls: bool | None = True
    # "auto" with strict tools (or --tool-strict-level): the structural tag that holds
    # the calls the model writes to the tools, unless the request constrains the output
    strict_tag: dict[str, Any] | None = None

    @property
    def named(self) -> bool:
        return self.choice == "named"

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "named")

    @property
    def auto_parser(self) -> str | None:
        """The name of the tool-call parser reading the model's own call format, if any."""
        return getattr(self.parser, "name", None) if self.choice == "auto" else None


def check_tool_fields(chat: ChatRequest) -> Any:
    """vLLM's protocol checks, in its order; returns the effective tool_choice."""
    choice = chat.effective_tool_choice
    structured = chat.structured_outputs
    if isinstance(structured, Mapping) and any(
        structured.get(k) is not None for k in ("json", "regex", "choice")
    ) and choice not in ("none", "auto", "required"):
        raise bad_request("You can only either use constraints for structured outputs or tools, "
                          "not both.", "tool_choice")
    tools = chat.tools
    if tools is not None and len(tools) == 0 and not isinstance(choice, dict):
        # As vLLM 0.34 and OpenAI: an empty array is an omitted one; "auto" and "required"
        # have nothing to call. A named tool keeps it, so the lookup below names the mismatch.
        return "none"
    if choice is None or choice == "none":
        return choice
    if tools is None:
        raise bad_request("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if isinstance(choice, dict):
        function = choice.get("function")
        if not isinstance(function, dict):
            raise bad_request(f"Invalid value for `function`: `{function}` in `tool_choice`! "
                              f"{_CORRECT_NAMED}", "tool_choice.function")
        if "name" not in function:
            raise bad_request("Expected field `name` in `function` in `tool_choice`! "
                              f"{_CORRECT_NAMED}", "tool_choice.function.name")
        name = function["name"]
        if not isinstance(name, str) or not name:
            raise bad_request(f"Invalid `name` in `function`: `{name}` in `tool_choice`! "
                              f"{_CORRECT_NAMED}", "tool_choice.function.name")
        if all(tool["function"]["name"] != name for tool in tools):
            raise bad_request("The tool specified in `tool_choice` does not match any of the "
                              "specified `tools`", "tool_choice")
    elif choice not in ("auto", "required"):
        raise bad_request(f"Invalid value for `tool_choice`: {choice}! Only named tools, "
                          '"none", "auto" or "required" are supported.', "tool_choice")
    return choice


def plan_tools(chat: ChatRequest, config: ServerConfig) -> ToolPlan:
    """The request's tool choice, checked against the request and the server's flags."""
    choice = check_tool_fields(chat)
    tools = chat.tool_dicts() or None  # an empty array is no tools: the template sees none
    if choice is None or choice == "none":
        return ToolPlan("none", tools)
    # As vLLM: "auto" needs both flags, "required" and named functions the parser only
    parser_name = config.tool_call_parser
    if choice == "auto" and not config.enable_auto_tool_choice:
        raise bad_request('"auto" tool choice requires --enable-auto-tool-choice and '
                          "--tool-call-parser to be set", "tool_choice")
    if parser_name is None:
        what = (f'function "{named_function(choice)}"' if isinstance(choice, dict)
                else f'"{choice}"')
        raise bad_request(f"tool_choice={what} requires --tool-call-parser to be set",
                          "tool_choice")
    parser_cls = get_tool_parser(parser_name)
    parallel = chat.parallel_tool_calls
    if choice == "auto":
        return ToolPlan("auto", tools, parser_cls(tools),
                        keep_special_tokens=parser_cls.keeps_special_tokens,
                        parallel_tool_calls=parallel,
                        strict_tag=strict_tool_tag(parser_cls, tools,
                                                   config.tool_strict_level, parallel))
    try:
        schema = tool_choice_schema(tools, choice, parallel)
    except ToolChoiceError as exc:
        raise bad_request(str(exc), "tools") from None
    parser = forced_tool_parser(choice, parallel)
    # The constrained output is JSON: no marker to keep, so special tokens are skipped.
    return ToolPlan("named" if isinstance(choice, dict) else "required", tools, parser,
                    schema, parallel_tool_calls=parallel)


def apply_plan(params: SamplingParams, plan: ToolPlan) -> SamplingParams:
    """The request's SamplingParams with what its tool choice changes."""
    changes: dict[str, Any] = {}
    if plan.keep_special_tokens:
        changes["skip_special_tokens"] = False
    if plan.strict_tag is not None and params.structured is None:
        changes["structured"] = _tools_spec(structural_tag=plan.strict_tag)
    if plan.schema is not None:
        changes["structured"] = _tools_spec(json=plan.schema)
    return dataclasses.replace(params, **changes) if changes else params


def _tools_spec(**kind: Any) -> StructuredSpec:
    """The constraint a tool plan puts on the output (a 400 naming `tools` if the tools'
    schemas cannot make one)."""
    try:
        spec = StructuredSpec.from_params(**kind, source="tools")
        spec.validate(grammar_check=False, metaschema=False)
    except RequestRefused as exc:
        raise bad_request(f"the tools' parameter schemas cannot constrain the output: "
                          f"{exc.message}", "tools") from None
    return spec


def check_arguments_depth(arguments: str, param: str) -> None:
    """A 400 naming `param` when JSON arguments text nests deeper than a request body may
    (decoding it would recurse once per level: 100 000 `[` raised RecursionError)."""
    if text_nesting_depth(arguments) > MAX_JSON_DEPTH:
        raise bad_request(f"the tool call arguments are nested more than {MAX_JSON_DEPTH} "
                          "levels deep", param)


def history_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant tool calls as chat templates read them (as vLLM hands them over): the
    arguments an object, not JSON text; an empty tool_calls list dropped. Arguments that
    are not a JSON object become {} rather than failing every later turn of the chat;
    arguments nested too deeply are a 400 naming them. An assistant's reasoning, given as
    `reasoning` or by its older name `reasoning_content`, reaches the template under both
    names (templates read either), `reasoning` winning when both are given."""
    out = []
    for index, message in enumerate(messages):
        message = _with_reasoning(message)
        calls = message.get("tool_calls")
        if message.get("role") != "assistant" or calls is None:
            out.append(message)
            continue
        message = dict(message)
        if not calls:
            message.pop("tool_calls")
            out.append(message)
            continue
        fixed = []
        for number, call in enumerate(calls):
            function = call.get("function")
            if call.get("type", "function") != "function" or not isinstance(function, dict):
                raise bad_request("chat completions only support assistant tool_calls of "
                                  "type 'function'.", "tool_calls")
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                check_arguments_depth(
                    arguments, f"messages[{index}].tool_calls[{number}].function.arguments")
                try:
                    arguments = json.loads(arguments) if arguments else {}
                except ValueError:
                    logger.warning("tool call arguments in the history are not JSON; "
                                   "rendering them as {}")
                    arguments = {}
            if not isinstance(arguments, dict):
                arguments = {}
            fixed.append(dict(call, function=dict(function, arguments=arguments)))
        message["tool_calls"] = fixed
        out.append(message)
    return out


def _with_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    if message.get("role") != "assistant":
        return message
    thought = message.get("reasoning")
    if thought is None:
        thought = message.get("reasoning_content")
    if thought is None:
        return message
    return dict(message, reasoning=thought, reasoning_content=thought)
