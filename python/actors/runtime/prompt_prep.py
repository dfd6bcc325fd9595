"""Preparing prompts for the engine, in the tokenizer actor's worker thread: render, bound,
tokenize, check.

The tokenizer actor hands over every request waiting for it at once (a burst), and their
texts are tokenized together by one ``encode_batch`` per add_special_tokens value. That
call releases the GIL while it runs, where the Rust tokenizer's ``encode`` holds it (about
0.5 ms per 250-token prompt): with ``encode`` the event loop stood still while a burst was
tokenized, and with it the HTTP edge that was still parsing the rest of the burst. The
results are those of ``encode``, text for text.

Each request fails alone: its render, bound or check error (or an unexpected exception) is
its result, and the other requests of the batch go on. A batch whose encode_batch raises
is encoded again text by text, so the error lands on the request whose text caused it.
"""

from __future__ import annotations

from typing import Any

from actors.errors import PromptTooLong
from actors.params.embeds import PromptEmbeds
from actors.params.limits import RequestLimits
from actors.params.pooling import check_pooling_prompt
from actors.params.prompt import EMBEDS, check_prompt
from actors.runtime.prompt_bounds import PromptCharBound
from actors.runtime.request import PromptResult, RequestState

__all__ = ["PromptPreparer"]

Prepared = list[PromptResult] | Exception


class _Staged:
    """One prompt between render and check: its text (None for token ids), its ids (None
    until tokenized), or the error that refused it before tokenizing (raised in its turn,
    so a request's first bad prompt is the one reported, as when each was done whole)."""

    __slots__ = ("add_special_tokens", "embeds", "error", "ids", "text")

    def __init__(self, text: str | None = None, ids: list[int] | None = None,
                 add_special_tokens: bool = True, error: Exception | None = None,
                 embeds: PromptEmbeds | None = None) -> None:
        self.text, self.ids, self.add_special_tokens = text, ids, add_special_tokens
        self.error, self.embeds = error, embeds


class PromptPreparer:
    def __init__(self, backend: Any, prompt_bound: PromptCharBound, vocab_size: int) -> None:
        """backend: the Rust tokenizers.Tokenizer."""
        self._backend = backend
        self._bound = prompt_bound
        self._vocab_size = vocab_size

    def prepare_each(self, states: list[RequestState]) -> list[Prepared]:
        """Every request's prompts as the engine will run them, or what refused them (the
        checks of check_prompt, the offline LLM's too), in order."""
        staged = [self._render(state) for state in states]
        errors = self._encode([(i, s) for i, st in enumerate(staged) for s in st
                               if s.error is None and s.ids is None])
        return [errors.get(i) or self._checked(state, staged[i])
                for i, state in enumerate(states)]

    def _render(self, state: RequestState) -> list[_Staged]:
        """Each prompt's text or ids, up to the first that is refused untokenized."""
        staged = []
        for prompt in state.prompts:
            if prompt.embeds is not None:  # judged as its placeholder ids are
                staged.append(_Staged(ids=prompt.embeds.placeholder_ids(),
                                      embeds=prompt.embeds))
                continue
            if prompt.token_ids is not None:
                staged.append(_Staged(ids=list(prompt.token_ids)))
                continue
            try:
                text = prompt.text if prompt.render is None else prompt.render()
                too_long = None if state.params.truncate_prompt_tokens is not None else \
                    self._bound.error(text, state.max_model_len)
                if too_long is not None:  # cannot fit: refused without tokenizing
                    raise PromptTooLong(too_long, param="prompt")
            except Exception as exc:  # noqa: BLE001 - one request's failure is its own
                staged.append(_Staged(error=exc))
                break
            staged.append(_Staged(text, None, prompt.add_special_tokens))
        return staged

    def _encode(self, items: list[tuple[int, _Staged]]) -> dict[int, Exception]:
        """Fills in the ids of every staged text; returns the requests whose text failed."""
        errors: dict[int, Exception] = {}
        for special in (True, False):
            group = [(i, s) for i, s in items if s.add_special_tokens is special]
            if not group:
                continue
            try:
                encodings = self._backend.encode_batch([s.text for _, s in group],
                                                       add_special_tokens=special)
                for (_, s), enc in zip(group, encodings):
                    s.ids = enc.ids
            except Exception:  # noqa: BLE001 - find whose text it was
                for i, s in group:
                    try:
                        s.ids = self._backend.encode(s.text, add_special_tokens=special).ids
                    except Exception as exc:  # noqa: BLE001
                        errors.setdefault(i, exc)
        return errors

    def _checked(self, state: RequestState, staged: list[_Staged]) -> Prepared:
        limits = RequestLimits(vocab_size=self._vocab_size, max_model_len=state.max_model_len)
        results = []
        try:
            for s in staged:
                if s.error is not None:
                    raise s.error
                ids = s.ids
                assert ids is not None
                if s.embeds is not None:  # truncate_prompt_tokens cuts its rows alike
                    checked = check_prompt(ids, state.params, limits, EMBEDS)
                    results.append(PromptResult(checked, "", s.embeds.kept(
                        len(checked), state.params.truncation_side)))
                    continue
                checked = (check_prompt(ids, state.params, limits) if state.pooling is None
                           else check_pooling_prompt(ids, state.params, limits))
                text = s.text
                if text is None or checked is not ids:  # decoded once its ids are known good
                    text = self._backend.decode(checked, skip_special_tokens=False)
                results.append(PromptResult(checked, text))
        except Exception as exc:  # noqa: BLE001
            return exc
        return results
