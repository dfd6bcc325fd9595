"""The speech-to-text routes' form and upload (api/openai/audio.py): every text field
checked in vLLM's order before any audio is decoded (a 400 naming the field), the sampling
fields onto SamplingParams, the multipart upload read within its own size limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio
from quart import request
from werkzeug.datastructures import FileStorage, MultiDict
from werkzeug.exceptions import RequestEntityTooLarge

from actors.errors import RequestRefused
from actors.params.sampling import SamplingParams
from server.api.http_io import check_model
from server.errors import APIError, bad_request
from server.state import ServerState

if TYPE_CHECKING:
    from server.audio.prepare import AudioFrontend

RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
TIMED_FORMATS = frozenset({"verbose_json", "srt", "vtt"})
# Fields that would change the output and are not implemented, refused by name.
_UNSUPPORTED = {"use_beam_search": "beam search", "hotwords": "hotwords"}


# -- the form ----------------------------------------------------------------------------
@dataclass
class SpeechRequest:
    task: str  # transcribe | translate
    model: str
    language: str | None
    prompt: str
    response_format: str
    temperature: float
    stream: bool
    include_usage: bool
    continuous_usage: bool
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None

    @property
    def timestamps(self) -> bool:
        return self.response_format in TIMED_FORMATS


def _bool(form: MultiDict, name: str) -> bool:
    raw = form.get(name)
    if raw is None or raw == "":
        return False
    value = raw.strip().lower()
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    raise bad_request(f"{name} must be true or false, got {raw[:50]!r}", name)


def _number(form: MultiDict, name: str, kind: type[int] | type[float]) -> Any:
    raw = form.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = kind(raw.strip())
    except ValueError:
        raise bad_request(f"{name} must be {'an integer' if kind is int else 'a number'}, "
                          f"got {raw[:50]!r}", name) from None
    if kind is float and not math.isfinite(value):
        raise bad_request(f"{name} must be a finite number", name)
    return value


def parse_form(srv: ServerState, form: MultiDict, task: str) -> SpeechRequest:
    """Every field check that needs neither the audio nor the model, in vLLM's order."""
    for name, what in _UNSUPPORTED.items():
        if form.get(name) and form.get(name, "").strip().lower() not in ("false", "0"):
            raise bad_request(f"{what} is not supported by this server yet", name)
    model = check_model(srv, form.get("model") or None)
    fmt = (form.get("response_format") or "json").strip()
    if fmt not in RESPONSE_FORMATS:
        allowed = ", ".join(RESPONSE_FORMATS)
        raise bad_request(f"response_format must be one of {allowed}, got {fmt[:50]!r}"
                          + (" (diarization needs a diarizing model)"
                             if fmt == "diarized_json" else ""), "response_format")
    grains = form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities")
    for grain in grains:
        if grain not in ("segment", "word"):
            raise bad_request(f"timestamp_granularities[] takes segment or word, got "
                              f"{grain[:50]!r}", "timestamp_granularities[]")
        if grain == "word":
            raise bad_request("word timestamps are not supported by this server yet; "
                              "segment timestamps are", "timestamp_granularities[]")
    stream = _bool(form, "stream")
    include_usage = _bool(form, "stream_include_usage")
    continuous = _bool(form, "stream_continuous_usage_stats")
    if not stream and (include_usage or continuous):
        raise bad_request("Stream options can only be defined when `stream=True`.",
                          "stream_include_usage" if include_usage
                          else "stream_continuous_usage_stats")
    if stream and fmt in TIMED_FORMATS:
        raise bad_request(f"{fmt} format doesn't support streaming case", "response_format")
    language = (form.get("language") or "").strip().lower() or None
    to_language = (form.get("to_language") or "").strip().lower() or None
    if task == "translate" and to_language not in (None, "en"):
        raise bad_request("Whisper translates into English only: to_language must be en",
                          "to_language")
    if task == "transcribe" and to_language not in (None, language):
        raise bad_request("a transcription stays in the audio's language; use "
                          "/v1/audio/translations for English", "to_language")
    n = _number(form, "n", int)
    if n not in (None, 1):
        raise bad_request("n other than 1 is not supported by this server yet", "n")
    temperature = _number(form, "temperature", float)
    sampling = {name: value for name, kind in (
        ("top_p", float), ("top_k", int), ("min_p", float), ("seed", int),
        ("frequency_penalty", float), ("presence_penalty", float),
        ("repetition_penalty", float)) if (value := _number(form, name, kind)) is not None}
    return SpeechRequest(
        task=task, model=model, language=language, prompt=form.get("prompt") or "",
        response_format=fmt, temperature=0.0 if temperature is None else temperature,
        stream=stream, include_usage=include_usage, continuous_usage=continuous,
        sampling=sampling, max_tokens=_number(form, "max_completion_tokens", int))


def sampling_params(srv: ServerState, req: SpeechRequest, positions: int) -> SamplingParams:
    """As vLLM's: temperature 0 (greedy) unless asked; max_tokens up to the decoder's
    positions, fewer if max_completion_tokens says so (more is capped, not refused: the
    audio, not the client, decides how long a transcript is)."""
    max_tokens = None if req.max_tokens is None else min(req.max_tokens, positions - 1)
    params = SamplingParams(temperature=req.temperature, max_tokens=max_tokens,
                            **req.sampling)
    assert srv.limits is not None
    try:
        params.validate(srv.limits)
    except RequestRefused as exc:
        if exc.param == "max_tokens":  # the form's name for it
            raise bad_request(exc.message.replace("max_tokens", "max_completion_tokens"),
                              "max_completion_tokens") from None
        raise bad_request(exc.message, exc.param) from None
    return params


# -- the upload --------------------------------------------------------------------------
async def read_upload(frontend: AudioFrontend) -> tuple[MultiDict, bytes]:
    """The form's fields and the file's bytes; 400s naming `file` for a missing file or an
    upload over the limit (the rest of the body is left unread: the connection closes)."""
    ctype = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if ctype != "multipart/form-data":
        raise bad_request("the request body must be multipart/form-data with the audio in "
                          "`file`", "file")
    limit = frontend.limits.max_upload_bytes
    try:
        form = await request.form
        files = await request.files
    except RequestEntityTooLarge:
        # The whole body passed the upload limit, or one text field passed Quart's
        # MAX_FORM_MEMORY_SIZE (500 KB): either way the audio is what the client resizes.
        raise APIError(400, f"the request is larger than the limit: the file may be at most "
                       f"{limit / 2**20:g} MB (VLLM_MAX_AUDIO_CLIP_FILESIZE_MB) and each "
                       "text field 500 KB", param="file",
                       headers={"Connection": "close"}) from None
    upload: FileStorage | None = files.get("file")
    if upload is None:
        if "file" in form:
            raise bad_request("file must be an uploaded file, not a text field", "file")
        raise bad_request("file is required: the audio to transcribe", "file")
    stream = upload.stream
    size = stream.seek(0, 2)
    if size > limit:
        raise bad_request(f"the file is {size / 2**20:.1f} MB; the limit is "
                          f"{limit / 2**20:g} MB (VLLM_MAX_AUDIO_CLIP_FILESIZE_MB)", "file")
    stream.seek(0)
    data = await trio.to_thread.run_sync(stream.read)  # a spooled file: on disk past 500 KB
    return form, data
