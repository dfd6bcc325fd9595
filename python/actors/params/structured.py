"""What a request constrains its output to: ``StructuredSpec`` and its backend-free checks.

It lives with the other request parameters (``SamplingParams.structured`` carries it, across
the engine-process boundary too) and imports nothing of the engine core at module level.

A spec is the request's ``structured_outputs`` (or ``response_format``) reduced to one frozen,
hashable value, so that it can key the compiled-grammar cache and travel between the server
and the engine. Exactly one constraint kind is set per spec; the whitespace options only
matter for the JSON kinds.

``validate()`` refuses, naming the request field at fault, everything that can be known to
be wrong without a tokenizer: a malformed or over-deep JSON schema, a schema that breaks its
metaschema, an empty grammar or choice list, a regex with a NUL, a malformed structural tag,
and (through llguidance, when installed) what its grammar compiler rejects: dangling
``$ref``, patterns it cannot parse, unknown Lark rules, ...
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from actors.errors import RequestRefused

__all__ = ["KINDS", "MAX_JSON_NESTING", "Kind", "StructuredSpec"]

Kind = Literal["json", "regex", "choice", "grammar", "json_object", "structural_tag"]
KINDS: tuple[str, ...] = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")

# vLLM refuses schemas (and structural tags, with some slack for their wrapper) whose
# objects and arrays nest deeper than this; the same bound keeps the metaschema walk and the
# grammar compilers far from their recursion limits.
MAX_JSON_NESTING = 64
_STRUCTURAL_TAG_NESTING = MAX_JSON_NESTING + 16


@dataclass(frozen=True, slots=True)
class StructuredSpec:
    """One output constraint.

    ``value`` by kind: ``json`` the schema as JSON text (a dict given to ``from_params`` is
    serialised with its key order kept: property order is output order); ``regex`` and
    ``grammar`` the pattern / grammar text (Lark or GBNF); ``choice`` a tuple of strings;
    ``json_object`` None; ``structural_tag`` the tag description as JSON text.

    ``source`` is the request object it came from (``structured_outputs`` or
    ``response_format``) and only shapes the ``param`` of refusals. ``backend`` is the
    grammar backend the request asked for (``guided_decoding_backend``: guidance or
    xgrammar); None: the server's.
    """

    kind: Kind
    value: str | tuple[str, ...] | None = None
    whitespace_pattern: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    source: str = "structured_outputs"
    backend: str | None = None

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_params(
        cls,
        *,
        json: str | dict[str, Any] | bool | None = None,
        regex: str | None = None,
        choice: list[str] | tuple[str, ...] | None = None,
        grammar: str | None = None,
        json_object: bool | None = None,
        structural_tag: str | dict[str, Any] | None = None,
        whitespace_pattern: str | None = None,
        disable_any_whitespace: bool = False,
        disable_additional_properties: bool = False,
        source: str = "structured_outputs",
    ) -> StructuredSpec:
        """The spec of a ``structured_outputs`` object; refuses none or several kinds."""
        given = {k: v for k, v in (("json", json), ("regex", regex), ("choice", choice),
                                   ("grammar", grammar), ("json_object", json_object),
                                   ("structural_tag", structural_tag)) if v is not None}
        if len(given) != 1:
            what = "none" if not given else ", ".join(sorted(given))
            raise RequestRefused(
                f"{source} must set exactly one of {', '.join(KINDS)} (got {what})", source)
        kind, value = next(iter(given.items()))
        if kind == "json_object":
            if value is not True:
                raise RequestRefused(f"{source}.json_object must be true when set; omit "
                                     f"{source} to leave the output unconstrained",
                                     f"{source}.json_object")
            value = None
        elif kind in ("json", "structural_tag") and not isinstance(value, str):
            value = _dumps(value)
        elif kind == "choice" and isinstance(value, list):
            value = tuple(value)
        return cls(kind, value, whitespace_pattern, bool(disable_any_whitespace),
                   bool(disable_additional_properties), source)  # type: ignore[arg-type]

    @classmethod
    def from_response_format(cls, response_format: dict[str, Any]) -> StructuredSpec | None:
        """The spec of an OpenAI ``response_format`` object; None for ``{"type": "text"}``."""
        param = "response_format"
        if not isinstance(response_format, dict):
            raise RequestRefused("response_format must be an object", param)
        kind = response_format.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            return cls("json_object", None, source=param)
        if kind == "json_schema":
            body = response_format.get("json_schema")
            if not isinstance(body, dict) or "schema" not in body:
                raise RequestRefused("response_format of type json_schema needs "
                                     "json_schema.schema", param)
            schema = body["schema"]
            return cls("json", schema if isinstance(schema, str) else _dumps(schema),
                       source=param)
        if kind == "structural_tag":
            return cls("structural_tag", _dumps(response_format), source=param)
        raise RequestRefused(f"response_format.type {kind!r} is not one of text, "
                             "json_object, json_schema, structural_tag", param)

    # -- refusals -------------------------------------------------------------------------

    @property
    def param(self) -> str:
        """The request field a refusal of this constraint names."""
        if self.source == "structured_outputs":
            return f"{self.source}.{self.kind}"
        return self.source

    def refuse(self, message: str, field: str | None = None) -> RequestRefused:
        """A refusal naming this spec's field (or ``field`` of the same request object)."""
        param = self.param if field is None else f"{self.source}.{field}"
        return RequestRefused(message, param)

    # -- checks ---------------------------------------------------------------------------

    def schema(self) -> dict[str, Any] | bool:
        """The parsed JSON schema of a ``json`` / ``json_object`` spec (refused if malformed)."""
        if self.kind == "json_object":
            return {"type": "object"}
        if self.kind != "json":
            raise ValueError(f"a {self.kind} spec has no JSON schema")
        doc = self._load_json(self.value, MAX_JSON_NESTING, "JSON schema")
        if not isinstance(doc, (dict, bool)):
            raise self.refuse("the JSON schema must be an object (or a boolean)")
        return doc

    def structural_tag(self) -> dict[str, Any]:
        """The parsed structural-tag object (refused if malformed)."""
        doc = self._load_json(self.value, _STRUCTURAL_TAG_NESTING, "structural tag")
        if not isinstance(doc, dict):
            raise self.refuse("the structural tag must be a JSON object")
        return doc

    def validate(self, *, grammar_check: bool = True, metaschema: bool = True) -> None:
        """Raises ``RequestRefused`` naming the field when the spec cannot be compiled.

        ``grammar_check`` also runs llguidance's compiler (without a tokenizer: it checks
        the grammar, not the vocabulary); it is skipped when llguidance is not installed.
        ``metaschema`` checks a JSON schema against its metaschema, last: it is the slowest
        check (about a second for a schema of thousands of subschemas), so the cheap
        refusals come first.
        """
        if self.kind not in KINDS:
            raise RequestRefused(f"unknown structured output kind {self.kind!r}", self.source)
        if self.whitespace_pattern is not None:
            if not isinstance(self.whitespace_pattern, str) or not self.whitespace_pattern:
                raise self.refuse("whitespace_pattern must be a non-empty string",
                                  "whitespace_pattern")
            if "\x00" in self.whitespace_pattern:
                raise self.refuse("whitespace_pattern must not contain NUL",
                                  "whitespace_pattern")
        getattr(self, f"_check_{self.kind}")()
        if grammar_check:
            try:
                from actors.core.structured import guidance
            except ImportError:  # llguidance absent: the chosen backend checks at compile
                pass
            else:
                guidance.check_spec(self)
        if metaschema:
            self.check_metaschema()

    def size_bytes(self) -> int:
        """The constraint's size: the UTF-8 bytes of its text (a choice's members, one byte
        between each) and of its whitespace pattern. Orders and bounds compiles."""
        value = self.value
        if isinstance(value, str):
            n = len(value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, tuple):
            n = sum(len(c.encode("utf-8", "surrogatepass")) + 1 for c in value
                    if isinstance(c, str))
        else:
            n = 0
        if isinstance(self.whitespace_pattern, str):
            n += len(self.whitespace_pattern.encode("utf-8", "surrogatepass"))
        return n

    def check_size(self, max_bytes: int | None = None,
                   max_subschemas: int | None = None) -> None:
        """Refuses, naming the field, a constraint of more than ``max_bytes`` (``size_bytes``)
        or, for a JSON schema or a structural tag, more than ``max_subschemas`` schema
        objects (every JSON object in it but the values of const, enum, default and
        examples, which are data). Cheap enough for the event loop: the text is parsed only
        when it holds more "{" than ``max_subschemas``, and then it is at most ``max_bytes``."""
        if max_bytes is not None:
            size = self.size_bytes()
            if size > max_bytes:
                raise self.refuse(f"the constraint is {size} bytes; at most {max_bytes} "
                                  "bytes are accepted")
        if (max_subschemas is None or self.kind not in ("json", "structural_tag")
                or not isinstance(self.value, str) or self.value.count("{") <= max_subschemas):
            return
        doc = self.schema() if self.kind == "json" else self.structural_tag()
        if _subschemas_exceed(doc, max_subschemas):
            what = "JSON schema" if self.kind == "json" else "structural tag"
            raise self.refuse(f"the {what} has more than {max_subschemas} subschemas (JSON "
                              "objects outside const, enum, default and examples); at most "
                              f"{max_subschemas} are accepted")

    def check_metaschema(self) -> None:
        """Refuses a ``json`` spec whose schema breaks its metaschema (no-op otherwise)."""
        if self.kind == "json":
            schema = self.schema()
            if isinstance(schema, dict):
                _check_metaschema(self, schema)

    def _check_json(self) -> None:
        if not isinstance(self.value, str) or not self.value.strip():
            raise self.refuse("the JSON schema must be a non-empty object")
        self.schema()

    def _check_json_object(self) -> None:
        if self.value is not None:
            raise self.refuse("json_object takes no value")

    def _check_regex(self) -> None:
        if not isinstance(self.value, str) or not self.value:
            raise self.refuse("the regex must be a non-empty string")
        if "\x00" in self.value:
            raise self.refuse("the regex must not contain a NUL character")

    def _check_grammar(self) -> None:
        if not isinstance(self.value, str) or not self.value.strip():
            raise self.refuse("the grammar must be a non-empty string")

    def _check_choice(self) -> None:
        if not isinstance(self.value, tuple) or not self.value:
            raise self.refuse("choice must be a non-empty list of strings")
        bad = [c for c in self.value if not isinstance(c, str)]
        if bad:
            raise self.refuse(f"choice members must be strings (got {bad[0]!r})")

    def _check_structural_tag(self) -> None:
        if not isinstance(self.value, str) or not self.value.strip():
            raise self.refuse("the structural tag must be a non-empty JSON object")
        self.structural_tag()

    def _load_json(self, text: Any, limit: int, what: str) -> Any:
        if not isinstance(text, str):
            raise self.refuse(f"the {what} must be JSON text or an object")
        try:
            doc = orjson.loads(text)  # fast: requests parse their constraint on the loop
        except orjson.JSONDecodeError:
            try:  # json's parser words the refusal (and takes NaN, integers past 64 bits)
                doc = json.loads(text)
            except RecursionError:
                raise self.refuse(f"the {what} is nested too deeply (at most {limit} levels "
                                  "of objects and arrays)") from None
            except ValueError as e:
                raise self.refuse(f"the {what} is not valid JSON: {e}") from None
        if _nesting_exceeds(doc, limit):
            raise self.refuse(f"the {what} is nested too deeply (at most {limit} levels of "
                              "objects and arrays)")
        return doc


