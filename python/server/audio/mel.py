"""Whisper's log-mel front end: 16 kHz mono float32 samples in, one (n_mels, 3000) float32
array per 30 s window out, the encoder's input.

The steps are Whisper's: a periodic Hann window of 400 samples, hop 160, reflect padding
of 200 at both ends (a centred STFT), the power spectrum without the last frame, Slaney
mel filters (80 bins for tiny..large-v2, 128 for large-v3), log10 clamped at 1e-10, then
at 8 below the window's peak, then (x + 4) / 4.

Framing follows faster-whisper (the oracle the engine's tokens are compared against), not
openai-whisper: the window's samples get 160 zeros appended, its mel frames are computed
from those alone, and the frames past its end are zeros in the normalised scale. OpenAI's
reference instead appends 30 s of silence before the STFT, so its padded frames hold the
clamp floor and its peak clamp sees the padding; the two differ only after the audio ends.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

SAMPLE_RATE = 16_000
N_FFT = 400
HOP = 160
WINDOW_SECONDS = 30
WINDOW_SAMPLES = WINDOW_SECONDS * SAMPLE_RATE  # 480000
N_FRAMES = WINDOW_SAMPLES // HOP  # 3000: the encoder's input length
SECONDS_PER_FRAME = HOP / SAMPLE_RATE  # 0.01

# The Slaney mel scale: linear up to 1 kHz (200/3 Hz per mel), logarithmic above
# (27 mels per factor of 6.4).
_F_SP = 200.0 / 3.0
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP  # 15
_LOG_STEP = math.log(6.4) / 27.0


def _hz_to_mel(hz: float) -> float:
    if hz < _MIN_LOG_HZ:
        return hz / _F_SP
    return _MIN_LOG_MEL + math.log(hz / _MIN_LOG_HZ) / _LOG_STEP


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    return np.where(mels < _MIN_LOG_MEL, mels * _F_SP,
                    _MIN_LOG_HZ * np.exp(_LOG_STEP * (mels - _MIN_LOG_MEL)))


@lru_cache(maxsize=4)
def mel_filters(n_mels: int) -> np.ndarray:
    """The (n_mels, N_FFT // 2 + 1) triangular filter bank, Slaney-normalised (each filter's
    area constant), over 0 Hz .. the Nyquist frequency; read-only, built once per size."""
    if n_mels <= 0:
        raise ValueError(f"n_mels must be positive, got {n_mels}")
    bin_hz = np.fft.rfftfreq(N_FFT, d=1.0 / SAMPLE_RATE)
    edges = _mel_to_hz(np.linspace(0.0, _hz_to_mel(SAMPLE_RATE / 2), n_mels + 2))
    lo, centre, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bin_hz[None, :] - lo) / (centre - lo)
    falling = (hi - bin_hz[None, :]) / (hi - centre)
    bank = np.clip(np.minimum(rising, falling), 0.0, None)
    bank *= (2.0 / (hi - lo))
    out = bank.astype(np.float32)
    out.setflags(write=False)
    return out


@lru_cache(maxsize=1)
def _hann() -> np.ndarray:
    # Periodic (the DFT-even window torch.hann_window gives), not numpy's symmetric one.
    n = np.arange(N_FFT)
    return (0.5 - 0.5 * np.cos(2.0 * np.pi * n / N_FFT)).astype(np.float32)


def log_mel(samples: np.ndarray, n_mels: int) -> np.ndarray:
    """The encoder input for one window of at most 30 s: (n_mels, 3000) float32, C-ordered.

    Longer input is refused rather than cut: the caller splits audio into windows
    (server.audio.windows) and keeps their offsets."""
    x = np.asarray(samples, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"expected mono samples (1-D), got shape {x.shape}")
    if x.shape[0] > WINDOW_SAMPLES:
        raise ValueError(f"a window holds at most {WINDOW_SAMPLES} samples, got {x.shape[0]}")
    frames = x.shape[0] // HOP  # frames that hold audio; the rest of the 3000 are padding
    out = np.zeros((n_mels, N_FRAMES), dtype=np.float32)
    if frames == 0:
        return out
    padded = np.pad(np.concatenate([x, np.zeros(HOP, np.float32)]), N_FFT // 2,
                    mode="reflect")
    # One frame every HOP samples. Whisper drops the STFT's last frame; of the rest, the
    # one over the appended zeros counts towards the peak but is not the window's.
    view = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:frames + 1]
    spectrum = np.fft.rfft(view * _hann(), axis=-1)
    power = (spectrum.real ** 2 + spectrum.imag ** 2).astype(np.float32)
    mel = mel_filters(n_mels) @ power.T  # (n_mels, frames + 1)
    log = np.log10(np.maximum(mel, 1e-10))
    log = np.maximum(log, log.max() - 8.0)
    out[:, :frames] = (log[:, :frames] + 4.0) / 4.0
    return out
