"""An upload's bytes to what the model reads: its windows and their log-mel features,
computed in worker threads, bounded in threads and in bytes.

Decoding and the STFT hold the GIL for stretches (PyAV's frame loop, numpy's smaller
steps), and a 600 s upload takes seconds of CPU: on the event loop, that would stall every
stream and /health. Here at most `workers` uploads decode at once (vLLM's default: 2);
uploads waiting for a worker hold their compressed bytes, so their total is bounded too
(`max_pending_bytes`): past it, a new upload is a 503 with Retry-After instead of more
memory. The decoded PCM of one upload is bounded by AudioLimits.max_decode_bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import trio

from server.audio.decode import AudioLimits, decode
from server.audio.mel import SAMPLE_RATE, log_mel
from server.audio.windows import Window, split
from server.errors import overloaded


@dataclass(frozen=True)
class PreparedAudio:
    duration_s: float
    windows: list[Window]
    features: list[np.ndarray]  # per window: (n_mels, 3000) float32


def prepare_sync(data: bytes, limits: AudioLimits, n_mels: int) -> PreparedAudio:
    """decode -> split -> log_mel, in the calling thread (AudioInputError on bad input)."""
    samples = decode(data, limits)
    windows = split(samples)
    return PreparedAudio(duration_s=samples.shape[0] / SAMPLE_RATE, windows=windows,
                         features=[log_mel(w.samples, n_mels) for w in windows])


def _default_workers() -> int:
    raw = os.environ.get("VLLM_MAX_AUDIO_PREPROCESS_WORKERS", "").strip()
    if raw:
        value = int(raw)
        if value < 1:
            raise ValueError(f"VLLM_MAX_AUDIO_PREPROCESS_WORKERS must be >= 1, got {raw!r}")
        return value
    return max(1, min(os.cpu_count() or 1, 2))


class AudioFrontend:
    """One per server: the limits, the worker threads and the pending-bytes budget."""

    def __init__(self, limits: AudioLimits | None = None, *, workers: int | None = None,
                 max_pending_bytes: int = 256 * 1024 * 1024) -> None:
        self.limits = limits or AudioLimits.from_env()
        self._threads = trio.CapacityLimiter(workers or _default_workers())
        self.max_pending_bytes = max_pending_bytes
        self.pending_bytes = 0

    async def prepare(self, data: bytes, n_mels: int) -> PreparedAudio:
        self.limits.check_upload(len(data))
        if self.pending_bytes + len(data) > self.max_pending_bytes:
            raise overloaded()
        self.pending_bytes += len(data)
        try:
            return await trio.to_thread.run_sync(prepare_sync, data, self.limits, n_mels,
                                                 limiter=self._threads)
        finally:
            self.pending_bytes -= len(data)

    async def features(self, samples: np.ndarray, n_mels: int) -> np.ndarray:
        """One window's log-mel (a realtime stream's), on the same worker threads."""
        return await trio.to_thread.run_sync(log_mel, samples, n_mels, limiter=self._threads)
