"""The Outbox coalesces deltas for a slow reader and never blocks its producer."""

from __future__ import annotations

import pytest
import trio

from actors.errors import PromptTooLong
from actors.runtime.failures import ClientGone, EngineFailed, RowRefused, ServerFailed
from actors.runtime.outbox import ChoiceUpdate, Outbox, OutboxFailed
from server.errors import api_error_of
from server.frontend.generation import HTTPOutbox


async def test_coalesces_until_read():
    box = Outbox(2)
    for i in range(1000):  # the producer never waits, however far ahead it runs
        box.push(ChoiceUpdate(0, text="a", token_ids=[i]))
    box.push(ChoiceUpdate(1, text="b", token_ids=[7], finish_reason="length"))
    updates = await box.get()
    assert [u.index for u in updates] == [0, 1]
    assert updates[0].text == "a" * 1000 and len(updates[0].token_ids) == 1000
    assert updates[1].finish_reason == "length" and not box.done
    box.push(ChoiceUpdate(0, text="z", finish_reason="stop", stop_reason="z"))
    box.push(ChoiceUpdate(0, text="late"))  # after finish: dropped
    (last,) = await box.get()
    assert last.text == "z" and box.done and await box.get() == []


async def test_wakes_reader_and_fails():
    box = Outbox(1)
    async with trio.open_nursery() as n:

        async def produce():
            await trio.sleep(0.01)
            box.push(ChoiceUpdate(0, text="x"))
            await trio.sleep(0.01)
            box.fail(EngineFailed())
            box.fail(RowRefused())  # the first failure stays

        n.start_soon(produce)
        with trio.fail_after(1):
            assert (await box.get())[0].text == "x"
            with pytest.raises(OutboxFailed) as info:
                await box.get()
    assert isinstance(info.value.error, EngineFailed)
    assert info.value.message == "the engine failed while serving this request"


async def test_http_outbox_failures_carry_their_status():
    """The engine side fails an Outbox with a typed reason; the server's Outbox adds the
    HTTP status the routes read, and api_error_of gives the same one."""
    for error, status, param in [(PromptTooLong("too long", "prompt"), 400, "prompt"),
                                 (ClientGone(), 499, None), (RowRefused(), 500, None),
                                 (ServerFailed(), 500, None)]:
        box = HTTPOutbox(1)
        box.fail(error)
        with pytest.raises(OutboxFailed) as info:
            await box.get()
        assert info.value.status == status and info.value.message == error.message
        api = api_error_of(error)
        assert (api.status, api.message, api.param) == (status, error.message, param)
