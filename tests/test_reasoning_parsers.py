"""Reasoning parsers (server/frontend/chat/reasoning): outputs in each model's documented
format read whole, then streamed under every chunking (every split point, every pair of
split points for short texts, random cuts of random marker-laden texts), which must join
to the whole reading with no marker on either side. Pure Python and fast."""

from __future__ import annotations

import random
import sys
import textwrap
from itertools import combinations, pairwise

import pytest
from server.frontend.chat import reasoning
from server.frontend.chat.reasoning import (
    REASONING_PARSERS,
    ReasoningParser,
    UnknownReasoningParserError,
)

THINK = "<think>", "</think>"
H_ANALYSIS = "<|channel|>analysis<|message|>"
H_FINAL = "<|start|>assistant<|channel|>final<|message|>"

# (parser, text, expected reasoning, expected content), chat-template kwargs apart.
CASES = [
    # DeepSeek-R1: the template opens <think> in the prompt; older builds echo it.
    ("deepseek_r1", "Okay, 2+2 is 4.\n</think>\n\nThe answer is 4.", "Okay, 2+2 is 4.\n", "\n\nThe answer is 4."),
    ("deepseek_r1", "<think>\nHmm.\n</think>\n\n4", "\nHmm.\n", "\n\n4"),
    ("deepseek_r1", "Still thinking when cut", "Still thinking when cut", None),
    ("deepseek_r1", "</think>Only content", None, "Only content"),
    ("deepseek_r1", "<think></think>", None, None),
    ("deepseek_r1", "", None, None),
    ("deepseek_r1", "All reasoning</think>", "All reasoning", None),
    ("deepseek_r1", "a</think>b</think>c", "a", "bc"),
    ("deepseek_r1", "a</think>b<think>c</think>d", "ac", "bd"),
    ("deepseek_r1", "x < y and </thin are text</think>ok", "x < y and </thin are text", "ok"),
    ("deepseek_r1", "cut in a marker </thi", "cut in a marker </thi", None),
    # Qwen3 (thinking mode), whitespace kept as written.
    ("qwen3", "<think>\nThe user greets me.\n</think>\n\nHello!", "\nThe user greets me.\n", "\n\nHello!"),
    ("qwen3", "Let me think.</think>Hi", "Let me think.", "Hi"),
    ("qwen3", "no end tag at all", "no end tag at all", None),
    ("qwen3", "</think>\n\n{\"a\": 1}", None, "\n\n{\"a\": 1}"),
    # Magistral: [THINK] written by the model; reasoning's trailing whitespace dropped.
    ("mistral", "[THINK]Let me see. 6*7=42.\n\n[/THINK]The answer is 42.", "Let me see. 6*7=42.", "The answer is 42."),
    ("mistral", "Plain answer, no thinking.", None, "Plain answer, no thinking."),
    ("mistral", "[THINK]cut short  \n", "cut short", None),
    ("mistral", "Before [THINK] a \n[/THINK] mid [THINK]b [/THINK]end", " ab", "Before  mid end"),
    ("mistral", "[/THINK]stray end", None, "stray end"),
    ("mistral", "[THINK]x[THINK]y[/THINK]", "xy", None),
    ("mistral", "[THINK] [/THINK]", None, None),
    # Granite 3.2.
    ("granite", "Here is my thought process:\nThe user wants X.\nHere is my response:\nX it is.",
     "\nThe user wants X.\n", "\nX it is."),
    ("granite", "Here's my thought process: short. Here's my response: done", " short. ", " done"),
    ("granite", "Here is my thought process: never answered", " never answered", None),
    ("granite", "Just an answer: no sections.", None, "Just an answer: no sections."),
    ("granite", "Intro. Here is my thought process: x Here is my response: y", None,
     "Intro. Here is my thought process: x Here is my response: y"),
    ("granite", "Here is my", None, "Here is my"),
    ("granite", "Here is my thought process:a Here is my response:b Here is my response:c",
     "a ", "b Here is my response:c"),
    # gpt-oss Harmony.
    ("gpt_oss", H_ANALYSIS + "User asks 2+2.<|end|>" + H_FINAL + "4<|return|>", "User asks 2+2.", "4"),
    ("gpt_oss", H_ANALYSIS + "Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather"
     " <|constrain|>json<|message|>{\"city\":\"SF\"}<|call|>", "Need weather.", None),
    ("gpt_oss", H_ANALYSIS + "a<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
     + H_ANALYSIS.replace("<|channel|>", "<|start|>assistant<|channel|>") + "b<|end|>" + H_FINAL + "done",
     "a\nb", "Checking.\ndone"),
    ("gpt_oss", H_ANALYSIS + "cut in the thinking", "cut in the thinking", None),
    ("gpt_oss", H_ANALYSIS + "x<|end|><|start|>assistant<|chan", "x", None),
    ("gpt_oss", "<|channel|>final<|message|>answer only<|return|>", None, "answer only"),
    ("gpt_oss", "plain text, no harmony", None, "plain text, no harmony"),
    ("gpt_oss", "<|channel|>analysis to=python<|message|>code<|call|>", "code", None),
    ("gpt_oss", "<|channel|>analysis<|message|>a<|channel|>final<|message|>b", "a", "b"),
    ("gpt_oss", "<|channel|>analysis<|message|><|end|>" + H_FINAL + "<|return|>", None, None),
]

