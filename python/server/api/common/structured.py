"""Structured outputs at the HTTP edge: a request's constraint fields -> one StructuredSpec,
compiled before admission.

Three spellings reach the same spec: OpenAI's ``response_format`` (``json_object``,
``json_schema``, ``structural_tag``; ``text`` is no constraint), vLLM's
``structured_outputs`` object, and vLLM's older ``guided_*`` fields (vLLM 0.33 ignores
them; this server honours them). A request uses at most one of the three, and one kind
within it; anything else is a 400 naming the field.

The spec rides on ``SamplingParams.structured``; ``server.frontend.structured`` compiles it
before admission.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from actors.errors import RequestRefused
from actors.params.structured import StructuredSpec

from server.api.common.protocol import SamplingFields
from server.errors import bad_request

__all__ = ["spec_of"]

_GUIDED_KINDS = (("guided_json", "json"), ("guided_regex", "regex"),
                 ("guided_choice", "choice"), ("guided_grammar", "grammar"))
_BACKENDS = ("auto", "guidance", "llguidance", "xgrammar", "outlines", "lm-format-enforcer")
_OUR_BACKENDS = {"guidance": "guidance", "llguidance": "guidance", "xgrammar": "xgrammar"}


def spec_of(req: SamplingFields) -> StructuredSpec | None:
    """The request's constraint, or None; raises a 400 naming the field at fault."""
    fmt = req.response_format
    if fmt is not None and fmt.get("type") == "text":
        fmt = None
    so = req.structured_outputs
    guided = [(name, kind) for name, kind in _GUIDED_KINDS if getattr(req, name) is not None]
    used = [name for name, on in (("response_format", fmt is not None),
                                  ("structured_outputs", so is not None),
                                  (guided[0][0] if guided else "", bool(guided))) if on]
    if len(used) > 1:
        raise bad_request(f"{' and '.join(used)} cannot be used together; give one "
                          "constraint", used[-1])
    if len(guided) > 1:
        raise bad_request("only one of " + ", ".join(n for n, _ in guided) + " may be set",
                          guided[1][0])
    backend = _requested_backend(req.guided_decoding_backend)
    spec = _spec(req, fmt, so, guided)
    if spec is not None and backend is not None:
        spec = dataclasses.replace(spec, backend=backend)
    return spec


def _requested_backend(name: str | None) -> str | None:
    """guided_decoding_backend as a backend of ours (None: the server's); vLLM 0.33 accepts
    and ignores the field, this server uses the backend named or says it has none such."""
    if name is None or name == "auto":
        return None
    if name not in _BACKENDS:
        raise bad_request(f"guided_decoding_backend must be one of {', '.join(_BACKENDS)}",
                          "guided_decoding_backend")
    ours = _OUR_BACKENDS.get(name)
    if ours is None:
        raise bad_request(f"guided_decoding_backend {name!r} is not available on this server "
                          "(it has guidance and xgrammar)", "guided_decoding_backend")
    return ours


def _spec(req: SamplingFields, fmt: dict[str, Any] | None, so: Any,
          guided: list[tuple[str, str]]) -> StructuredSpec | None:
    try:
        if fmt is not None:
            return StructuredSpec.from_response_format(fmt)
        if so is not None:
            return StructuredSpec.from_params(
                json=so.json_, regex=so.regex, choice=so.choice, grammar=so.grammar,
                json_object=so.json_object, structural_tag=so.structural_tag,
                whitespace_pattern=so.whitespace_pattern,
                disable_any_whitespace=so.disable_any_whitespace,
                disable_additional_properties=so.disable_additional_properties)
        if guided:
            name, kind = guided[0]
            return StructuredSpec.from_params(
                **{kind: getattr(req, name)}, source=name,
                whitespace_pattern=req.guided_whitespace_pattern)
    except RequestRefused as exc:
        raise bad_request(exc.message, exc.param) from None
    if req.guided_whitespace_pattern is not None:
        raise bad_request("guided_whitespace_pattern needs guided_json",
                          "guided_whitespace_pattern")
    return None
