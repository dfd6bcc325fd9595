"""The audio front end on its own: log-mel features against faster-whisper's extractor,
decoding of every container the routes take (made here from a committed clip), the
limits, bad inputs, windowing at quiet points, segments and subtitle syntax."""

from __future__ import annotations

import io
import re
import struct
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("soundfile")
pytest.importorskip("soxr")
av = pytest.importorskip("av")
import soundfile as sf  # noqa: E402

from server.audio.decode import AudioInputError, AudioLimits, decode  # noqa: E402
from server.audio.mel import (  # noqa: E402
    N_FRAMES, SAMPLE_RATE, WINDOW_SAMPLES, log_mel, mel_filters,
)
from server.audio.prepare import AudioFrontend  # noqa: E402
from server.audio.segments import Segment, to_srt, to_vtt, window_segments  # noqa: E402
from server.audio.windows import QUIET_FRAME, join_texts, split  # noqa: E402
from server.errors import APIError  # noqa: E402

CLIPS = Path(__file__).parent / "data" / "audio"
# Measured: 1.2e-7 (one float32 ulp near 1) on every input below, for 80 and 128 bins.
MEL_TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    samples, rate = sf.read(CLIPS / "en_paris.wav", dtype="float32")
    assert rate == SAMPLE_RATE and samples.ndim == 1
    return samples


def _encode(samples: np.ndarray, rate: int, fmt: str, codec: str, codec_rate: int,
            layout: str = "mono") -> bytes:
    """`samples` ([n] or [n, channels]) encoded by FFmpeg into container `fmt`."""
    planar = samples[None, :] if samples.ndim == 1 else samples.T
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(planar, dtype=np.float32),
                                       format="fltp", layout=layout)
    frame.sample_rate = rate
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=codec_rate, layout=layout)
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buf.getvalue()


def _soundfile_bytes(samples: np.ndarray, rate: int, fmt: str, subtype: str | None = None
                     ) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