# Texts whose outputs keep a marker on purpose: Granite's markers are prose after their
# first use, and Qwen3 with thinking off reads no tags at all.
MARKERS_KEPT = {
    "Intro. Here is my thought process: x Here is my response: y",
    "Here is my thought process:a Here is my response:b Here is my response:c",
}


def streamed(parser: ReasoningParser, chunks: list[str]) -> tuple[str | None, str | None]:
    stream = parser.stream()
    reasoning = content = ""
    for chunk in chunks:
        r, c = stream.feed(chunk)
        reasoning, content = reasoning + r, content + c
    r, c = stream.finish()
    return (reasoning + r) or None, (content + c) or None


def cuts(text: str, points: tuple[int, ...]) -> list[str]:
    bounds = (0, *points, len(text))
    return [text[a:b] for a, b in pairwise(bounds)]


def assert_no_marker(parser: ReasoningParser, text: str, out: tuple[str | None, str | None]) -> None:
    if text in MARKERS_KEPT:
        return
    for side in out:
        for marker in parser.markers:
            assert marker not in (side or ""), (text, out, marker)


@pytest.mark.parametrize(("name", "text", "want_reasoning", "want_content"), CASES)
def test_recorded_formats_whole_and_at_every_split(name, text, want_reasoning, want_content) -> None:
    parser = reasoning.get(name)()
    assert parser.split(text) == (want_reasoning, want_content)
    assert_no_marker(parser, text, (want_reasoning, want_content))
    for i in range(len(text) + 1):
        assert streamed(parser, cuts(text, (i,))) == (want_reasoning, want_content), (text, i)
    assert streamed(parser, list(text)) == (want_reasoning, want_content)
    if len(text) <= 80:
        for pair in combinations(range(1, len(text)), 2):
            assert streamed(parser, cuts(text, pair)) == (want_reasoning, want_content), (text, pair)


ALPHABETS = {
    "deepseek_r1": ["<think>", "</think>", "<", "</", "</th", "think>", ">", "a", " ", "\n"],
    "qwen3": ["<think>", "</think>", "<thi", "/", "b", " ", "\n"],
    "mistral": ["[THINK]", "[/THINK]", "[", "[/", "THINK", "]", "c", " ", "\n"],
    "granite": ["Here is my thought process:", "Here's my response:", "Here is my response:",
                "Here", " is my ", "x", " ", ":"],
    "gpt_oss": ["<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|return|>", "<|call|>",
                "<|constrain|>", "analysis", "final", "commentary", " to=functions.f", " to=python",
                "assistant", "<|", "|>", "d", " "],
}


@pytest.mark.parametrize("name", sorted(ALPHABETS))
def test_random_texts_stream_as_they_split(name: str) -> None:
    """The two readings are written apart: random marker-laden texts, cut at random,
    must read the same both ways."""
    rng = random.Random(name)
    parser = reasoning.get(name)()
    for _ in range(400):
        text = "".join(rng.choice(ALPHABETS[name]) for _ in range(rng.randint(0, 14)))
        want = parser.split(text)
        for _ in range(6):
            points = tuple(sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 5))))) \
                if len(text) > 1 else ()
            assert streamed(parser, cuts(text, points)) == want, (text, points)


def test_qwen3_enable_thinking_false_reads_no_reasoning() -> None:
    text = "<think>\n\n</think>\n\nHello"
    off = reasoning.get("qwen3")({"enable_thinking": False})
    assert off.split(text) == (None, text)
    assert streamed(off, list(text)) == (None, text)
    assert not off.stream().in_reasoning
    on = reasoning.get("qwen3")({"enable_thinking": True})
    assert on.split(text) == ("\n\n", "\n\nHello")


