"""EncoderInput: what an encoder-decoder request (Whisper transcription) carries to the
core beside its decoder prompt tokens.

Plain data like SamplingParams, so it crosses the front end -> core boundary (and the
process boundary, pickled) unchanged: the log-mel features of one 30 s window. The
runner encodes them on the sequence's first step, in one batch with every other new
sequence, and keeps the decoder's cross-attention K/V until the sequence leaves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = ["EncoderInput"]


@dataclass(frozen=True, slots=True, eq=False)
class EncoderInput:
    """``features``: float32 [n_mels, frames] (frames = 3000, one 30 s window; shorter
    audio padded by the caller as Whisper's front end pads). Compared by identity."""

    features: np.ndarray

    def check(self, n_mels: int, frames: int = 3000) -> None:
        """Raises ValueError unless the features fit the model's encoder."""
        import numpy as np

        f = self.features
        if not isinstance(f, np.ndarray) or f.dtype != np.float32:
            raise ValueError("encoder features must be a float32 numpy array")
        if f.shape != (n_mels, frames):
            raise ValueError(f"encoder features must be [{n_mels}, {frames}], got "
                             f"{list(f.shape)}")
        if not np.isfinite(f).all():
            raise ValueError("encoder features hold NaN or infinity")
