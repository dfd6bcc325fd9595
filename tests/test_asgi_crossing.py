"""server.asgi_crossing: one request's failure stays in its call, whatever shape it takes.

Under Ray Serve a client that leaves makes Ray cancel the call while the app's `receive` is
waiting on the proxy, which then raises Ray's own error (not a ConnectionError). The app's
nursery then ends with a group holding Trio's Cancelled beside that error: a
BaseExceptionGroup, which once went past the call's `except Exception`, out of the host's
request nursery, and ended the replica's whole Trio loop."""

from __future__ import annotations

import asyncio

import trio

from server.asgi_crossing import Call


class _Loop:
    """The asyncio side, reduced to what a call uses to settle its future."""

    def call_soon_threadsafe(self, fn, *args) -> None:  # noqa: ANN001
        fn(*args)


async def _app_whose_reader_fails_when_cancelled(scope, receive, send) -> None:  # noqa: ANN001
    async def reader() -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            raise RuntimeError("the proxy's receive task was cancelled") from None

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.sleep_forever()


def _run_and_cancel(app) -> asyncio.Future:  # noqa: ANN001
    loop = asyncio.new_event_loop()
    try:
        done = loop.create_future()

        async def main() -> None:
            call = Call(app, {}, None, None, _Loop(), done)  # type: ignore[arg-type]
            async with trio.open_nursery() as requests:  # the host's request nursery
                requests.start_soon(call.run)
                await trio.sleep(0.05)
                call.cancel(trio.lowlevel.current_trio_token())
            # reaching here: the request nursery (and so the loop) survived

        trio.run(main)
        return done
    finally:
        loop.close()


def test_a_failure_while_cancelled_settles_the_call_and_stays_in_it() -> None:
    done = _run_and_cancel(_app_whose_reader_fails_when_cancelled)
    assert done.done()
    error = done.exception()
    assert isinstance(error, Exception), error
    assert "receive task was cancelled" in repr(error), repr(error)


def test_a_plainly_cancelled_call_settles_without_an_error() -> None:
    async def app(scope, receive, send) -> None:  # noqa: ANN001
        await trio.sleep_forever()

    done = _run_and_cancel(app)
    assert done.done() and done.exception() is None
