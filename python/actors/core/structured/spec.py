"""The request-side spec, re-exported for the engine's structured-output modules.

``StructuredSpec`` lives in ``actors.params.structured`` so that ``SamplingParams`` can carry
it without importing the engine core; this name keeps the core's imports where they were.
"""

from actors.params.structured import KINDS, MAX_JSON_NESTING, Kind, StructuredSpec

__all__ = ["KINDS", "MAX_JSON_NESTING", "Kind", "StructuredSpec"]
