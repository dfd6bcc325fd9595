"""Uploaded audio bytes to 16 kHz mono float32 samples, or an AudioInputError naming why.

WAV, FLAC and OGG (Vorbis, Opus) are read by libsndfile (soundfile); MP3, WebM/Opus, MP4/AAC
and anything else by FFmpeg (PyAV). Channels are averaged to mono and the rate converted
with soxr. Every way an upload can be unusable ends in AudioInputError (a 400 at the
route), never in an exception from a library, a model input full of NaN or an empty
window: not audio at all, no audio stream, no samples, a cut-off file (its header or
container says it is longer than what decodes), corrupt frames, non-finite samples.

Limits, checked before the samples are allocated where the file's header tells, and while
decoding where it does not (a small compressed file can expand into gigabytes of PCM):
upload size, decoded duration and decoded PCM bytes. Their defaults and environment
variables are vLLM's (VLLM_MAX_AUDIO_CLIP_FILESIZE_MB, VLLM_MAX_AUDIO_DECODE_DURATION_S,
VLLM_MAX_AUDIO_DECODE_BYTES).

FFmpeg reads only the containers in ``_FFMPEG_FORMATS`` and opens nothing but the upload:
left to probe every demuxer, it would take a concat script (``ffconcat version 1.0`` /
``file 'x.wav'``) or a playlist as input and open the files it names, relative to the
server's working directory, and the transcript would read them back to the client. Its
options ``format_whitelist`` (checked after probing, before the demuxer reads anything) and
an empty ``protocol_whitelist`` (no demuxer may open a further file or URL) enforce that,
and the opened container's format is checked again against the list.

This runs in a worker thread (server.audio.prepare), never on the event loop.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from server.audio.mel import SAMPLE_RATE
from server.config import env_number

MIB = 1024 * 1024
# libsndfile reads these itself; anything else goes to FFmpeg (libsndfile's MP3 reader
# is newer and less tolerant than FFmpeg's, and its Opus reader is off by a few ms).
_SOUNDFILE_FORMATS = frozenset({"WAV", "WAVEX", "RF64", "W64", "FLAC", "OGG", "AIFF", "CAF"})
_READ_BLOCK = 1 << 16  # frames per soundfile read
# The FFmpeg demuxers an upload may use (names as FFmpeg's, "matroska,webm" matching either):
# audio containers that read only their own bytes. Not concat, hls, image2, tee and the like.
_FFMPEG_FORMATS = ("aac", "aiff", "caf", "flac", "matroska", "webm", "mov", "mp4", "m4a",
                   "mp3", "ogg", "wav", "w64")
_FFMPEG_OPTIONS = {
    "format_whitelist": ",".join(_FFMPEG_FORMATS),
    "protocol_whitelist": "",  # the upload is read through Python; nothing else is opened
}
# A file is cut off when what decodes falls short of its declared length by more than
# this (containers round their durations; encoders pad the last frame).
_SHORTFALL_S = 0.25
_SHORTFALL_FRACTION = 0.05


class AudioInputError(Exception):
    """An upload that cannot be transcribed; its message is ours, safe to return."""

    def __init__(self, message: str, param: str = "file") -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class AudioLimits:
    """Per-upload bounds. Defaults are vLLM's: 25 MB uploads, 600 s decoded, 256 MiB of
    float32 PCM (600 s of 48 kHz stereo fits)."""

    max_upload_bytes: int = 25 * MIB
    max_duration_s: float = 600.0
    max_decode_bytes: int = 256 * MIB

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AudioLimits:
        env = os.environ if environ is None else environ
        return cls(
            max_upload_bytes=int(env_number("VLLM_MAX_AUDIO_CLIP_FILESIZE_MB", 25, env) * MIB),
            max_duration_s=env_number("VLLM_MAX_AUDIO_DECODE_DURATION_S", 600.0, env),
            max_decode_bytes=int(env_number("VLLM_MAX_AUDIO_DECODE_BYTES", 256 * MIB, env)),
        )

    def check_upload(self, size: int) -> None:
        if size > self.max_upload_bytes:
            raise AudioInputError(
                f"the file is {size / MIB:.1f} MB; the limit is "
                f"{self.max_upload_bytes / MIB:g} MB (VLLM_MAX_AUDIO_CLIP_FILESIZE_MB)")

    def too_long(self, seconds: float) -> AudioInputError:
        return AudioInputError(
            f"the audio lasts {seconds:.1f} s; the limit is {self.max_duration_s:g} s "
            "(VLLM_MAX_AUDIO_DECODE_DURATION_S)")

    def too_large(self, nbytes: int) -> AudioInputError:
        return AudioInputError(
            f"the audio decodes to more than {self.max_decode_bytes / MIB:g} MiB of samples "
            "(VLLM_MAX_AUDIO_DECODE_BYTES)")


def decode(data: bytes, limits: AudioLimits) -> np.ndarray:
    """The upload as 16 kHz mono float32 samples (a fresh, C-ordered array)."""
    if not data:
        raise AudioInputError("the file is empty")
    limits.check_upload(len(data))
    try:
        decoded = _decode_soundfile(data, limits)
        if decoded is None:
            decoded = _decode_pyav(data, limits)
    except (AudioInputError, MemoryError):
        raise
    except Exception as exc:  # a library's failure on untrusted bytes is the file's fault
        raise AudioInputError("the file could not be decoded: it is corrupt") from exc
    samples, rate = decoded
    if samples.shape[0] == 0:
        raise AudioInputError("the file holds no audio samples")
    if not np.isfinite(samples).all():
        raise AudioInputError("the file holds samples that are not finite numbers")
    if rate != SAMPLE_RATE:
        import soxr

        samples = soxr.resample(samples, rate, SAMPLE_RATE)
    return np.ascontiguousarray(samples, dtype=np.float32)


def _cut_off(decoded_s: float, declared_s: float) -> bool:
    shortfall = declared_s - decoded_s
    return shortfall > max(_SHORTFALL_S, _SHORTFALL_FRACTION * declared_s)


def _wav_declared_bytes(data: bytes) -> tuple[int, int] | None:
    """(offset, size) of a RIFF/WAVE file's data chunk as its header declares it; None when
    it is not such a file, or its size is a placeholder (0 or 0xFFFFFFFF: written by a
    streaming encoder that could not seek back)."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    pos = 12
    while pos + 8 <= len(data):
        tag, size = data[pos:pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        if tag == b"data":
            return None if size in (0, 0xFFFFFFFF) else (pos + 8, size)
        pos += 8 + size + (size & 1)
    return None


def _looks_like_mp3(data: bytes) -> bool:
    # An ID3 tag or an MPEG audio frame sync: FFmpeg's (libsndfile's mpg123 would open it,
    # only to be passed over, and prints its complaints about damaged files to stderr).
    return data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0)


