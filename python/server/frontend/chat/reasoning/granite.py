"""`granite`: IBM Granite 3.2's plain-text sections, "Here is my thought process:" then
"Here is my response:" (each also as "Here's …", which quantized models write).

The markers are prose, not special tokens, so only their first occurrences are
structure: the thought-process marker counts only at the very start of the text (else
the whole text is content), and the first response marker after it ends the reasoning;
whatever follows is content verbatim, a repeated marker included. Whitespace around the
markers is kept, as the model wrote it. Reasoning never closed by a response marker is
reasoning (the text was cut short).
"""

from __future__ import annotations

from server.frontend.chat.reasoning.base import (
    MarkerStream,
    ReasoningParser,
    ReasoningStream,
    Split,
    none_if_empty,
)

THINK_STARTS = ("Here is my thought process:", "Here's my thought process:")
RESPONSE_STARTS = ("Here is my response:", "Here's my response:")


class GraniteParser(ReasoningParser):
    name = "granite"
    markers = THINK_STARTS + RESPONSE_STARTS

    def split(self, text: str) -> Split:
        start = next((m for m in THINK_STARTS if text.startswith(m)), None)
        if start is None:
            return None, none_if_empty(text)
        rest = text[len(start):]
        found = [(i, m) for m in RESPONSE_STARTS if (i := rest.find(m)) != -1]
        if not found:
            return none_if_empty(rest), None
        i, marker = min(found)
        return none_if_empty(rest[:i]), none_if_empty(rest[i + len(marker):])

    def stream(self) -> ReasoningStream:
        return _GraniteStream()


class _GraniteStream(MarkerStream):
    def __init__(self) -> None:
        super().__init__()
        self.anchored = True  # waiting for the thought-process marker at the start
        self.side = "content"
        self._markers: tuple[str, ...] = THINK_STARTS

    def active_markers(self) -> tuple[str, ...]:
        return self._markers

    def on_marker(self, marker: str) -> None:
        if marker in THINK_STARTS:
            self.anchored = False
            self.side = "reasoning"
            self._markers = RESPONSE_STARTS
        else:
            self.side = "content"
            self._markers = ()

    def on_unanchored(self) -> None:
        self.anchored = False
        self._markers = ()
