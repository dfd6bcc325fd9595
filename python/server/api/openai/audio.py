"""POST /v1/audio/transcriptions and /v1/audio/translations: OpenAI's speech-to-text routes,
with vLLM's extensions (streaming, sampling fields), on a Whisper server.

A request is multipart/form-data: the audio `file` and text fields. The fields are checked
first (a 400 naming the field, before any audio is decoded), then the upload is decoded,
split into 30 s windows and turned into log-mel features off the event loop
(server.audio.prepare), the language detected on the first window when the request names
none, and every window decoded as one engine request (server.frontend.transcription).
Windows of a whole response run concurrently (at most WINDOWS_IN_FLIGHT per request, so a
10-minute upload does not take 20 admission slots at once); a stream decodes them in
order, so its deltas arrive in the order of the audio.

Where this differs from vLLM 0.33, which answers srt and vtt with a 400, takes `word`
timestamps and returns no words, returns JSON for `text`, and counts only the last
window's prompt in a stream's usage: srt and vtt are served from the windows' timestamp
tokens, `word` is a 400, `text` is plain text, and usage counts every window.

On a server whose model is not Whisper, these routes are not mounted (404), as vLLM
mounts them only for a model with the transcription task.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import trio
from quart import Quart, Response, request
from werkzeug.datastructures import FileStorage, MultiDict
from werkzeug.exceptions import RequestEntityTooLarge

from actors.errors import RequestRefused
from actors.params.sampling import SamplingParams
from server import sse
from server.api.http_io import check_model, json_response
from server.audio import MISSING_EXTRA, missing_packages
from server.errors import APIError, bad_request
from server.generation import new_request_id
from server.state import ServerState

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup
if TYPE_CHECKING:
    from server.audio.prepare import AudioFrontend, PreparedAudio

TRANSCRIPTIONS = "/v1/audio/transcriptions"
TRANSLATIONS = "/v1/audio/translations"
RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
TIMED_FORMATS = frozenset({"verbose_json", "srt", "vtt"})
WINDOWS_IN_FLIGHT = 4
# The form's text fields beside the file (a prompt, a few numbers): the body may exceed the
# upload limit by this much before it is refused unread.
FORM_FIELDS_BYTES = 1024 * 1024
# Whisper reads at most the last 223 tokens of a prompt; only its tail is tokenized (on
# the event loop), which holds them in every language.
PROMPT_TAIL_CHARS = 2000
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


def upload_request_class(base: type, paths: frozenset[str], limit: int) -> type:
    """`base` with a larger body limit on `paths`: Quart fixes a request's limit when it
    is created, from MAX_CONTENT_LENGTH (--max-body-bytes), which fits JSON bodies, not
    25 MB of audio."""

    class UploadRequest(base):  # type: ignore[valid-type, misc]
        def __init__(self, method: str, scheme: str, path: str, *args: Any,
                     max_content_length: int | None = None, **kwargs: Any) -> None:
            bigger = path in paths and max_content_length is not None
            if bigger:
                max_content_length = max(max_content_length, limit)  # type: ignore[type-var]
            super().__init__(method, scheme, path, *args,
                             max_content_length=max_content_length, **kwargs)
            if bigger:
                self.max_content_length = max_content_length  # the form parser's bound

    return UploadRequest


# -- decoding the windows ----------------------------------------------------------------
@dataclass
class WindowResult:
    token_ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)


@dataclass
class Job:
    """One request's audio, ready for the engine."""

    srv: ServerState
    request_id: str
    req: SpeechRequest
    prepared: PreparedAudio
    prompt_ids: list[int]
    params: SamplingParams
    language: str

    def window_id(self, i: int) -> str:
        return self.request_id if len(self.prepared.windows) == 1 else f"{self.request_id}-{i}"

    async def deltas(self, i: int) -> AsyncIterator[Any]:
        from server.frontend.transcription import transcribe_window

        async with aclosing(transcribe_window(self.srv, self.window_id(i),
                                              self.prepared.features[i], self.prompt_ids,
                                              self.params)) as deltas:
            async for delta in deltas:
                yield delta

    async def collect(self) -> list[WindowResult]:
        results = [WindowResult() for _ in self.prepared.windows]
        limiter = trio.CapacityLimiter(WINDOWS_IN_FLIGHT)

        async def one(i: int) -> None:
            async with limiter:
                async for delta in self.deltas(i):
                    results[i].token_ids += delta.token_ids
                    results[i].text.append(delta.text)

        # The first failure (an APIError) cancels the other windows and is the answer.
        try:
            async with trio.open_nursery() as nursery:
                for i in range(len(results)):
                    nursery.start_soon(one, i)
        except BaseExceptionGroup as group:
            raise _first_api_error(group) from None
        return results