def _decode_soundfile(data: bytes, limits: AudioLimits) -> tuple[np.ndarray, int] | None:
    """libsndfile's decode, or None when the bytes are not one of its formats here."""
    import soundfile

    if _looks_like_mp3(data):
        return None
    try:
        f = soundfile.SoundFile(io.BytesIO(data))
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError):
        return None
    with f:
        # libsndfile 1.2 skips the wrong number of Opus priming samples (output 6.5 ms late).
        if f.format not in _SOUNDFILE_FORMATS or f.subtype == "OPUS":
            return None
        rate, channels, declared = f.samplerate, f.channels, f.frames
        if rate <= 0 or channels <= 0:
            raise AudioInputError("the file's header is invalid (no sample rate or channels)")
        if declared / rate > limits.max_duration_s:
            raise limits.too_long(declared / rate)
        if declared * channels * 4 > limits.max_decode_bytes:
            raise limits.too_large(declared * channels * 4)
        blocks, frames = [], 0
        try:
            while True:
                block = f.read(_READ_BLOCK, dtype="float32", always_2d=True)
                if block.shape[0] == 0:
                    break
                frames += block.shape[0]
                # The header's count may be absent or false: the bounds hold while reading.
                if frames / rate > limits.max_duration_s:
                    raise limits.too_long(frames / rate)
                if frames * channels * 4 > limits.max_decode_bytes:
                    raise limits.too_large(frames * channels * 4)
                blocks.append(block.mean(axis=1) if channels > 1 else block[:, 0])
        except (soundfile.LibsndfileError, RuntimeError) as exc:
            raise AudioInputError("the file could not be decoded: it is cut off or "
                                  "corrupt") from exc
    if frames < declared:
        raise AudioInputError(f"the file is cut off: its header declares {declared / rate:.2f} "
                              f"s of audio, {frames / rate:.2f} s are present")
    wav = _wav_declared_bytes(data)
    if wav is not None and wav[0] + wav[1] > len(data) + channels * 8:
        raise AudioInputError(f"the file is cut off: its header declares {wav[1]} bytes of "
                              f"samples, {max(len(data) - wav[0], 0)} are present")
    samples = np.concatenate(blocks) if blocks else np.zeros(0, np.float32)
    return samples, rate