# -- log-mel parity -----------------------------------------------------------------------
def _faster_whisper_window(samples: np.ndarray, n_mels: int) -> np.ndarray:
    """faster-whisper's features for one window, framed as its transcribe() frames them:
    the extractor over the samples, the frames that hold audio, zero-padded to 3000."""
    from faster_whisper.audio import pad_or_trim
    from faster_whisper.feature_extractor import FeatureExtractor

    features = FeatureExtractor(feature_size=n_mels)(samples)
    return pad_or_trim(features[:, : samples.shape[0] // 160])


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_matches_faster_whisper(clip: np.ndarray, n_mels: int) -> None:
    pytest.importorskip("faster_whisper")
    from faster_whisper.feature_extractor import FeatureExtractor

    bank = FeatureExtractor(feature_size=n_mels).mel_filters
    np.testing.assert_allclose(mel_filters(n_mels), bank, rtol=0, atol=1e-7)
    rng = np.random.default_rng(0)
    inputs = {
        "speech": clip,
        "speech, odd length": clip[:12_345],
        "noise, a full 30 s": (0.1 * rng.standard_normal(WINDOW_SAMPLES)).astype(np.float32),
        "speech tiled to 29.99 s": np.tile(clip, 16)[: WINDOW_SAMPLES - 77],
        "shorter than a hop": clip[:100],
    }
    for name, samples in inputs.items():
        ours = log_mel(samples, n_mels)
        assert ours.shape == (n_mels, N_FRAMES) and ours.dtype == np.float32, name
        diff = np.abs(ours - _faster_whisper_window(samples, n_mels)).max()
        assert diff <= MEL_TOLERANCE, (name, diff)


def test_mel_padding_and_bounds(clip: np.ndarray) -> None:
    features = log_mel(clip, 80)
    frames = clip.shape[0] // 160
    assert np.all(features[:, frames:] == 0.0)  # faster-whisper's zero padding
    assert features[:, :frames].std() > 0.1
    # Whisper's normalisation: within 8 of the peak in log10, then (x + 4) / 4.
    assert features[:, :frames].max() - features[:, :frames].min() <= 2.0 + 1e-6
    # Silence sits at the floor, log10(1e-10) = -10, i.e. -1.5 (within numpy's log10 ulps:
    # its AVX-512 path gives -1.5000002).
    np.testing.assert_allclose(log_mel(np.zeros(16_000, np.float32), 80)[:, :100], -1.5,
                               rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="at most"):
        log_mel(np.zeros(WINDOW_SAMPLES + 1, np.float32), 80)
    with pytest.raises(ValueError, match="mono"):
        log_mel(np.zeros((2, 100), np.float32), 80)


# -- decoding -----------------------------------------------------------------------------
def test_decode_lossless_formats_exact(clip: np.ndarray) -> None:
    wav = (CLIPS / "en_paris.wav").read_bytes()
    for name, data in {"wav": wav,
                       "flac": _soundfile_bytes(clip, SAMPLE_RATE, "FLAC")}.items():
        out = decode(data, AudioLimits())
        assert out.dtype == np.float32 and out.flags.c_contiguous, name
        np.testing.assert_array_equal(out, clip, err_msg=name)


@pytest.mark.parametrize("kind", ["ogg-vorbis", "ogg-opus", "mp3", "webm-opus", "m4a-aac"])
def test_decode_lossy_formats(clip: np.ndarray, kind: str) -> None:
    data = {
        "ogg-vorbis": lambda: _soundfile_bytes(clip, SAMPLE_RATE, "OGG", "VORBIS"),
        "ogg-opus": lambda: _encode(clip, SAMPLE_RATE, "ogg", "libopus", 48_000),
        "mp3": lambda: _encode(clip, SAMPLE_RATE, "mp3", "libmp3lame", 16_000),
        "webm-opus": lambda: _encode(clip, SAMPLE_RATE, "webm", "libopus", 48_000),
        "m4a-aac": lambda: _encode(clip, SAMPLE_RATE, "mp4", "aac", 16_000),
    }[kind]()
    out = decode(data, AudioLimits())
    assert out.dtype == np.float32
    # Encoders pad to whole frames; AAC in an mp4 written without an edit list keeps its
    # 1024 priming samples, and its frames are 1024 long.
    lag = 1024 if kind == "m4a-aac" else 0
    assert 0 <= out.shape[0] - clip.shape[0] - lag <= 1100, (kind, out.shape)
    n = min(out.shape[0] - lag, clip.shape[0])
    corr = np.corrcoef(out[lag:lag + n], clip[:n])[0, 1]
    assert corr > 0.95, (kind, corr)


def test_decode_downmixes_and_resamples() -> None:
    t = np.arange(44_100 * 2) / 44_100
    left = 0.5 * np.sin(2 * np.pi * 440 * t)
    right = 0.3 * np.sin(2 * np.pi * 440 * t)
    stereo = np.stack([left, right], axis=1).astype(np.float32)
    for name, data in {
        "wav 44.1k stereo": _soundfile_bytes(stereo, 44_100, "WAV", "FLOAT"),
        "mp3 44.1k stereo": _encode(stereo, 44_100, "mp3", "libmp3lame", 44_100, "stereo"),
    }.items():
        out = decode(data, AudioLimits())
        assert abs(out.shape[0] - 2 * SAMPLE_RATE) <= 1200, (name, out.shape)
        middle = out[4000:-4000]
        spectrum = np.abs(np.fft.rfft(middle))
        peak_hz = np.argmax(spectrum) * SAMPLE_RATE / middle.shape[0]
        assert abs(peak_hz - 440) < 2, (name, peak_hz)
        # The mean of the channels: amplitude (0.5 + 0.3) / 2.
        assert abs(np.sqrt(2) * middle.std() - 0.4) < 0.02, (name, middle.std())
    low = _soundfile_bytes(np.zeros(8000, np.float32), 8000, "WAV")
    assert decode(low, AudioLimits()).shape == (SAMPLE_RATE,)


def _wav_with_declared_size(samples: np.ndarray, declared: int) -> bytes:
    data = _soundfile_bytes(samples, SAMPLE_RATE, "WAV", "PCM_16")
    at = data.index(b"data") + 4
    return data[:at] + struct.pack("<I", declared) + data[at + 4:]


def test_bad_inputs_are_audio_input_errors(clip: np.ndarray) -> None:
    wav = (CLIPS / "en_paris.wav").read_bytes()
    mp3 = _encode(clip, SAMPLE_RATE, "mp3", "libmp3lame", 16_000)
    webm = _encode(clip, SAMPLE_RATE, "webm", "libopus", 48_000)
    flac = _soundfile_bytes(clip, SAMPLE_RATE, "FLAC")
    ogg = _soundfile_bytes(clip, SAMPLE_RATE, "OGG", "VORBIS")
    nan = clip.copy()
    nan[100] = np.nan
    cases = {
        "empty": (b"", "empty"),
        "text": (b"this is not audio at all, just some text\n" * 20, "not audio"),
        "zeros": (bytes(4096), "not audio"),
        "RIFF header only": (wav[:44], "cut off"),
        "wav cut in half": (wav[: len(wav) // 2], "cut off"),
        "flac cut in half": (flac[: len(flac) // 2], "cut off or corrupt"),
        "ogg cut in half": (ogg[: len(ogg) // 2], "no audio samples"),
        "mp3 cut in half": (mp3[: len(mp3) // 2], "cut off"),
        "webm cut in half": (webm[: len(webm) // 2], "cut off"),
        "wav with NaN samples": (_soundfile_bytes(nan, SAMPLE_RATE, "WAV", "FLOAT"),
                                 "not finite"),
        "wav declaring 4x its samples": (_wav_with_declared_size(clip, 8 * clip.shape[0]),
                                         "cut off"),
    }
    for name, (data, why) in cases.items():
        with pytest.raises(AudioInputError, match=why) as info:
            decode(data, AudioLimits())
        assert info.value.param == "file", name
    # A streaming encoder's placeholder size is not a cut-off file.
    assert decode(_wav_with_declared_size(clip, 0xFFFFFFFF), AudioLimits()).shape == clip.shape


def test_scripts_naming_other_files_are_refused(tmp_path, monkeypatch) -> None:
    """Demuxers that open further files or URLs (a concat script, an HLS playlist) are
    never used: an upload could otherwise make FFmpeg read files beside the server."""
    wav = (CLIPS / "en_paris.wav").read_bytes()
    (tmp_path / "beside.wav").write_bytes(wav)
    monkeypatch.chdir(tmp_path)  # relative names resolve here, as in the server's directory
    cases = {
        "ffconcat": b"ffconcat version 1.0\nfile 'beside.wav'\n",
        "ffconcat, no header": b"file 'beside.wav'\n" * 2,
        "hls playlist": b"#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXTINF:2.0,\nbeside.wav\n"
                        b"#EXT-X-ENDLIST\n",
    }
    for name, data in cases.items():
        with pytest.raises(AudioInputError, match="not audio in a format") as info:
            decode(data, AudioLimits())
        assert info.value.param == "file", name
    assert decode(wav, AudioLimits()).shape[0] > 0  # the file itself is fine


def test_video_without_audio_is_refused() -> None:
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for _ in range(3):
            frame = av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    with pytest.raises(AudioInputError, match="no audio stream"):
        decode(buf.getvalue(), AudioLimits())


def test_limits(clip: np.ndarray) -> None:
    wav = (CLIPS / "en_paris.wav").read_bytes()  # 1.98 s
    mp3 = _encode(clip, SAMPLE_RATE, "mp3", "libmp3lame", 16_000)
    with pytest.raises(AudioInputError, match="VLLM_MAX_AUDIO_CLIP_FILESIZE_MB"):
        decode(wav, AudioLimits(max_upload_bytes=1000))
    for data in (wav, mp3):  # from the header, and from the container's duration
        with pytest.raises(AudioInputError, match="VLLM_MAX_AUDIO_DECODE_DURATION_S"):
            decode(data, AudioLimits(max_duration_s=1.0))
    with pytest.raises(AudioInputError, match="VLLM_MAX_AUDIO_DECODE_BYTES"):
        decode(wav, AudioLimits(max_decode_bytes=100_000))
    # A header that declares no length is bounded while decoding.
    with pytest.raises(AudioInputError, match="VLLM_MAX_AUDIO_DECODE_DURATION_S"):
        decode(_wav_with_declared_size(clip, 0xFFFFFFFF), AudioLimits(max_duration_s=1.0))
    limits = AudioLimits.from_env({"VLLM_MAX_AUDIO_CLIP_FILESIZE_MB": "1.5",
                                   "VLLM_MAX_AUDIO_DECODE_DURATION_S": "30"})
    assert limits.max_upload_bytes == 1_572_864 and limits.max_duration_s == 30.0
    assert AudioLimits.from_env({}) == AudioLimits()
    with pytest.raises(ValueError, match="VLLM_MAX_AUDIO_DECODE_BYTES"):
        AudioLimits.from_env({"VLLM_MAX_AUDIO_DECODE_BYTES": "-1"})


# -- windows ------------------------------------------------------------------------------
def test_split_cuts_at_quiet_points() -> None:
    rng = np.random.default_rng(1)
    audio = (0.3 * rng.standard_normal(75 * SAMPLE_RATE)).astype(np.float32)
    quiet = [int(28.7 * SAMPLE_RATE), int(57.9 * SAMPLE_RATE)]  # 150 ms of near-silence each
    for q in quiet:
        audio[q:q + 2400] *= 0.001
    windows = split(audio)
    assert len(windows) == 3
    assert all(w.samples.shape[0] <= WINDOW_SAMPLES for w in windows)
    np.testing.assert_array_equal(np.concatenate([w.samples for w in windows]), audio)
    for w, q in zip(windows[1:], quiet):
        assert q + QUIET_FRAME // 2 <= w.start <= q + 2400 - QUIET_FRAME // 2, (w.start, q)
    assert windows[1].start_s == pytest.approx(windows[0].duration_s)
    # Without a quiet stretch in the search span, a window still ends by 30 s.
    loud = split(np.ones(61 * SAMPLE_RATE, np.float32))
    assert [w.samples.shape[0] <= WINDOW_SAMPLES for w in loud] == [True] * len(loud)
    assert sum(w.samples.shape[0] for w in loud) == 61 * SAMPLE_RATE
    short = split(audio[:SAMPLE_RATE])
    assert len(short) == 1 and short[0].start == 0


def test_join_texts() -> None:
    assert join_texts([" Hello there.", "", " General Kenobi. "], "en") == \
        "Hello there. General Kenobi."
    assert join_texts(["你好。", "世界。"], "zh") == "你好。世界。"


def test_prepare_off_loop_and_pending_bytes_bound() -> None:
    import trio

    wav = (CLIPS / "en_paris.wav").read_bytes()

    async def main() -> None:
        frontend = AudioFrontend(AudioLimits(), workers=1)
        prepared = await frontend.prepare(wav, 80)
        assert prepared.duration_s == pytest.approx(1.978125)
        assert len(prepared.windows) == 1 and prepared.features[0].shape == (80, N_FRAMES)
        assert frontend.pending_bytes == 0
        busy = AudioFrontend(AudioLimits(), workers=1, max_pending_bytes=len(wav) - 1)
        with pytest.raises(APIError) as info:
            await busy.prepare(wav, 80)
        assert info.value.status == 503 and "Retry-After" in info.value.headers
        with pytest.raises(AudioInputError):
            await frontend.prepare(b"not audio", 80)
        assert frontend.pending_bytes == 0

    trio.run(main)


# -- segments and subtitles ---------------------------------------------------------------
TS = 50_364  # Whisper's <|0.00|>


def _decode_ids(ids: list[int]) -> str:
    return "".join(f" w{i}" for i in ids)


def test_window_segments_from_timestamps() -> None:
    tokens = [TS, 1, 2, TS + 60, TS + 60, 3, TS + 100, 4]
    segs = window_segments(tokens, timestamp_begin=TS, decode=_decode_ids, offset_s=30.0,
                           duration_s=4.0, logprobs=[0, -1, -2, 0, 0, -3, 0, -4])
    assert [(s.start, s.end, s.text, s.tokens) for s in segs] == [
        (30.0, 31.2, " w1 w2", [1, 2]),
        (31.2, 32.0, " w3", [3]),
        (32.0, 34.0, " w4", [4]),  # no closing stamp: ends with the window
    ]
    assert segs[0].avg_logprob == -1.5 and segs[0].seek == 3000
    plain = window_segments([5, 6], timestamp_begin=TS, decode=_decode_ids, offset_s=0.0,
                            duration_s=2.5)
    assert [(s.start, s.end, s.text) for s in plain] == [(0.0, 2.5, " w5 w6")]
    body = plain[0].verbose(0)
    assert set(body) == {"id", "seek", "start", "end", "text", "tokens", "temperature",
                         "avg_logprob", "compression_ratio", "no_speech_prob"}


SRT_CUE = re.compile(r"(\d+)\n(\d\d:\d\d:\d\d,\d\d\d) --> (\d\d:\d\d:\d\d,\d\d\d)\n(.+)\n")
VTT_CUE = re.compile(r"(\d\d:\d\d:\d\d\.\d\d\d) --> (\d\d:\d\d:\d\d\.\d\d\d)\n(.+)\n")


def test_srt_and_vtt_syntax() -> None:
    segs = [Segment(0.0, 1.5, " Hello."), Segment(1.5, 1.5, "   "),
            Segment(3661.25, 3662.0, " a --> b\n\nc & <d>")]
    srt = to_srt(segs)
    cues = srt.split("\n\n")
    assert cues[-1] == "" and len(cues) == 3
    parsed = [SRT_CUE.fullmatch(c + "\n") for c in cues[:-1]]
    assert all(parsed), srt
    assert [m.group(1) for m in parsed] == ["1", "2"]
    assert parsed[1].group(2) == "01:01:01,250" and parsed[1].group(4) == "a -> b c & <d>"
    vtt = to_vtt(segs)
    assert vtt.startswith("WEBVTT\n\n")
    vcues = vtt[len("WEBVTT\n\n"):].split("\n\n")
    vparsed = [VTT_CUE.fullmatch(c + "\n") for c in vcues[:-1]]
    assert all(vparsed) and len(vparsed) == 2, vtt
    assert vparsed[0].group(1) == "00:00:00.000" and vparsed[0].group(2) == "00:00:01.500"
    assert vparsed[1].group(3) == "a -&gt; b c &amp; &lt;d&gt;"


def test_corrupted_files_are_refused_or_decoded(clip: np.ndarray) -> None:
    """Random damage to every format: each either decodes to finite samples or is an
    AudioInputError, never another exception."""
    rng = np.random.default_rng(7)
    sources = {
        "wav": (CLIPS / "en_paris.wav").read_bytes(),
        "flac": _soundfile_bytes(clip, SAMPLE_RATE, "FLAC"),
        "ogg": _soundfile_bytes(clip, SAMPLE_RATE, "OGG", "VORBIS"),
        "mp3": _encode(clip, SAMPLE_RATE, "mp3", "libmp3lame", 16_000),
        "webm": _encode(clip, SAMPLE_RATE, "webm", "libopus", 48_000),
    }
    outcomes = {"decoded": 0, "refused": 0}
    for name, data in sources.items():
        for _ in range(25):
            damaged = bytearray(data)
            where = rng.integers(0, min(len(damaged), 4096), size=int(rng.integers(1, 16)))
            for i in where:  # the headers and first frames, where parsers decide
                damaged[i] = int(rng.integers(0, 256))
            if rng.random() < 0.3:
                damaged = damaged[: int(rng.integers(1, len(damaged)))]
            try:
                out = decode(bytes(damaged), AudioLimits())
            except AudioInputError as exc:
                assert exc.message and exc.param == "file"
                outcomes["refused"] += 1
            else:
                assert out.dtype == np.float32 and np.isfinite(out).all(), name
                outcomes["decoded"] += 1
    assert outcomes["decoded"] and outcomes["refused"], outcomes
