"""Structured outputs (JSON schema, regex, choice, grammar, structural tag): constrained
decoding's engine-side half.

``StructuredSpec`` is the request's constraint, ``make_backend`` builds a ``GrammarBackend``
for the model's tokenizer, and ``GrammarCache`` compiles specs off the event loop, bounded in
time, into per-sequence ``Matcher``s that fill the compiled sampler's allowed-token bitmask
(``llmcore.sampling``: ``allowed_bitmask``) and follow the sampled tokens.
"""

from actors.core.structured.backend import (
    BACKEND_NAMES,
    CompiledGrammar,
    GrammarBackend,
    Matcher,
    bitmask_words,
    make_backend,
)
from actors.core.structured.cache import DEFAULT_COMPILE_TIMEOUT_S, GrammarCache
from actors.core.structured.spec import KINDS, MAX_JSON_NESTING, StructuredSpec

__all__ = [
    "BACKEND_NAMES",
    "DEFAULT_COMPILE_TIMEOUT_S",
    "KINDS",
    "MAX_JSON_NESTING",
    "CompiledGrammar",
    "GrammarBackend",
    "GrammarCache",
    "Matcher",
    "StructuredSpec",
    "bitmask_words",
    "make_backend",
]
