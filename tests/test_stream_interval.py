"""stream_interval in the tokenizer actor's books (actors.runtime.request.Choice): the first
output and the finish go out at once, the rest in updates of at least `interval` tokens,
and nothing held back is lost (merged in order, also into an abort's end)."""

from __future__ import annotations

from actors.runtime.outbox import ChoiceUpdate
from actors.runtime.request import Choice


def step(token: int, finish: str | None = None) -> ChoiceUpdate:
    return ChoiceUpdate(0, text=f"<{token}>", token_ids=[token], finish_reason=finish)


def pushed(interval: int, steps: list[ChoiceUpdate]) -> list[ChoiceUpdate]:
    choice = Choice(index=0, outbox_index=0)
    out = []
    for u in steps:
        got = choice.gather(u, interval)
        if got is not None:
            out.append(got)
    assert choice.held is None or steps[-1].finish_reason is None
    return out


def test_first_then_every_interval_then_the_finish():
    steps = [step(t) for t in range(10)] + [step(10, "length")]
    text = "".join(u.text for u in steps)  # before: held updates take the next ones in
    out = pushed(4, steps)
    assert [u.token_ids for u in out] == [[0], [1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    assert out[-1].finish_reason == "length"
    assert "".join(u.text for u in out) == text


def test_interval_one_holds_nothing():
    steps = [step(t) for t in range(5)]
    assert [u.token_ids for u in pushed(1, steps)] == [[t] for t in range(5)]


def test_a_step_of_many_tokens_goes_out_whole():
    big = ChoiceUpdate(0, text="abc", token_ids=[1, 2, 3])
    out = pushed(2, [step(0), big, step(4)])
    assert [u.token_ids for u in out] == [[0], [1, 2, 3]]


def test_an_end_from_outside_carries_what_was_held():
    choice = Choice(index=0, outbox_index=3)
    assert choice.gather(step(0), 8) is not None
    assert choice.gather(step(1), 8) is None
    assert choice.gather(step(2), 8) is None
    end = choice.ending("abort")
    assert end.token_ids == [1, 2] and end.text == "<1><2>" and end.finish_reason == "abort"
    assert choice.held is None
    assert Choice(index=0, outbox_index=3).ending("abort").token_ids == []