def _decode_pyav(data: bytes, limits: AudioLimits) -> tuple[np.ndarray, int]:
    import av

    not_audio = ("the file is not audio in a format this server reads "
                 "(wav, flac, ogg, mp3, webm, m4a ...)")
    try:
        container = av.open(io.BytesIO(data), mode="r", container_options=_FFMPEG_OPTIONS)
    except (av.error.FFmpegError, UnicodeDecodeError, ValueError, IndexError) as exc:
        raise AudioInputError(not_audio) from exc
    with container:
        if not set(container.format.name.split(",")) & set(_FFMPEG_FORMATS):
            raise AudioInputError(not_audio)
        if not container.streams.audio:
            raise AudioInputError("the file has no audio stream")
        stream = container.streams.audio[0]
        declared = None
        if stream.duration and stream.time_base:
            declared = float(stream.duration * stream.time_base)
        elif container.duration:
            declared = container.duration / 1_000_000
        if declared is not None and declared > limits.max_duration_s:
            raise limits.too_long(declared)
        # Every frame converted to float planar at its own layout; channels averaged here,
        # as on the libsndfile path (FFmpeg's own downmix weights channels differently).
        to_float = av.AudioResampler(format="fltp")
        blocks: list[np.ndarray] = []
        rate = 0
        frames = 0
        try:
            for frame in container.decode(stream):
                for converted in to_float.resample(frame):
                    pcm = converted.to_ndarray()  # (channels, samples)
                    if not rate:
                        rate = converted.sample_rate
                    elif converted.sample_rate != rate:
                        raise AudioInputError("the file changes its sample rate mid-stream")
                    frames += pcm.shape[1]
                    if rate and frames / rate > limits.max_duration_s:
                        raise limits.too_long(frames / rate)
                    if frames * pcm.shape[0] * 4 > limits.max_decode_bytes:
                        raise limits.too_large(frames * pcm.shape[0] * 4)
                    blocks.append(pcm.mean(axis=0) if pcm.shape[0] > 1 else pcm[0])
        except (av.error.FFmpegError, EOFError, ValueError) as exc:
            raise AudioInputError("the file could not be decoded: it is cut off or "
                                  "corrupt") from exc
    if not frames or rate <= 0:
        raise AudioInputError("the file holds no audio samples")
    if declared is not None and _cut_off(frames / rate, declared):
        raise AudioInputError(f"the file is cut off: it declares {declared:.2f} s of audio, "
                              f"{frames / rate:.2f} s decode")
    return np.concatenate(blocks).astype(np.float32, copy=False), rate
