"""The realtime route's events: what a client may send, and what the server answers, in the
two dialects clients speak.

vLLM 0.34's realtime API (its docs' "Realtime API"): the client sends
`{"type": "session.update", "model": M}`, `input_audio_buffer.append` with `audio` (base64
PCM16, 16 kHz, mono) and `input_audio_buffer.commit` (`final: true` ends the audio); the
server answers `session.created` {id, created}, `transcription.delta` {delta},
`transcription.done` {text, usage} and `error` {error, code}, with vLLM's codes
(invalid_json, unknown_event, invalid_audio, model_not_found, model_not_validated,
processing_error). A commit without `final` only says "start" there; here transcription
runs as audio arrives, so it changes nothing.

OpenAI's realtime transcription events, chosen by a session.update that carries a
`session` object (or `transcription_session.update`): every commit ends an item
(`input_audio_buffer.committed` {item_id, previous_item_id}), text streams as
`conversation.item.input_audio_transcription.delta` {item_id, content_index, delta} and ends
with `.completed` {item_id, content_index, transcript, usage}; errors are
`{"type": "error", "error": {type, code, message, param, event_id}}`. Its session names
the format (`input_audio_format: "pcm16"`, or `audio.input.format` {type "audio/pcm",
rate}) and the transcription (model, language, prompt); a format other than 16 kHz PCM16
is an error event, as the server does not resample.

Both: `input_audio_buffer.clear` drops what is buffered (`input_audio_buffer.cleared`),
and `session.updated` acknowledges a session.update (vLLM's own test waits for it).
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from server.audio.stream import PCMError, pcm16_samples

VLLM, OPENAI = "vllm", "openai"
MAX_TYPE_CHARS = 64  # of an unknown event type repeated in its error


class EventError(Exception):
    """A client event the server refuses: answered with an error event, the connection
    stays open."""

    def __init__(self, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.param = message, code, param


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


@dataclass
class Session:
    id: str = field(default_factory=lambda: new_id("sess-"))
    created: int = field(default_factory=lambda: int(time.time()))
    dialect: str = VLLM
    model: str | None = None  # set once a session.update names a served model
    language: str | None = None
    prompt: str = ""

    def describe(self) -> dict[str, Any]:
        """The session as OpenAI's transcription session reads it."""
        return {"id": self.id, "object": "realtime.transcription_session",
                "type": "transcription",
                "audio": {"input": {
                    "format": {"type": "audio/pcm", "rate": 16000},
                    "transcription": {"model": self.model, "language": self.language,
                                      "prompt": self.prompt},
                    "turn_detection": None}}}


# -- client events -----------------------------------------------------------------------
def parse_event(raw: str | bytes) -> dict[str, Any]:
    """One client message as an event: a JSON object with a string `type`."""
    if isinstance(raw, bytes):
        raise EventError("events are JSON text messages, not binary ones", "invalid_json")
    try:
        event = json.loads(raw)
    except (ValueError, RecursionError):
        raise EventError("Invalid JSON", "invalid_json") from None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise EventError("an event is a JSON object with a string `type`", "invalid_event",
                         "type")
    return event


def client_event_id(event: dict[str, Any]) -> str | None:
    value = event.get("event_id")
    return value[:128] if isinstance(value, str) else None


def unknown_event(event_type: str) -> EventError:
    return EventError(f"Unknown event type: {event_type[:MAX_TYPE_CHARS]}", "unknown_event",
                      "type")


@dataclass(frozen=True)
class SessionUpdate:
    dialect: str
    model: str | None
    language: str | None
    prompt: str | None


