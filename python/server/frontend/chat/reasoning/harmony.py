"""`openai_gptoss` (also `gpt_oss`): gpt-oss's Harmony messages, read from their text.

An assistant turn is a run of messages, each a header then `<|message|>` then a body
closed by `<|end|>`, `<|return|>` or `<|call|>`:

    <|channel|>analysis<|message|>thinking…<|end|>
    <|start|>assistant<|channel|>final<|message|>the answer<|return|>

The header (role, `<|channel|>NAME`, `to=RECIPIENT`, `<|constrain|>json`) is never
reasoning or content. The body goes by channel and recipient, as vLLM sorts Harmony
messages: to a function (any recipient but `assistant` and the built-in `python`,
`browser.*`, `container.*`) is a tool call, neither side here; `analysis` is reasoning;
`final`, and `commentary` with no recipient (a preamble), are content; any other message
is dropped. The messages of one side join with "\\n", streamed too.

A `<|start|>` or `<|channel|>` inside a body starts the next header (a body whose close
was lost), and a stray `<|message|>` or `<|constrain|>` there is dropped. A header cut off
by the end of the text is dropped, unless it holds no Harmony token at all: text with no
Harmony framing is content, so plain output is not lost (it streams only at the end).

With the `openai` tool-call parser on the same request (`tool_frames`), the calls must reach
it: then every message but the analysis goes to the content as it was generated, header,
`<|message|>`, body and close marker, and the tool-call parser (which reads the same
framing) takes the calls, the final text and the preambles from it. Only the analysis is
taken out, as the reasoning.
"""

from __future__ import annotations

import re

from server.frontend.chat.reasoning.base import (
    MarkerStream,
    ReasoningParser,
    ReasoningStream,
    Side,
    Split,
    none_if_empty,
)

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
CLOSES = ("<|end|>", "<|return|>", "<|call|>")
REOPENS = (START, CHANNEL)  # inside a body: the next header begins with the marker
STRAYS = (MESSAGE, CONSTRAIN)  # inside a body: dropped
BODY_MARKERS = CLOSES + REOPENS + STRAYS
BUILTIN_RECIPIENTS = ("python", "browser", "container")

_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]+)")
_RECIPIENT = re.compile(r"to=([^\s<]+)")


def message_side(header: str) -> Side:
    """Where the body of the message with this header goes."""
    channel = m.group(1) if (m := _CHANNEL.search(header)) else None
    recipient = m.group(1) if (m := _RECIPIENT.search(header)) else None
    if recipient is not None and _is_function(recipient):
        return "drop"
    if channel == "analysis":
        return "reasoning"
    if channel == "final" or (channel == "commentary" and recipient is None):
        return "content"
    return "drop"


def _is_function(recipient: str) -> bool:
    if recipient == "assistant" or recipient.startswith("<|"):
        return False
    if recipient.startswith("functions."):
        return len(recipient) > len("functions.")
    return recipient.split(".", 1)[0] not in BUILTIN_RECIPIENTS


def _unframed(header: str) -> bool:
    """A header the text ended in that is really plain text: no Harmony token in it."""
    return "<|" not in header and bool(header.strip())


class HarmonyParser(ReasoningParser):
    name = "openai_gptoss"
    markers = (START, CHANNEL, MESSAGE, CONSTRAIN) + CLOSES
    tool_frames_for = ("openai", "gpt_oss")

    def split(self, text: str) -> Split:
        sides: dict[str, list[str]] = {"reasoning": [], "content": [], "drop": []}
        framed: list[str] = []  # with tool_frames: the content, framing and all
        pos = 0
        while pos < len(text):
            at = text.find(MESSAGE, pos)
            if at == -1:
                if _unframed(text[pos:]):
                    sides["content"].append(text[pos:])
                    framed.append(text[pos:])
                break
            side = message_side(text[pos:at])
            body, end = _read_body(text, at + len(MESSAGE))
            if side != "reasoning":
                framed.append(text[pos:end])
            if body:
                sides[side].append(body)
            pos = end
        content = "".join(framed) if self.tool_frames else "\n".join(sides["content"])
        return none_if_empty("\n".join(sides["reasoning"])), none_if_empty(content)

    def stream(self) -> ReasoningStream:
        return _HarmonyStream(self.tool_frames)


def _read_body(text: str, pos: int) -> tuple[str, int]:
    """The body that starts at `pos` (stray markers left out) and where the next header
    starts."""
    parts: list[str] = []
    while True:
        found = [(i, m) for m in BODY_MARKERS if (i := text.find(m, pos)) != -1]
        if not found:
            parts.append(text[pos:])
            return "".join(parts), len(text)
        i, marker = min(found)
        parts.append(text[pos:i])
        if marker in STRAYS:
            pos = i + len(marker)
            continue
        return "".join(parts), (i + len(marker) if marker in CLOSES else i)


class _HarmonyStream(MarkerStream):
    def __init__(self, tool_frames: bool = False) -> None:
        super().__init__()
        self.side = "hold"  # reading a header
        self._started = {"reasoning": False, "content": False}  # a side has had text
        self._body_empty = True
        self._tool_frames = tool_frames
        self._framed = False  # the body being read goes to the content with its framing

    def active_markers(self) -> tuple[str, ...]:
        return (MESSAGE,) if self.side == "hold" else BODY_MARKERS

    def on_marker(self, marker: str) -> None:
        if self.side == "hold":  # the header is complete
            self.side = message_side(self.held)
            self._framed = self._tool_frames and self.side != "reasoning"
            if self._framed:
                self.side = "content"
                self.emit("content", self.held + marker)
            self.held = ""
            self._body_empty = True
        elif marker in CLOSES:
            if self._framed:
                self.emit("content", marker)
            self.side = "hold"
        elif marker in REOPENS:
            self.side = "hold"
            self.held = marker
        elif self._framed:  # a stray marker, which the tool-call parser reads as Harmony does
            self.emit("content", marker)

    def route(self, text: str) -> None:
        if not text:
            return
        if self._framed:
            self.emit(self.side, text)
            return
        if self.side in self._started:
            if self._body_empty and self._started[self.side]:
                text = "\n" + text
            self._started[self.side] = True
            self._body_empty = False
        self.emit(self.side, text)

    def on_finish(self) -> None:
        if self.side == "hold" and _unframed(self.held):
            self.side, self._body_empty = "content", True  # a message of its own
            self._framed = self._tool_frames
            self.route(self.held)
        self.held = ""