def _first_api_error(group: BaseExceptionGroup) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first_api_error(exc)
        if isinstance(exc, APIError):
            return exc
    return group


async def prepare_job(srv: ServerState, frontend: AudioFrontend, req: SpeechRequest,
                      data: bytes) -> Job:
    from server.audio.decode import AudioInputError
    from server.frontend.transcription import language_detect, whisper_tokens

    toks = whisper_tokens(srv)
    if req.language is not None and toks.multilingual and req.language not in toks.languages:
        raise bad_request(f"Unsupported language {req.language[:20]!r}; this model knows "
                          f"{', '.join(sorted(toks.languages))}", "language")
    if not toks.multilingual and req.language not in (None, "en"):
        raise bad_request("this model is English-only: language must be en", "language")
    if not toks.multilingual and req.task == "translate":
        raise bad_request("this model is English-only and cannot translate", "model")
    params = sampling_params(srv, req, toks.max_decoder_len)
    try:
        prepared = await frontend.prepare(data, toks.n_mels)
    except AudioInputError as exc:
        raise bad_request(exc.message, exc.param) from None
    rid = new_request_id(request.headers.get("X-Request-Id"), None)
    language = req.language
    if language is None:
        language = (await language_detect(srv, prepared.features[0], f"{rid}-lang")).code
    previous = None
    if req.prompt.strip():
        tail = req.prompt.strip()[-PROMPT_TAIL_CHARS:]
        previous = srv.tokenizer.encode(" " + tail, add_special_tokens=False)
    prompt_ids = toks.prompt(language=language, task=req.task, timestamps=req.timestamps,
                             previous=previous)
    if params.max_tokens is not None:
        room = max(1, toks.max_decoder_len - len(prompt_ids))
        params = replace(params, max_tokens=min(params.max_tokens, room))
    return Job(srv, f"{req.task}-{rid}", req, prepared, prompt_ids, params, language)


# -- responses ---------------------------------------------------------------------------
def _text_of(results: list[WindowResult], language: str) -> str:
    from server.audio.windows import join_texts

    return join_texts(["".join(r.text) for r in results], language)


def _segments(job: Job, results: list[WindowResult]) -> list[Any]:
    from server.audio.segments import window_segments
    from server.frontend.transcription import whisper_tokens

    toks = whisper_tokens(job.srv)
    tokenizer = job.srv.tokenizer

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    out = []
    for window, result in zip(job.prepared.windows, results):
        # Text tokens and timestamps (the engine's timestamp rules open a window with one;
        # text before any is timed from the window's start).
        ids = [t for t in result.token_ids if t < toks.eot or t >= toks.timestamp_begin]
        out += window_segments(ids, timestamp_begin=toks.timestamp_begin, decode=decode,
                               offset_s=window.start_s, duration_s=window.duration_s,
                               temperature=job.req.temperature)
    return out


def whole_response(job: Job, results: list[WindowResult]) -> Response:
    from server.audio.segments import to_srt, to_vtt, usage_seconds

    req = job.req
    duration = job.prepared.duration_s
    fmt = req.response_format
    if fmt == "text":
        return Response(_text_of(results, job.language) + "\n",
                        mimetype="text/plain; charset=utf-8")
    usage = {"type": "duration", "seconds": usage_seconds(duration)}
    if fmt == "json":
        body: dict[str, Any] = {"text": _text_of(results, job.language)}
        if req.task == "transcribe":  # as vLLM: a translation reports no usage
            body["usage"] = usage
        return json_response(body)
    segments = _segments(job, results)
    if fmt == "srt":
        return Response(to_srt(segments), mimetype="text/plain; charset=utf-8")
    if fmt == "vtt":
        return Response(to_vtt(segments), mimetype="text/vtt; charset=utf-8")
    verbose = {
        "task": req.task,
        "language": job.language,
        "duration": round(duration, 3),
        "text": _text_of(results, job.language),
        "segments": [s.verbose(i) for i, s in enumerate(segments)],
    }
    if req.task == "transcribe":
        verbose["usage"] = usage
    return json_response(verbose)


