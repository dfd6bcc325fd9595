"""Timed segments of a transcript, and the response bodies made of them: OpenAI's
verbose_json segments, SubRip (srt) and WebVTT (vtt).

A window's tokens become segments at Whisper's timestamp tokens: `<|t0|> text <|t1|>` is
a segment from t0 to t1 (seconds past the window's start, in steps of 0.02 s). Text
without timestamps (a request decoded with `<|notimestamps|>`, or a model that emitted
none) is one segment over the whole window. Times are offset by the window's start in
the whole audio.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

TIMESTAMP_STEP_S = 0.02


@dataclass
class Segment:
    start: float
    end: float
    text: str
    tokens: list[int] = field(default_factory=list)
    seek: int = 0  # the window's start, in 10 ms mel frames (OpenAI's unit)
    avg_logprob: float = 0.0
    temperature: float = 0.0
    no_speech_prob: float = 0.0

    def verbose(self, index: int) -> dict[str, Any]:
        raw = self.text.encode("utf-8")
        return {
            "id": index,
            "seek": self.seek,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "text": self.text,
            "tokens": self.tokens,
            "temperature": self.temperature,
            "avg_logprob": self.avg_logprob,
            # Whisper's hallucination signal: repetitive text compresses well (> 2.4).
            "compression_ratio": len(raw) / len(zlib.compress(raw)) if raw else 0.0,
            "no_speech_prob": self.no_speech_prob,
        }


def window_segments(
    token_ids: Sequence[int],
    *,
    timestamp_begin: int,
    decode: Callable[[list[int]], str],
    offset_s: float,
    duration_s: float,
    logprobs: Sequence[float] | None = None,
    temperature: float = 0.0,
) -> list[Segment]:
    """The segments of one window's generated tokens (special tokens other than timestamps,
    such as end-of-text, already removed). `decode` turns text token ids into text;
    `logprobs`, one per token when given, average into each segment's avg_logprob."""
    seek = round(offset_s * 100)
    segments: list[Segment] = []
    start: float | None = None
    run: list[int] = []
    run_lps: list[float] = []

    def close(end: float) -> None:
        text = decode(run)
        if text.strip():
            begin = 0.0 if start is None else start
            segments.append(Segment(
                start=offset_s + begin, end=offset_s + max(end, begin), text=text,
                tokens=list(run), seek=seek, temperature=temperature,
                avg_logprob=sum(run_lps) / len(run_lps) if run_lps else 0.0))
        run.clear()
        run_lps.clear()

    for i, tok in enumerate(token_ids):
        if tok >= timestamp_begin:
            # A stamp ends the text before it and starts the next: `<|a|> x <|b|> y` and
            # `<|a|> x <|b|><|b|> y` both give (a, b, x) then y from b.
            t = min((tok - timestamp_begin) * TIMESTAMP_STEP_S, duration_s)
            if run:
                close(t)
            start = t
        else:
            run.append(tok)
            if logprobs is not None:
                run_lps.append(logprobs[i])
    if run:
        close(duration_s)
    return segments


def _clock(seconds: float, decimal: str) -> str:
    ms = max(0, round(seconds * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{decimal}{ms:03d}"


def _cue_text(text: str) -> str:
    # A blank line ends a cue and an arrow reads as a timing line: neither may appear.
    return " ".join(text.split()).replace("-->", "->")


def to_srt(segments: Sequence[Segment]) -> str:
    """SubRip: numbered cues from 1, `HH:MM:SS,mmm --> HH:MM:SS,mmm`, a blank line after
    each."""
    cues = [s for s in segments if s.text.strip()]
    return "".join(
        f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{_cue_text(s.text)}\n\n"
        for i, s in enumerate(cues, 1))


def to_vtt(segments: Sequence[Segment]) -> str:
    """WebVTT: the `WEBVTT` header, then cues `HH:MM:SS.mmm --> HH:MM:SS.mmm` with their
    text escaped (& and < are markup in a cue)."""
    out = ["WEBVTT\n\n"]
    for s in segments:
        if not s.text.strip():
            continue
        text = _cue_text(s.text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        out.append(f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{text}\n\n")
    return "".join(out)


def usage_seconds(duration_s: float) -> int:
    """OpenAI bills transcription by whole seconds, rounded up (vLLM reports the same)."""
    return int(math.ceil(duration_s))