def test_qwen3_prompt_that_closed_reasoning_starts_in_content() -> None:
    closed = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    opened = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    earlier = "<|im_start|>assistant\n<think>x</think>y<|im_end|>\n<|im_start|>assistant\n"
    text = "Hello</think>there"
    assert reasoning.get("qwen3")(prompt=closed).split(text) == (None, "Hellothere")
    assert reasoning.get("qwen3")(prompt=opened).split(text) == ("Hello", "there")
    assert reasoning.get("qwen3")(prompt=earlier).split(text) == ("Hello", "there")
    parser = reasoning.get("qwen3")(prompt=closed)
    assert streamed(parser, list(text)) == (None, "Hellothere")
    # DeepSeek-R1 has no turn boundary to read the prompt by: it always starts in reasoning.
    assert reasoning.get("deepseek_r1")(prompt=closed).split(text) == ("Hello", "there")


def test_reasoning_tokens_count_the_tokens_read_in_reasoning_not_the_markers() -> None:
    tokens = [("<think>", 1), ("a", 2), (" b", 3), ("</think>", 4), ("c", 5), (" d", 6)]
    stream = reasoning.get("qwen3")().stream()
    seen = []
    for text, tid in tokens:
        stream.feed(text, [tid])
        seen.append(stream.in_reasoning)
    stream.finish()
    assert stream.reasoning_tokens == 2
    assert seen == [True, True, True, False, False, False]
    harmony = reasoning.get("gpt_oss")().stream()
    for piece in ["<|channel|>", "analysis", "<|message|>", "x", "y", "<|end|>", "<|start|>",
                  "assistant", "<|channel|>", "final", "<|message|>", "z"]:
        harmony.feed(piece, [0])
    assert harmony.reasoning_tokens == 2


def test_streams_answer_only_what_is_certain() -> None:
    stream = reasoning.get("deepseek_r1")().stream()
    assert stream.feed("abc</th") == ("abc", "")
    assert stream.feed("ink>") == ("", "")
    assert stream.feed("x<") == ("", "x")
    assert stream.finish() == ("", "<")
    mistral = reasoning.get("mistral")().stream()
    assert mistral.feed("[THINK]a  ") == ("a", "")
    assert mistral.feed(" b") == ("   b", "")
    granite = reasoning.get("granite")().stream()
    assert granite.feed("Here is my thought") == ("", "")
    assert granite.feed(" process: r Here") == (" r ", "")
    assert granite.feed(" I go") == ("Here I go", "")


def test_registry_names_and_errors() -> None:
    names = reasoning.names()
    assert {"deepseek_r1", "qwen3", "granite", "mistral", "openai_gptoss", "gpt_oss"} <= set(names)
    assert reasoning.get("gpt_oss") is reasoning.get("openai_gptoss")
    with pytest.raises(UnknownReasoningParserError, match="invalid reasoning parser: nope"):
        reasoning.get("nope")
    with pytest.raises(TypeError):
        reasoning.register("bad", dict)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="already registered"):
        reasoning.register("qwen3", reasoning.DeepSeekR1Parser)
    reasoning.register("qwen3", reasoning.Qwen3Parser)  # the same class again is fine


def test_plugin_entry_point_adds_a_parser(tmp_path, monkeypatch) -> None:
    """A real distribution on sys.path whose entry point names a parser module."""
    (tmp_path / "my_reasoner.py").write_text(textwrap.dedent("""
        from server.frontend.chat.reasoning import ThinkTagParser

        class SeedParser(ThinkTagParser):
            name = "seed_think"
            start_tag = "<seed:think>"
            end_tag = "</seed:think>"
    """))
    info = tmp_path / "my_reasoner-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-reasoner\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[llmserve.reasoning_parsers]\nseed_think = my_reasoner:SeedParser\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(reasoning, "REASONING_PARSERS", dict(REASONING_PARSERS))
    monkeypatch.delitem(sys.modules, "my_reasoner", raising=False)
    parser = reasoning.get("seed_think")()
    assert parser.split("a</seed:think>b") == ("a", "b")
    assert streamed(parser, list("<seed:think>a</seed:think>b")) == ("a", "b")
    assert "seed_think" in reasoning.names()
