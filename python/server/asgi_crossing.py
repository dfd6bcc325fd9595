"""One ASGI call crossing from an asyncio loop into a Trio loop running in another thread
(server.ray_serve: Ray's replica loop is asyncio, the server's is Trio). The app runs on the
Trio side; its `receive` and `send` run back on the asyncio loop. Cancelling the call on
the asyncio side cancels the app on the Trio side, as a hang-up does under Hypercorn."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

from actors.core.future_event import done_event

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


class Call:
    """One ASGI request crossing from an asyncio loop into the Trio thread."""

    def __init__(self, app: Any, scope: Scope, receive: Callable[[], Awaitable[Message]],
                 send: Callable[[Message], Awaitable[None]], loop: asyncio.AbstractEventLoop,
                 done: asyncio.Future[None]) -> None:
        self.app = app
        self.scope = scope
        self._receive = receive
        self._send = send
        self.loop = loop
        self.done = done
        self._scope: trio.CancelScope | None = None
        self._cancelled = False

    async def run(self) -> None:
        """Run the app; whatever it ends with settles the caller's future and stays here.
        The cancel scope takes back its own Cancelled; what an app failing while it is
        cancelled leaves besides (a group, once Trio's Cancelled is stripped from it) is
        the call's error, not the loop's: a request never ends the host's request nursery."""
        error: BaseException | None = None
        try:
            with trio.CancelScope() as scope:
                self._scope = scope
                if self._cancelled:
                    scope.cancel()
                await self.app(self.scope, self.receive, self.send)
        except Exception as exc:  # noqa: BLE001 - the caller's loop re-raises it
            error = exc
        finally:
            try:
                self.loop.call_soon_threadsafe(settle, self.done, error)
            except RuntimeError:  # the caller's loop has closed: nobody waits any more
                pass

    def cancel(self, token: trio.lowlevel.TrioToken) -> None:
        def cancel() -> None:
            self._cancelled = True
            if self._scope is not None:
                self._scope.cancel()

        try:
            token.run_sync_soon(cancel)
        except trio.RunFinishedError:
            pass

    async def receive(self) -> Message:
        try:
            return await on_loop(self.loop, self._receive())
        except (Exception, asyncio.CancelledError):  # noqa: BLE001
            # The caller cannot deliver the request any more (a reset, or the host's own
            # error: Ray raises its TaskCancelledError once the proxy drops the call): to
            # the app that is the client leaving.
            return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        await on_loop(self.loop, self._send(message))


def settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)


async def on_loop(loop: asyncio.AbstractEventLoop, coro: Awaitable[Any]) -> Any:
    """Await `coro` on the asyncio `loop` (another thread) from Trio; a Trio cancellation
    cancels it there."""
    future = asyncio.run_coroutine_threadsafe(coro, loop)  # type: ignore[arg-type]
    finished = done_event(future)
    try:
        await finished.wait()
    except trio.Cancelled:
        future.cancel()
        raise
    return future.result()
