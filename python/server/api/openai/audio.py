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
mounts them only for a model with the transcription task; nor is WS /v1/realtime
(server.api.openai.realtime), mounted here beside them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import trio
from actors.params.sampling import SamplingParams
from quart import Quart, Response, request

from server import sse
from server.api.http_io import json_response, upload_request_class
from server.api.openai.audio_form import SpeechRequest, parse_form, read_upload, sampling_params
from server.audio import MISSING_EXTRA, missing_packages
from server.errors import APIError, api_error_of_failure, bad_request
from server.frontend.failures import ServiceFailure
from server.frontend.generation import new_request_id
from server.state import ServerState

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup
if TYPE_CHECKING:
    from server.audio.prepare import AudioFrontend, PreparedAudio

TRANSCRIPTIONS = "/v1/audio/transcriptions"
TRANSLATIONS = "/v1/audio/translations"
WINDOWS_IN_FLIGHT = 4
# The form's text fields beside the file (a prompt, a few numbers): the body may exceed the
# upload limit by this much before it is refused unread.
FORM_FIELDS_BYTES = 1024 * 1024
# Whisper reads at most the last 223 tokens of a prompt; only its tail is tokenized (on
# the event loop), which holds them in every language.
PROMPT_TAIL_CHARS = 2000


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

        # The first failure (an APIError or ServiceFailure) cancels the other windows and
        # is the answer.
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
        if isinstance(exc, (APIError, ServiceFailure)):
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
    except (APIError, ServiceFailure) as exc:
        error = api_error_of_failure(exc) if isinstance(exc, ServiceFailure) else exc
        yield sse.error_event(error.status, error.message)
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

    from server.api.openai import realtime

    realtime.register(app, srv, frontend)

    @app.post(TRANSCRIPTIONS)
    async def v1_audio_transcriptions() -> Response:
        return await handle(srv, frontend, "transcribe")

    @app.post(TRANSLATIONS)
    async def v1_audio_translations() -> Response:
        return await handle(srv, frontend, "translate")