async def first_window(job: Job) -> tuple[AsyncIterator[Any], list[Any]]:
    """The first window's deltas, admitted before the response starts (so that a full
    server is a 503 and a refused prompt a 400, not an error event after a 200): the open
    iterator and what it has yielded so far."""
    deltas = job.deltas(0)
    try:
        return deltas, [await deltas.__anext__()]
    except StopAsyncIteration:
        return deltas, []


async def _window(job: Job, i: int, opened: tuple[AsyncIterator[Any], list[Any]] | None
                  ) -> AsyncIterator[Any]:
    if opened is None:
        async for delta in job.deltas(i):
            yield delta
        return
    deltas, head = opened
    async with aclosing(deltas):  # type: ignore[type-var]
        for delta in head:
            yield delta
        async for delta in deltas:
            yield delta


async def stream_body(job: Job, opened: tuple[AsyncIterator[Any], list[Any]]
                      ) -> AsyncIterator[bytes]:
    """vLLM's stream: `transcription.chunk` (or `translation.chunk`) events whose one choice
    carries a text delta, finish_reason on each window's last; usage per chunk with
    stream_continuous_usage_stats and in a last, choice-less chunk with
    stream_include_usage; errors as an error event; then [DONE]. Windows in order, the
    first one already admitted (first_window)."""
    from server.audio.windows import NO_SPACE_LANGUAGES

    req = job.req
    kind = "transcription" if req.task == "transcribe" else "translation"
    head = {"id": job.request_id, "object": f"{kind}.chunk", "created": int(time.time()),
            "model": req.model}
    separator = "" if job.language in NO_SPACE_LANGUAGES else " "
    prompt_tokens = completion_tokens = 0

    def usage() -> dict[str, int]:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    try:
        wrote_text = False
        for i in range(len(job.prepared.windows)):
            prompt_tokens += len(job.prompt_ids)
            started = False
            async for delta in _window(job, i, opened if i == 0 else None):
                completion_tokens += len(delta.token_ids)
                text = delta.text
                if not started and text.strip():
                    text = (separator if wrote_text else "") + text.lstrip()
                    started = wrote_text = True
                elif not started:
                    text = ""
                if not text and delta.finish_reason is None:
                    continue
                choice: dict[str, Any] = {"delta": {"content": text}}
                if delta.finish_reason is not None:
                    choice["finish_reason"] = delta.finish_reason
                    choice["stop_reason"] = None
                chunk: dict[str, Any] = {**head, "choices": [choice]}
                if req.continuous_usage and req.include_usage:
                    chunk["usage"] = usage()
                yield sse.event(chunk)
        if req.include_usage:
            yield sse.event({**head, "choices": [], "usage": usage()})
    except APIError as exc:
        yield sse.error_event(exc.status, exc.message)
    yield sse.DONE


# -- the routes --------------------------------------------------------------------------
async def handle(srv: ServerState, frontend: AudioFrontend, task: str) -> Response:
    missing = missing_packages()
    if missing:
        raise APIError(501, f"{MISSING_EXTRA}; missing: {', '.join(missing)}")
    form, data = await read_upload(frontend)
    req = parse_form(srv, form, task)
    job = await prepare_job(srv, frontend, req, data)
    if req.stream:
        return sse.sse_response(stream_body(job, await first_window(job)))
    return whole_response(job, await job.collect())


def register(app: Quart, srv: ServerState) -> None:
    from actors.loader.whisper import is_transcription_model

    if not is_transcription_model(srv.config.model):
        return
    from server.audio.prepare import AudioFrontend

    frontend = AudioFrontend()  # the limits from VLLM_MAX_AUDIO_* (ValueError at start)
    limit = frontend.limits.max_upload_bytes + FORM_FIELDS_BYTES
    app.request_class = upload_request_class(app.request_class,
                                             frozenset({TRANSCRIPTIONS, TRANSLATIONS}), limit)

    @app.post(TRANSCRIPTIONS)
    async def v1_audio_transcriptions() -> Response:
        return await handle(srv, frontend, "transcribe")

    @app.post(TRANSLATIONS)
    async def v1_audio_translations() -> Response:
        return await handle(srv, frontend, "translate")