def _text(value: Any, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise EventError(f"{name} must be a string", "invalid_event", name)


def _check_format(fmt: Any, rate: Any) -> None:
    kind = fmt.get("type") if isinstance(fmt, dict) else fmt
    if isinstance(fmt, dict):
        rate = fmt.get("rate", rate)
    if kind not in (None, "pcm16", "audio/pcm"):
        raise EventError(f"unsupported audio format {str(kind)[:40]!r}: send pcm16 "
                         "(audio/pcm), 16 kHz mono", "invalid_audio_format",
                         "input_audio_format")
    if rate not in (None, 16000):
        raise EventError(f"unsupported sample rate {str(rate)[:20]}: send 16000 Hz PCM16 "
                         "(the server does not resample)", "invalid_audio_format", "rate")


def parse_session_update(event: dict[str, Any]) -> SessionUpdate:
    """vLLM's {model, language?, prompt?} or OpenAI's {session: {...}}."""
    session = event.get("session")
    if session is None and event["type"] == "session.update":
        _check_format(event.get("input_audio_format"), event.get("sample_rate"))
        return SessionUpdate(VLLM, _text(event.get("model"), "model"),
                             _text(event.get("language"), "language"),
                             _text(event.get("prompt"), "prompt"))
    if not isinstance(session, dict):
        raise EventError("session must be an object", "invalid_event", "session")
    audio_in = (session.get("audio") or {}).get("input") or {}
    if not isinstance(audio_in, dict):
        raise EventError("session.audio.input must be an object", "invalid_event", "session")
    _check_format(audio_in.get("format", session.get("input_audio_format")), None)
    transcription = audio_in.get("transcription", session.get("input_audio_transcription"))
    transcription = transcription or {}
    if not isinstance(transcription, dict):
        raise EventError("the session's transcription must be an object", "invalid_event",
                         "session")
    return SessionUpdate(OPENAI, _text(transcription.get("model"), "model"),
                         _text(transcription.get("language"), "language"),
                         _text(transcription.get("prompt"), "prompt"))


def decode_audio(event: dict[str, Any], max_bytes: int) -> np.ndarray:
    """The samples of an input_audio_buffer.append: strict base64 of PCM16, at most
    max_bytes once decoded, not empty."""
    audio = event.get("audio")
    if not isinstance(audio, str):
        raise EventError("input_audio_buffer.append needs `audio`: base64 PCM16",
                         "invalid_audio", "audio")
    too_big = EventError(f"audio chunk over {max_bytes} bytes of PCM16 "
                         "(--realtime-max-chunk-bytes); send smaller appends",
                         "invalid_audio", "audio")
    if len(audio) > (max_bytes + 2) // 3 * 4:
        raise too_big  # refused before it is decoded
    try:
        raw = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise EventError("audio is not valid base64", "invalid_audio", "audio") from None
    if len(raw) > max_bytes:
        raise too_big
    if not raw:
        raise EventError("Can't process empty audio.", "invalid_audio", "audio")
    try:
        return pcm16_samples(raw)
    except PCMError as exc:
        raise EventError(str(exc), "invalid_audio", "audio") from None


# -- server events -----------------------------------------------------------------------
def _event(kind: str, **body: Any) -> dict[str, Any]:
    return {"type": kind, "event_id": new_id("event_"), **body}


def session_created(s: Session) -> dict[str, Any]:
    return _event("session.created", id=s.id, created=s.created, session=s.describe())


def session_updated(s: Session) -> dict[str, Any]:
    return _event("session.updated", id=s.id, created=s.created, model=s.model,
                  session=s.describe())


def error(dialect: str, exc: EventError, event_id: str | None = None) -> dict[str, Any]:
    if dialect == VLLM:
        return {"type": "error", "error": exc.message, "code": exc.code}
    return _event("error", error={"type": "invalid_request_error", "code": exc.code,
                                  "message": exc.message, "param": exc.param,
                                  "event_id": event_id})


def committed(item_id: str, previous: str | None) -> dict[str, Any]:
    return _event("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous)


def cleared() -> dict[str, Any]:
    return _event("input_audio_buffer.cleared")


def delta(dialect: str, item_id: str, text: str) -> dict[str, Any]:
    if dialect == VLLM:
        return {"type": "transcription.delta", "delta": text}
    return _event("conversation.item.input_audio_transcription.delta", item_id=item_id,
                  content_index=0, delta=text)


def completed(dialect: str, item_id: str, text: str, prompt_tokens: int,
              completion_tokens: int) -> dict[str, Any]:
    total = prompt_tokens + completion_tokens
    if dialect == VLLM:
        return {"type": "transcription.done", "text": text,
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": total,
                          "completion_tokens": completion_tokens,
                          "prompt_tokens_details": None}}
    return _event("conversation.item.input_audio_transcription.completed", item_id=item_id,
                  content_index=0, transcript=text,
                  usage={"type": "tokens", "input_tokens": prompt_tokens,
                         "output_tokens": completion_tokens, "total_tokens": total})