def _dumps(value: Any) -> str:
    try:  # the same compact text as json's below, ten times faster (it runs on the loop)
        return orjson.dumps(value).decode()
    except (TypeError, ValueError):  # non-string keys, integers past 64 bits, ...
        pass
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as e:
        raise RequestRefused(f"the constraint is not JSON-serialisable: {e}",
                             "structured_outputs") from None


def _nesting_exceeds(doc: Any, limit: int) -> bool:
    # breadth-first, one level at a time: no recursion, stops as soon as the limit is passed
    level = [doc] if isinstance(doc, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [child for node in level
                 for child in (node.values() if isinstance(node, dict) else node)
                 if isinstance(child, (dict, list))]
    return False


# keywords whose values are data, not subschemas (as the guidance backend walks a schema)
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples", "x-guidance"})


def _subschemas_exceed(doc: Any, limit: int) -> bool:
    """Whether ``doc`` holds more than ``limit`` JSON objects outside data keywords."""
    count = 0
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            count += 1
            if count > limit:
                return True
            stack.extend(v for k, v in node.items()
                         if k not in _DATA_KEYWORDS and isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, (dict, list)))
    return False


def _check_metaschema(spec: StructuredSpec, schema: dict[str, Any]) -> None:
    import jsonschema
    from jsonschema.validators import validator_for

    # A schema naming no dialect is checked against draft 7's metaschema: it constrains the
    # keywords draft 2020-12 shares with it alike (type, required, properties, items, ...)
    # and tolerates the newer ones, while the 2020-12 metaschema's $dynamicRef makes its
    # check about five times slower (seconds for a 2000-branch anyOf). Root-level $defs
    # are checked as draft 7 checks its "definitions".
    cls = validator_for(schema, default=jsonschema.Draft7Validator)
    target = schema
    if "$schema" not in schema and isinstance(schema.get("$defs"), dict):
        target = {**schema, "definitions": {**schema["$defs"],
                                            **(schema.get("definitions") or {})}}
    try:
        cls.check_schema(target, format_checker=_format_checker(cls))
    except jsonschema.SchemaError as e:
        path = list(e.absolute_path)
        if path[:1] == ["definitions"] and "definitions" not in schema:
            path[0] = "$defs"
        where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
        raise spec.refuse(f"invalid JSON schema at {where if path else 'the root'}: "
                          f"{e.message}") from None


_FORMAT_CHECKERS: dict[type, Any] = {}


def _format_checker(cls: type) -> Any:
    # Patterns are checked by the grammar compiler, which speaks the Rust regex dialect that
    # constrained decoding uses (\p{L}, no look-around); Python's re would refuse some valid
    # patterns and pass some unusable ones, so the metaschema check leaves "regex" out.
    checker = _FORMAT_CHECKERS.get(cls)
    if checker is None:
        import jsonschema

        base = cls.FORMAT_CHECKER  # type: ignore[attr-defined]
        checker = jsonschema.FormatChecker([f for f in base.checkers if f != "regex"])
        _FORMAT_CHECKERS[cls] = checker
    return checker
