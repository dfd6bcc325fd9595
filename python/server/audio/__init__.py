"""The audio front end of speech to text: uploads decoded to 16 kHz mono (decode), split
into 30 s windows at quiet points (windows), each window's log-mel features (mel), all of
it off the event loop and bounded (prepare); and the timed segments the routes format
(segments).

Decoding needs the `audio` extra (soundfile, soxr, av); without it the audio routes answer
a 501 naming the extra, and everything else serves as before.
"""

from __future__ import annotations

from importlib.util import find_spec

AUDIO_PACKAGES = ("soundfile", "soxr", "av")
MISSING_EXTRA = ("audio input needs the `audio` extra: pip install 'llmserve[audio]' "
                 "(soundfile, soxr, av)")


def missing_packages() -> list[str]:
    """The packages of the audio extra that are not installed."""
    return [name for name in AUDIO_PACKAGES if find_spec(name) is None]
