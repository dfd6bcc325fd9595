"""Audio that arrives in pieces, cut into the windows an upload of the same audio gets.

`windows.split` cuts a whole upload: while more than 30 s remain after a window's start,
the window ends at the quietest 100 ms within the last `search_s` before its 30 s mark.
That choice reads only the window's own samples, so it can be made as soon as more than
30 s have arrived past the window's start. `StreamWindows` makes it then: `append` hands
back each window the moment it is decided, `finish` the rest (the last, shorter window).
Fed the same samples in any pieces, the windows equal `split`'s, and so does every
transcript made of them.

PCM16 chunks become float32 as the upload decoder reads 16-bit PCM (sample / 32768), so
the same audio sent as a WAV upload or as chunks gives the same features.
"""

from __future__ import annotations

import numpy as np

from server.audio.mel import SAMPLE_RATE, WINDOW_SAMPLES
from server.audio.windows import SEARCH_S, quietest_point


class PCMError(ValueError):
    """A chunk that is not 16-bit little-endian PCM."""


def pcm16_samples(raw: bytes) -> np.ndarray:
    """Little-endian PCM16 bytes as float32 samples in [-1, 1)."""
    if len(raw) % 2:
        raise PCMError(f"PCM16 audio holds 2 bytes per sample; got {len(raw)} bytes, an odd "
                       "count")
    if raw[:4] in (b"RIFF", b"RIFX", b"fLaC", b"OggS", b"ID3\x03", b"ID3\x04"):
        raise PCMError("the chunk is a file (WAV, FLAC, Ogg or MP3), not raw PCM16 samples: "
                       "send 16 kHz mono 16-bit PCM")
    return np.frombuffer(raw, dtype="<i2").astype(np.float32) / np.float32(32768.0)


class StreamWindows:
    """The current stretch of audio, cut into windows as `windows.split` cuts it."""

    def __init__(self, *, max_samples: int = WINDOW_SAMPLES, search_s: float = SEARCH_S
                 ) -> None:
        self.max_samples = max_samples
        self.search = min(int(search_s * SAMPLE_RATE), max_samples // 2)
        self._pieces: list[np.ndarray] = []
        self._held = 0  # samples in _pieces

    @property
    def held_samples(self) -> int:
        """Samples received and not yet handed back in a window."""
        return self._held

    def append(self, samples: np.ndarray) -> list[np.ndarray]:
        """Adds samples; returns the windows this decides (each max_samples or shorter)."""
        if samples.shape[0] == 0:
            return []
        self._pieces.append(samples)
        self._held += samples.shape[0]
        out = []
        if self._held > self.max_samples:
            audio = np.concatenate(self._pieces)
            start = 0
            while audio.shape[0] - start > self.max_samples:
                end = quietest_point(audio, start + self.max_samples - self.search,
                                     start + self.max_samples)
                out.append(audio[start:end].copy())
                start = end
            rest = audio[start:].copy()
            self._pieces = [rest]
            self._held = rest.shape[0]
        return out

    def finish(self) -> np.ndarray | None:
        """The last window (what is held), or None when nothing is; the stream starts over."""
        if not self._held:
            self.clear()
            return None
        audio = np.concatenate(self._pieces)
        self.clear()
        return audio

    def clear(self) -> None:
        self._pieces = []
        self._held = 0
