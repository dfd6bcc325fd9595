"""Audio longer than Whisper's 30 s window, split into windows at quiet points, and the
windows' texts joined again.

A cut in the middle of a word garbles it on both sides, so each window ends at the
quietest moment of its last seconds: the 100 ms stretch of lowest energy within the last
`search_s` before the 30 s mark (ties: the latest), cut at its middle. Windows do not
overlap, so no word is transcribed twice; each keeps its start, from which its segments'
timestamps are offset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from server.audio.mel import SAMPLE_RATE, WINDOW_SAMPLES

QUIET_FRAME = SAMPLE_RATE // 10  # 100 ms: the stretch whose energy is compared
SEARCH_S = 2.0
# Languages written without spaces between words: their windows' texts join directly
# (vLLM joins these two so; Whisper's other languages are written with spaces).
NO_SPACE_LANGUAGES = frozenset({"ja", "zh", "yue", "th", "lo", "km", "my"})


@dataclass(frozen=True)
class Window:
    start: int  # first sample, in the whole audio
    samples: np.ndarray  # a view of the whole audio, at most WINDOW_SAMPLES long

    @property
    def start_s(self) -> float:
        return self.start / SAMPLE_RATE

    @property
    def duration_s(self) -> float:
        return self.samples.shape[0] / SAMPLE_RATE


def quietest_point(audio: np.ndarray, lo: int, hi: int) -> int:
    """The middle of the lowest-energy QUIET_FRAME within audio[lo:hi] (the latest of
    equals), or hi when the span is shorter than a frame."""
    span = audio[lo:hi].astype(np.float64)
    if span.shape[0] < QUIET_FRAME:
        return hi
    energy = np.concatenate([[0.0], np.cumsum(span * span)])
    per_frame = energy[QUIET_FRAME:] - energy[:-QUIET_FRAME]  # sum of squares per offset
    best = per_frame.shape[0] - 1 - int(np.argmin(per_frame[::-1]))
    return lo + best + QUIET_FRAME // 2


def split(audio: np.ndarray, *, max_samples: int = WINDOW_SAMPLES,
          search_s: float = SEARCH_S) -> list[Window]:
    """Consecutive windows covering `audio` (16 kHz mono), each at most max_samples."""
    search = min(int(search_s * SAMPLE_RATE), max_samples // 2)
    windows = []
    start = 0
    total = audio.shape[0]
    while total - start > max_samples:
        end = quietest_point(audio, start + max_samples - search, start + max_samples)
        windows.append(Window(start, audio[start:end]))
        start = end
    windows.append(Window(start, audio[start:]))
    return windows


def join_texts(texts: Sequence[str], language: str | None) -> str:
    """The windows' texts as one: stripped, empty ones dropped, joined by a space, or by
    nothing for a language written without spaces."""
    sep = "" if language and language.lower() in NO_SPACE_LANGUAGES else " "
    return sep.join(t.strip() for t in texts if t.strip())
