"""Reasoning between a start and an end tag: `deepseek_r1` and `qwen3` (`<think>`,
`</think>`) and `mistral` (`[THINK]`, `[/THINK]`).

One grammar serves the three; they differ in where the text starts and in whitespace:

- the text starts in reasoning for `deepseek_r1` and `qwen3` (their templates open the
  reasoning in the prompt, so most outputs never show `<think>`), in content for
  `mistral` (Magistral writes `[THINK]` itself);
- in reasoning a start tag is dropped (a leading `<think>` above all) and the end tag
  goes over to content; in content a stray end tag is dropped and a start tag opens
  reasoning again (the tags are the model's own special tokens, not prose);
- `mistral` drops the whitespace that ends each stretch of reasoning, before its end tag
  or at the end of the text; the others keep reasoning as written;
- `qwen3` reads no reasoning at all when the request sets `enable_thinking: false` (the
  whole text is content, tags included), and starts in content when the prompt's last
  turn (after the last `<|im_start|>`) already closed the reasoning with `</think>`.
"""

from __future__ import annotations

from typing import ClassVar

from actors.params.reasoning import reasoning_open_in

from server.frontend.chat.reasoning.base import (
    GateRule,
    MarkerStream,
    ReasoningParser,
    ReasoningStream,
    Split,
    none_if_empty,
)


class ThinkTagParser(ReasoningParser):
    start_tag: ClassVar[str]
    end_tag: ClassVar[str]
    starts_in_reasoning: ClassVar[bool] = True
    strip_reasoning_tail: ClassVar[bool] = False
    turn_boundary: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.markers = (cls.start_tag, cls.end_tag)
        cls.end_marker = cls.end_tag

    @property
    def enabled(self) -> bool:
        return True

    def initial_reasoning(self) -> bool:
        """Whether the output starts in reasoning: the parser's rule, unless the prompt's
        last turn already opened or closed the reasoning."""
        if self.turn_boundary is not None and self.prompt:
            opened = reasoning_open_in(self.prompt, self.start_tag, self.end_tag,
                                       self.turn_boundary)
            if opened is not None:
                return opened
        return self.starts_in_reasoning

    def gate_rule(self) -> GateRule | None:
        """The tags; the prompt's last turn decides where a Qwen3 output starts."""
        if not self.enabled:
            return None
        return GateRule(self.end_tag, self.start_tag, self.starts_in_reasoning,
                        self.turn_boundary)

    def split(self, text: str) -> Split:
        if not self.enabled:
            return None, none_if_empty(text)
        reasoning: list[str] = []
        content: list[str] = []
        in_reasoning = self.initial_reasoning()
        span: list[str] = []  # the reasoning stretch being read
        pos = 0
        while True:
            starts = [(text.find(tag, pos), tag) for tag in self.markers]
            found = [(i, tag) for i, tag in starts if i != -1]
            i, tag = min(found) if found else (len(text), "")
            piece = text[pos:i]
            if in_reasoning:
                span.append(piece)
                if tag != self.start_tag:  # the stretch ends: at the end tag or the text's end
                    reasoning.append(self._close("".join(span)))
                    span = []
            else:
                content.append(piece)
            if not tag:
                return none_if_empty("".join(reasoning)), none_if_empty("".join(content))
            in_reasoning = tag == self.start_tag
            pos = i + len(tag)

    def _close(self, span: str) -> str:
        return span.rstrip() if self.strip_reasoning_tail else span

    def stream(self) -> ReasoningStream:
        return _ThinkTagStream(self)


class _ThinkTagStream(MarkerStream):
    def __init__(self, parser: ThinkTagParser) -> None:
        super().__init__()
        self._parser = parser
        self._markers = parser.markers if parser.enabled else ()
        self.side = "reasoning" if parser.enabled and parser.initial_reasoning() else "content"
        self._pending = ""  # trailing whitespace of reasoning, held until text follows it

    def active_markers(self) -> tuple[str, ...]:
        return self._markers

    def on_marker(self, marker: str) -> None:
        if marker == self._parser.end_tag:
            self._pending = ""
            self.side = "content"
        else:
            self.side = "reasoning"

    def route(self, text: str) -> None:
        if self.side != "reasoning" or not self._parser.strip_reasoning_tail:
            self.emit(self.side, text)
            return
        text = self._pending + text
        body = text.rstrip()
        self._pending = text[len(body):]
        self.emit("reasoning", body)


class DeepSeekR1Parser(ThinkTagParser):
    name = "deepseek_r1"
    start_tag = "<think>"
    end_tag = "</think>"


class Qwen3Parser(ThinkTagParser):
    name = "qwen3"
    start_tag = "<think>"
    end_tag = "</think>"
    turn_boundary = "<|im_start|>"

    @property
    def enabled(self) -> bool:
        return bool(self.chat_template_kwargs.get("enable_thinking", True))


class MistralParser(ThinkTagParser):
    name = "mistral"
    start_tag = "[THINK]"
    end_tag = "[/THINK]"
    starts_in_reasoning = False
    strip_reasoning_tail = True
