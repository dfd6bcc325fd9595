"""The reasoning-parser interface and the marker machine every built-in stream runs on.

A `ReasoningParser` is built per request (it may read the request's chat-template kwargs
and the rendered prompt) and reads a choice's text two ways:

- `split(text)`: the finished text, read at once with plain string searches;
- `stream()`: a `ReasoningStream` fed the text delta by delta, each `feed` answering the
  (reasoning, content) text it makes certain and `finish` the rest.

The two readings are written separately on purpose, so that the tests can hold one to the
other: the streamed pieces, joined, equal `split` for every chunking of the text.

`MarkerStream` is the streamed reading. It keeps a small buffer of text not yet routed and
a mode (which side text goes to, which markers it obeys). Each scan finds the earliest
complete marker the mode obeys (the longest, at a tie); text before it goes to the mode's
side and the marker is handed to the parser's transition. Without a complete marker it
routes all but the longest suffix that is a proper prefix of a marker: that suffix is the
least it must hold back, since any shorter hold could let the start of a marker out. A
marker that began before a complete one also holds the complete one back, so the earliest
marker wins however the text was cut. `finish` reads the buffer as final: a marker prefix
that never completed is text of the mode it was held in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

Side = Literal["reasoning", "content", "drop", "hold"]
Split = tuple[str | None, str | None]  # (reasoning, content), None where empty
Pair = tuple[str, str]  # (reasoning delta, content delta), "" where none


class ReasoningStream(ABC):
    """One choice's streamed reading. `feed(text, token_ids)` takes the next delta (its
    token ids, when given, are counted into `reasoning_tokens`) and answers the reasoning
    and content text it makes certain; `finish()` answers the rest."""

    reasoning_tokens: int = 0

    @abstractmethod
    def feed(self, text: str, token_ids: Sequence[int] = ()) -> Pair: ...

    @abstractmethod
    def finish(self) -> Pair: ...

    @property
    @abstractmethod
    def in_reasoning(self) -> bool:
        """Whether text arriving now would be reasoning."""


@dataclass(frozen=True)
class GateRule:
    """How the engine can follow a request's reasoning (actors.params.reasoning): the
    marker that ends it, the one that opens it in the output (None: none), where the
    output starts, and the turn boundary after which the rendered prompt's markers decide
    that instead (None: the prompt is not read)."""

    end: str
    start: str | None
    in_reasoning: bool
    turn_boundary: str | None = None


class ReasoningParser(ABC):
    """A reasoning format. `name` is the `--reasoning-parser` value; `markers` every
    string of the format that must never reach reasoning or content; `end_marker` the
    text that ends reasoning, which the engine watches (a constraint binds what follows
    it) and forces past a `thinking_token_budget`, None when the format has none it can
    follow (a constraint then binds from the first token, and a budget is refused)."""

    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]]
    # The tool-call parsers that read their calls in this format's own framing: with one of
    # them on a request, the parser leaves the calls' framing in the content
    # (`tool_frames`) for it to read.
    tool_frames_for: ClassVar[tuple[str, ...]] = ()
    tool_frames: bool = False
    end_marker: ClassVar[str | None] = None

    def __init__(self, chat_template_kwargs: Mapping[str, object] | None = None,
                 prompt: str | None = None) -> None:
        self.chat_template_kwargs: Mapping[str, object] = chat_template_kwargs or {}
        self.prompt = prompt

    @abstractmethod
    def split(self, text: str) -> Split:
        """The finished text as (reasoning, content), None for an empty side."""

    @abstractmethod
    def stream(self) -> ReasoningStream:
        """A fresh streamed reading of one choice."""

    def gate_rule(self) -> GateRule | None:
        """How the engine follows this request's reasoning; None where it reads none."""
        return None


def none_if_empty(text: str) -> str | None:
    return text or None


class MarkerStream(ReasoningStream):
    """The marker machine. A subclass sets `side` and `anchored` as its modes change and
    gives `active_markers`, `on_marker` and, for anchored modes, `on_unanchored`.

    `side` says where text goes: reasoning, content, nowhere ("drop") or into `held`, text
    the parser reads itself ("hold": Harmony's message headers). An `anchored` mode obeys
    only a marker at the very start of the text it sees; any other text makes the machine
    call `on_unanchored`, which must leave the mode for one that is not anchored."""

    side: Side = "content"
    anchored: bool = False

    def __init__(self) -> None:
        self._buf = ""
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._markers_seen = 0
        self.held = ""
        self.reasoning_tokens = 0

    # The parser's part.

    @abstractmethod
    def active_markers(self) -> tuple[str, ...]: ...

    @abstractmethod
    def on_marker(self, marker: str) -> None: ...

    def on_unanchored(self) -> None:
        raise NotImplementedError

    def route(self, text: str) -> None:
        """Send text to the current side; parsers that rewrite text override this."""
        self.emit(self.side, text)

    def on_finish(self) -> None:
        """Called once after the last text is routed."""

    # The machine.

    @property
    def in_reasoning(self) -> bool:
        return self.side == "reasoning"

    def emit(self, side: Side, text: str) -> None:
        if not text:
            return
        if side == "reasoning":
            self._reasoning.append(text)
        elif side == "content":
            self._content.append(text)
        elif side == "hold":
            self.held += text

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> Pair:
        was_reasoning, seen = self.in_reasoning, self._markers_seen
        self._buf += text
        self._scan(final=False)
        if was_reasoning and self.in_reasoning and self._markers_seen == seen:
            self.reasoning_tokens += len(token_ids)
        return self._take()

    def finish(self) -> Pair:
        self._scan(final=True)
        self.on_finish()
        return self._take()

    def _take(self) -> Pair:
        out = ("".join(self._reasoning), "".join(self._content))
        self._reasoning.clear()
        self._content.clear()
        return out

    def _consume(self, start: int, marker: str) -> None:
        self.route(self._buf[:start])
        self._buf = self._buf[start + len(marker):]
        self._markers_seen += 1
        self.on_marker(marker)

    def _scan(self, final: bool) -> None:
        while self._buf:
            markers = self.active_markers()
            buf = self._buf
            if self.anchored:
                hit = max((m for m in markers if buf.startswith(m)), key=len, default=None)
                if hit is not None:
                    self._consume(0, hit)
                    continue
                if not final and any(len(m) > len(buf) and m.startswith(buf) for m in markers):
                    return
                self.on_unanchored()
                continue
            start, hit = _earliest(buf, markers)
            hold = None if final else _hold_from(buf, markers)
            if hit is not None and (hold is None or start < hold):
                self._consume(start, hit)
                continue
            cut = len(buf) if hold is None else hold
            self.route(buf[:cut])
            self._buf = buf[cut:]
            return


def _earliest(buf: str, markers: tuple[str, ...]) -> tuple[int, str | None]:
    best, hit = len(buf), None
    for m in markers:
        i = buf.find(m)
        if i != -1 and (i < best or (i == best and hit is not None and len(m) > len(hit))):
            best, hit = i, m
    return best, hit


def _hold_from(buf: str, markers: tuple[str, ...]) -> int | None:
    """Where the longest suffix of `buf` that is a proper prefix of a marker starts."""
    longest = max((len(m) for m in markers), default=0)
    for i in range(max(0, len(buf) - longest + 1), len(buf)):
        tail = buf[i:]
        if any(len(m) > len(tail) and m.startswith(tail) for m in markers):
            return i
    return None
