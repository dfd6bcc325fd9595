"""The realtime route's audio side without a server: chunks cut into the windows an upload
gets (server.audio.stream against server.audio.windows.split), PCM16 chunks read as the
upload decoder reads a 16-bit WAV, the client events refused with their codes, and the
lead meter's arithmetic."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from server.api.openai import realtime_protocol as proto
from server.api.openai.realtime_limits import AudioBudget, LeadMeter
from server.audio.stream import PCMError, StreamWindows, pcm16_samples
from server.audio.windows import split

RATE = 16000


def _speechlike(seconds: float, seed: int = 0) -> np.ndarray:
    """Bursts of noise with quiet gaps of varied depth: the cut points depend on them."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    envelope = 0.05 + np.abs(np.sin(np.arange(n) / RATE * rng.uniform(1.5, 3.0)))
    pcm = (rng.standard_normal(n) * envelope * 6000).clip(-32768, 32767).astype(np.int16)
    return pcm


@pytest.mark.parametrize("chunk", [1600, 4096, 7, 48000])
def test_windows_equal_split_for_any_chunking(chunk: int) -> None:
    pcm = _speechlike(95.3)
    whole = pcm.astype(np.float32) / 32768
    expected = split(whole)
    assert len(expected) == 4
    stream = StreamWindows()
    got = []
    for i in range(0, pcm.shape[0], chunk):
        got += stream.append(pcm16_samples(pcm[i:i + chunk].tobytes()))
    assert len(got) == 3  # decided while audio arrived
    last = stream.finish()
    assert last is not None and stream.held_samples == 0 and stream.finish() is None
    got.append(last)
    assert [g.shape[0] for g in got] == [w.samples.shape[0] for w in expected]
    for g, w in zip(got, expected):
        assert np.array_equal(g, w.samples)


def test_pcm16_reads_as_the_upload_decoder_reads_a_wav() -> None:
    sf = pytest.importorskip("soundfile")
    from server.audio.decode import AudioLimits, decode

    pcm = _speechlike(2.0, seed=3)
    buf = io.BytesIO()
    sf.write(buf, pcm, RATE, format="WAV", subtype="PCM_16")
    assert np.array_equal(decode(buf.getvalue(), AudioLimits()), pcm16_samples(pcm.tobytes()))


def test_chunks_that_are_not_pcm16() -> None:
    with pytest.raises(PCMError, match="odd"):
        pcm16_samples(b"\x00\x01\x02")
    with pytest.raises(PCMError, match="WAV"):
        pcm16_samples(b"RIFF" + bytes(40))


def _append(audio: str) -> dict:
    return {"type": "input_audio_buffer.append", "audio": audio}


@pytest.mark.parametrize("audio, says", [
    ("not base64 at all!", "base64"),
    (base64.b64encode(b"\x01\x02\x03").decode(), "odd"),
    (base64.b64encode(b"RIFF" + bytes(100)).decode(), "not raw PCM16"),
    ("", "empty"),
    (base64.b64encode(bytes(1002)).decode(), "over 1000 bytes"),
], ids=["not base64", "odd bytes", "a wav file", "empty", "oversized"])
def test_bad_appends(audio: str, says: str) -> None:
    with pytest.raises(proto.EventError, match=says) as info:
        proto.decode_audio(_append(audio), 1000)
    assert info.value.code == "invalid_audio"
    assert proto.decode_audio(_append(base64.b64encode(bytes(1000)).decode()), 1000).shape == (500,)


def test_session_updates_in_both_dialects() -> None:
    upd = proto.parse_session_update({"type": "session.update", "model": "m"})
    assert (upd.dialect, upd.model, upd.language) == (proto.VLLM, "m", None)
    upd = proto.parse_session_update({"type": "session.update", "session": {
        "type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 16000},
            "transcription": {"model": "m", "language": "en", "prompt": "p"}}}}})
    assert (upd.dialect, upd.model, upd.language, upd.prompt) == (proto.OPENAI, "m", "en", "p")
    beta = proto.parse_session_update({"type": "transcription_session.update", "session": {
        "input_audio_format": "pcm16", "input_audio_transcription": {"model": "m"}}})
    assert (beta.dialect, beta.model) == (proto.OPENAI, "m")
    for session, code_param in [({"input_audio_format": "g711_ulaw"}, "input_audio_format"),
                                ({"audio": {"input": {"format": {"type": "audio/pcm",
                                                                 "rate": 24000}}}}, "rate")]:
        with pytest.raises(proto.EventError) as info:
            proto.parse_session_update({"type": "session.update", "session": session})
        assert (info.value.code, info.value.param) == ("invalid_audio_format", code_param)


def test_events_and_errors() -> None:
    with pytest.raises(proto.EventError) as info:
        proto.parse_event("{nope")
    assert info.value.code == "invalid_json"
    with pytest.raises(proto.EventError):
        proto.parse_event(b'{"type": "x"}')
    with pytest.raises(proto.EventError):
        proto.parse_event("[1]")
    exc = proto.unknown_event("x" * 500)
    assert exc.code == "unknown_event" and len(exc.message) < 100
    assert proto.error(proto.VLLM, exc) == {"type": "error", "error": exc.message,
                                            "code": "unknown_event"}
    opened = proto.error(proto.OPENAI, exc, "evt_1")
    assert opened["error"]["event_id"] == "evt_1" and opened["error"]["code"] == "unknown_event"
    done = proto.completed(proto.VLLM, "item_1", "hi", 4, 2)
    assert done["type"] == "transcription.done" and done["usage"]["total_tokens"] == 6
    done = proto.completed(proto.OPENAI, "item_1", "hi", 4, 2)
    assert done["type"] == "conversation.item.input_audio_transcription.completed"
    assert done["transcript"] == "hi" and done["item_id"] == "item_1"


def test_lead_meter_and_budget() -> None:
    lead = LeadMeter()
    assert lead.add(0.0, 0.1) == pytest.approx(0.1)
    assert lead.add(0.0, 5.0) == pytest.approx(5.1)  # a burst
    assert lead.add(10.0, 0.1) == pytest.approx(0.1)  # drained, never below zero
    budget = AudioBudget(100)
    assert budget.take(50) and not budget.take(1)
    budget.give(50)
    assert budget.held == 0 and budget.take(50)
