"""A Trio event for a concurrent future: how a Trio task waits on work done in a thread
(a grammar compile, a child process's answer, a coroutine on another event loop) without
blocking its loop, and stays cancellable while it waits."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import trio

__all__ = ["done_event"]


def done_event(future: Future[Any]) -> trio.Event:
    """An event set on the calling Trio loop once ``future`` is done, from whichever thread
    finishes it. A loop that has ended by then is left alone (nobody waits any more)."""
    done = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def wake(_: Future[Any]) -> None:
        try:
            token.run_sync_soon(done.set)
        except trio.RunFinishedError:
            pass

    future.add_done_callback(wake)
    return done
