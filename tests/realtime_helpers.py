"""What the realtime route's server tests share: the speech they send (the committed
espeak-ng clips as 16 kHz PCM16), the WebSocket client's few moves, and the upload route's
text of the same samples to compare with."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf
from server_helpers import ServerProcess
from websockets.exceptions import ConnectionClosed

CLIPS = Path(__file__).parent / "data" / "audio"
MODEL = "whisper-tiny.en"
KEY = "realtime-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
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
