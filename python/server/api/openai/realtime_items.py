"""One realtime item's windows through the engine: the decoder prompt the upload route
would build, and the text of each window as deltas that join as the upload joins windows.

An item is what a commit ends. Its language is the session's, or detected on its first
window (as an upload's on its first); its prompt is the session's `prompt`, its tail
tokenized as the upload route tokenizes a request's. Each window is one engine request
(transcribe_window); its text is written with the first window's leading space dropped, one
separator between windows, and trailing space held back until text follows it, so the
deltas concatenate to exactly `windows.join_texts` of the windows' texts: the upload's text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from server.api.openai.realtime_protocol import Session
from server.state import ServerState

if TYPE_CHECKING:
    from server.audio.prepare import AudioFrontend


@dataclass
class Item:
    """One committed stretch of audio and its transcript so far."""

    id: str
    previous: str | None
    language: str | None
    prompt: str
    windows: int = 0
    wrote: bool = False  # text written by an earlier window
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    dropped: bool = False  # cleared: its windows are skipped, it completes nothing
    prompt_ids: list[int] = field(default_factory=list)


def _params(srv: ServerState, model: str) -> tuple[Any, Any]:
    """The model's special tokens, and the upload route's default sampling (greedy)."""
    from server.api.openai.audio_form import SpeechRequest, sampling_params
    from server.frontend.transcription import whisper_tokens

    toks = whisper_tokens(srv)
    req = SpeechRequest(task="transcribe", model=model, language=None, prompt="",
                        response_format="json", temperature=0.0, stream=True,
                        include_usage=False, continuous_usage=False)
    return toks, sampling_params(srv, req, toks.max_decoder_len)


async def _prompt(srv: ServerState, item: Item, toks: Any, features: np.ndarray,
                  rid: str) -> None:
    from server.api.openai.audio import PROMPT_TAIL_CHARS
    from server.frontend.transcription import language_detect

    if item.language is None:
        item.language = (await language_detect(srv, features, f"{rid}-lang")).code
    previous = None
    if item.prompt.strip():
        tail = item.prompt.strip()[-PROMPT_TAIL_CHARS:]
        previous = srv.tokenizer.encode(" " + tail, add_special_tokens=False)
    item.prompt_ids = toks.prompt(language=item.language, task="transcribe",
                                  timestamps=False, previous=previous)


async def transcribe(srv: ServerState, frontend: AudioFrontend, session: Session, item: Item,
                     samples: np.ndarray) -> AsyncIterator[str]:
    """The next window of `item`: its text deltas, the item's text and usage kept up.
    Raises the engine's APIError or ServiceFailure; leaving early aborts the window."""
    from server.audio.windows import NO_SPACE_LANGUAGES
    from server.frontend.transcription import transcribe_window

    toks, params = _params(srv, session.model or "")
    features = await frontend.features(samples, toks.n_mels)
    rid = f"realtime-{session.id}-{item.id}-{item.windows}"
    item.windows += 1
    if not item.prompt_ids:
        await _prompt(srv, item, toks, features, rid)
    item.prompt_tokens += len(item.prompt_ids)
    sep = "" if item.language in NO_SPACE_LANGUAGES else " "
    started, held_space = False, ""
    async with aclosing(transcribe_window(srv, rid, features, item.prompt_ids,
                                          params)) as deltas:
        async for d in deltas:
            item.completion_tokens += len(d.token_ids)
            text = d.text
            if not started:
                text = text.lstrip()
                if not text:
                    continue
                text = (sep if item.wrote else "") + text
                started = item.wrote = True
            text = held_space + text
            body = text.rstrip()
            held_space = text[len(body):]
            if body:
                item.text += body
                yield body
