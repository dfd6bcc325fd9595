"""The Responses API's SQLite store (server/responses_store.py) on a real file: the count
bound evicts the oldest, the age bound every row past it, a reopened file keeps what was
stored, and rows a stopped process left unfinished are failed when it is reopened."""

from __future__ import annotations

import time
from pathlib import Path

import trio
from server.responses_store import ResponseStore


def body(i: int, status: str = "completed") -> dict:
    return {"id": f"resp_{i}", "status": status, "output": [{"type": "message", "n": i}]}


def test_count_bound_evicts_the_oldest_and_a_reopen_keeps_the_rest(tmp_path: Path):
    path = tmp_path / "s.sqlite"

    async def first() -> None:
        store = ResponseStore(path, max_count=3, max_age=0)
        for i in range(5):
            await store.put(body(i), [{"role": "user", "content": str(i)}])
        assert [await store.get(f"resp_{i}") is None for i in range(5)] == [
            True, True, False, False, False]
        await store.put(body(2, "failed"), [])  # a replace keeps the count
        assert (await store.get("resp_2")).status == "failed"
        assert await store.get("resp_3") is not None

    async def second() -> None:
        store = ResponseStore(path, max_count=3, max_age=0)
        got = await store.get("resp_4")
        assert got.body == body(4) and got.messages == [{"role": "user", "content": "4"}]
        assert await store.update(body(4, "cancelled"))
        assert not await store.update(body(0, "cancelled"))  # evicted: nothing to update

    trio.run(first)
    trio.run(second)


def test_age_bound(tmp_path: Path):
    async def main() -> None:
        store = ResponseStore(tmp_path / "s.sqlite", max_count=10, max_age=0.5)
        await store.put(body(0), [])
        assert await store.get("resp_0") is not None
        await trio.sleep(0.7)
        assert await store.get("resp_0") is None

    trio.run(main)


def test_unfinished_rows_are_failed_when_reopened(tmp_path: Path):
    path = tmp_path / "s.sqlite"

    async def stopped() -> None:
        store = ResponseStore(path, max_count=10, max_age=0)
        await store.put(body(0, "in_progress"), [])
        await store.put(body(1, "queued"), [])
        await store.put(body(2), [])

    async def reopened() -> None:
        store = ResponseStore(path, max_count=10, max_age=0)
        for i in (0, 1):
            got = (await store.get(f"resp_{i}")).body
            assert got["status"] == "failed" and got["error"]["code"] == "server_error"
        assert (await store.get("resp_2")).status == "completed"

    trio.run(stopped)
    trio.run(reopened)


def test_io_runs_off_the_event_loop(tmp_path: Path):
    """While a large row is written, the event loop keeps running its other tasks."""
    async def main() -> None:
        store = ResponseStore(tmp_path / "s.sqlite", max_count=10, max_age=0)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await trio.sleep(0)

        big = dict(body(0), output=[{"type": "message", "text": "x" * 50_000_000}])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tick)
            started = time.perf_counter()
            await store.put(big, [])
            took = time.perf_counter() - started
            nursery.cancel_scope.cancel()
        assert took > 0.01 and ticks > 10, (took, ticks)

    trio.run(main)
