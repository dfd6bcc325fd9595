"""Speech to text on the generation service: one 30 s audio window in, its decoder tokens out.

The seam between the audio front end (decoding, resampling, log-mel features, windows,
the /v1/audio/* routes and their formats) and the Whisper model in the engine. The front
end computes the features and the decoder prompt; everything here is model-side:

    toks = whisper_tokens(srv)                      # the special token ids (WhisperTokens)
    lang = await language_detect(srv, features)     # when the request names no language
    prompt = toks.prompt(language=lang.code, task="transcribe", timestamps=False,
                         previous=prev_text_ids)
    async for delta in transcribe_window(srv, request_id, features, prompt, params):
        ...  # WindowDelta: token_ids (new, in order), text, finish_reason on the last one

``features`` is float32 numpy [n_mels, 3000] (``toks.n_mels``: 80, or 128 for large-v3),
the log-mel of one window padded to 30 s as Whisper's front end pads. Each window is one
engine request: the engine batches the encoder of all new windows in one step and their
decoder steps with every other running window; admission, metrics, disconnect-abort and
drain are the generation service's, as for chat. ``params`` is a SamplingParams
(temperature 0 = greedy; ``max_tokens`` None = up to the decoder's 448 positions); the
model's suppress_tokens and begin_suppress_tokens are applied by the engine, and decoding
stops at <|endoftext|>. When the prompt asks for timestamps (no <|notimestamps|>), the
engine applies Whisper's timestamp rules (the first token a timestamp <= 1.0 s, pairs
between segments, never decreasing: actors.models.whisper_rules.py) and the token
ids include the timestamp tokens (>= ``toks.timestamp_begin``: t seconds is
timestamp_begin + round(t / 0.02), relative to the window's start); ``text`` is the tokens
decoded without special tokens (timestamps among those), for callers that need none.

Errors: APIError 400 for features of the wrong shape or dtype, or a decoder prompt out of
bounds; the generation service's ServiceFailure (server.frontend.failures: Refused for a
prompt the model cannot take, Unavailable when the server is full or not serving) at
admission, and the failure that ends a window after it. Leaving the iterator early
(aclosing) aborts the window.
On a server whose model is not Whisper, every function here raises APIError 400.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np
from actors.params.encoder import EncoderInput
from actors.params.sampling import SamplingParams
from actors.runtime.request import PromptInput

from server.errors import APIError, bad_request
from server.frontend import service
from server.frontend.context import context_of
from server.frontend.service import ChoiceDelta, Failed, Finished
from server.state import ServerState

__all__ = ["DetectedLanguage", "WhisperTokens", "WindowDelta", "language_detect",
           "transcribe_window", "whisper_tokens"]

N_FRAMES = 3000  # one 30 s window of 10 ms frames
MAX_DECODER_LEN = 448


@dataclass(frozen=True, slots=True)
class WhisperTokens:
    """The special token ids of the served Whisper model's tokenizer."""

    sot: int  # <|startoftranscript|>
    eot: int  # <|endoftext|>
    transcribe: int
    translate: int
    notimestamps: int
    timestamp_begin: int  # <|0.00|>; timestamp t is timestamp_begin + round(t / 0.02)
    sot_prev: int  # <|startofprev|>: precedes previous-text prompt tokens
    languages: dict[str, int]  # "en" -> <|en|> ..., empty on an English-only model
    n_mels: int
    max_decoder_len: int = MAX_DECODER_LEN

    @property
    def multilingual(self) -> bool:
        return bool(self.languages)

    def language_of(self, token_id: int) -> str | None:
        for code, tid in self.languages.items():
            if tid == token_id:
                return code
        return None

    def prompt(self, language: str | None = None, task: str = "transcribe",
               timestamps: bool = False, previous: list[int] | None = None) -> list[int]:
        """The decoder prompt: [<|startofprev|> previous...] <|startoftranscript|>
        [<|lang|> <|task|>] [<|notimestamps|>]. ``previous`` (text token ids of the prior
        window or the request's prompt) is cut to its last 223 tokens, as Whisper does.
        An English-only model takes no language or task tokens (it only transcribes
        English). Raises APIError 400 for an unknown language or task."""
        out: list[int] = []
        if previous:
            out += [self.sot_prev, *previous[-(self.max_decoder_len // 2 - 1):]]
        out.append(self.sot)
        if task not in ("transcribe", "translate"):
            raise bad_request(f"task must be transcribe or translate, got {task!r}", "task")
        if self.multilingual:
            lang = language or "en"
            if lang not in self.languages:
                raise bad_request(f"Unsupported language {lang!r} for this model.",
                                  "language")
            out += [self.languages[lang],
                    self.transcribe if task == "transcribe" else self.translate]
        elif task == "translate":
            raise bad_request("This model is English-only and cannot translate.", "task")
        if not timestamps:
            out.append(self.notimestamps)
        return out


@dataclass(frozen=True, slots=True)
class WindowDelta:
    """New tokens of a window, in order; ``finish_reason`` ("stop": <|endoftext|>, which
    is not among the token ids; "length": max_tokens or the decoder's 448 positions;
    "abort") on the last."""

    token_ids: list[int]
    text: str
    finish_reason: str | None


@dataclass(frozen=True, slots=True)
class DetectedLanguage:
    code: str  # "en", "de" ...
    token_id: int
    probability: float  # of the language token, among all tokens after <|startoftranscript|>


def whisper_tokens(srv: ServerState) -> WhisperTokens:
    """The served model's special token ids (APIError 400 if it is not Whisper)."""
    vocab_size = srv.limits.vocab_size if srv.limits is not None else 0
    return _tokens_of(srv.tokenizer, vocab_size)


@lru_cache(maxsize=4)
def _tokens_of(tokenizer: Any, vocab_size: int) -> WhisperTokens:
    vocab = tokenizer.get_vocab() if tokenizer is not None else {}
    if "<|startoftranscript|>" not in vocab:
        raise bad_request("The model does not support Transcriptions API")
    langs: dict[str, int] = {}
    # Language tokens sit between <|startoftranscript|> and <|translate|>: <|en|> <|zh|>
    # ... An English-only model (vocabulary 51864, as Whisper tells them apart) has them
    # in its tokenizer too, but was never trained on them.
    end = vocab.get("<|translate|>")
    if end is not None and vocab_size >= 51865:
        by_id = {i: t for t, i in vocab.items()}
        for i in range(vocab["<|startoftranscript|>"] + 1, end):
            t = by_id.get(i, "")
            if t.startswith("<|") and t.endswith("|>"):
                langs[t[2:-2]] = i
    n_mels = 128 if vocab.get("<|yue|>") is not None else 80  # large-v3 added <|yue|>
    return WhisperTokens(
        sot=vocab["<|startoftranscript|>"], eot=vocab["<|endoftext|>"],
        transcribe=vocab["<|transcribe|>"], translate=vocab["<|translate|>"],
        notimestamps=vocab["<|notimestamps|>"],
        timestamp_begin=vocab["<|notimestamps|>"] + 1,
        sot_prev=vocab["<|startofprev|>"], languages=langs, n_mels=n_mels)


def _encoder_input(toks: WhisperTokens, features: np.ndarray) -> EncoderInput:
    f = np.asarray(features)
    if f.dtype != np.float32 or f.shape != (toks.n_mels, N_FRAMES):
        raise bad_request(f"audio features must be float32 [{toks.n_mels}, {N_FRAMES}], got "
                          f"{f.dtype} {list(f.shape)}", "file")
    if not np.isfinite(f).all():
        raise bad_request("audio features hold NaN or infinity", "file")
    return EncoderInput(np.ascontiguousarray(f))


async def transcribe_window(srv: ServerState, request_id: str, features: np.ndarray,
                            prompt_token_ids: list[int], params: SamplingParams
                            ) -> AsyncIterator[WindowDelta]:
    """Decodes one window: admitted like any generation (its ServiceFailure before the
    first delta), then its deltas as the engine produces them. Use under contextlib.aclosing:
    leaving early aborts the window in the engine (its cross-attention K/V is freed)."""
    toks = whisper_tokens(srv)
    enc = _encoder_input(toks, features)
    if not prompt_token_ids or len(prompt_token_ids) >= toks.max_decoder_len:
        raise bad_request(f"the decoder prompt must hold 1 to {toks.max_decoder_len - 1} "
                          f"tokens, got {len(prompt_token_ids)}", "prompt")
    if params.n != 1:
        params = replace(params, n=1)
    gen = await service.start(context_of(srv), request_id,
                              [PromptInput(token_ids=list(prompt_token_ids))], params,
                              encoder_input=enc)
    async with contextlib.aclosing(gen.stream()) as events:
        async for ev in events:
            if isinstance(ev, ChoiceDelta):
                ids = list(ev.token_ids)
                if ev.finish_reason == "stop" and ids and ids[-1] == toks.eot:
                    ids.pop()  # the end is the finish reason, not a transcript token
                if ids or ev.finish_reason is not None:
                    yield WindowDelta(ids, ev.text, ev.finish_reason)
            elif isinstance(ev, Failed):
                raise ev.failure
            elif isinstance(ev, Finished):
                return


async def language_detect(srv: ServerState, features: np.ndarray,
                          request_id: str = "lang-detect") -> DetectedLanguage:
    """The most likely language of a window: one decoder step after <|startoftranscript|>,
    drawn greedily among the language tokens (a batched engine request like any other).
    An English-only model answers "en" without running."""
    toks = whisper_tokens(srv)
    if not toks.multilingual:
        return DetectedLanguage("en", -1, 1.0)
    allowed = tuple(toks.languages.values())
    params = SamplingParams(temperature=0.0, max_tokens=1, allowed_token_ids=allowed,
                            logprobs=1, skip_special_tokens=False)
    enc = _encoder_input(toks, features)
    gen = await service.start(context_of(srv), request_id, [PromptInput(token_ids=[toks.sot])],
                              params, encoder_input=enc)
    result = await gen.collect()
    choice = result.choices[0]
    if not choice.token_ids:
        raise APIError(500, "language detection drew no token")
    tid = choice.token_ids[0]
    lp = choice.logprobs[0].logprob if len(choice.logprobs) else 0.0
    return DetectedLanguage(toks.language_of(tid) or "en", tid, math.exp(lp))
