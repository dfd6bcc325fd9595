"""The Responses API's SQLite store (server/frontend/responses_store.py) on a real file: the count
bound evicts the oldest, the age bound every row past it, a reopened file keeps what was
stored, and rows a stopped process left unfinished are failed when it is reopened."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from server.frontend.responses_store import ResponseStore
from subproc import child_env


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


STOPPED = r"""
import sys, trio
from pathlib import Path
from server.frontend.responses_store import ResponseStore

async def main():
    store = ResponseStore(Path(sys.argv[1]), max_count=10, max_age=0)
    await store.put({"id": "resp_0", "status": "in_progress"}, [])
    await store.put({"id": "resp_1", "status": "queued"}, [])
    await store.put({"id": "resp_2", "status": "completed"}, [])

trio.run(main)
"""


def test_unfinished_rows_are_failed_when_reopened(tmp_path: Path):
    path = tmp_path / "s.sqlite"
    # A process stores two running rows and ends without finishing them.
    subprocess.run([sys.executable, "-c", STOPPED, str(path)], env=child_env(), check=True)

    async def reopened() -> None:
        store = ResponseStore(path, max_count=10, max_age=0)
        for i in (0, 1):
            got = (await store.get(f"resp_{i}")).body
            assert got["status"] == "failed" and got["error"]["code"] == "server_error"
        assert (await store.get("resp_2")).status == "completed"
        await store.close()

    trio.run(reopened)
    assert os.listdir(tmp_path / "s.sqlite.owners") == []  # the gone owner's lock file too


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


# -- shares, bytes, running rows, file modes, several processes on one file ----------------
def blob(i: int, size: int, status: str = "completed") -> dict:
    return dict(body(i, status), output=[{"type": "message", "text": "x" * size}])


async def present(store: ResponseStore, ids) -> list[int]:
    return [i for i in ids if await store.get(f"resp_{i}") is not None]


async def test_one_client_cannot_evict_another_clients_rows(tmp_path: Path):
    # Two clients, a count bound of 4: each may hold 2 rows.
    store = ResponseStore(tmp_path / "s.sqlite", max_count=4, max_age=0, clients=("a", "b"))
    for i in (0, 1):
        await store.put(body(i), [], client="b")
    for i in range(10, 20):  # client a floods
        await store.put(body(i), [], client="a")
    assert await present(store, [0, 1]) == [0, 1]
    assert await present(store, range(10, 20)) == [18, 19]  # a's own oldest went first
    # A client of no configured key (rows left by an earlier configuration) is evicted
    # first when the whole store is over its bound.
    await store.put(body(30), [], client="gone")
    await store.put(body(2), [], client="b")  # b over its share: its own oldest goes
    assert await present(store, [0, 1, 2, 30]) == [1, 2]
    # Without keys every client is one client: the bound is one FIFO, as before.
    one = ResponseStore(tmp_path / "t.sqlite", max_count=3, max_age=0)
    for i in range(5):
        await one.put(body(i), [])
    assert await present(one, range(5)) == [2, 3, 4]


async def test_byte_bound(tmp_path: Path):
    # 40 000 bytes for two clients: 20 000 each. Each row below is ~6 000 bytes of JSON.
    store = ResponseStore(tmp_path / "s.sqlite", max_count=100, max_age=0,
                          max_bytes=40_000, clients=("a", "b"))
    await store.put(blob(0, 6000), [], client="b")
    for i in range(10, 16):
        await store.put(blob(i, 6000), [{"role": "user", "content": "q"}], client="a")
    assert await present(store, range(10, 16)) == [13, 14, 15]
    assert await present(store, [0]) == [0]
    count, size = await store.usage("a")
    assert count == 3 and 3 * 6000 < size <= 20_000
    # One row larger than a share is not kept at all, and it evicts nothing.
    await store.put(blob(20, 30_000), [], client="b")
    assert await present(store, [0, 20]) == [0]
    assert await present(store, range(10, 16)) == [13, 14, 15]
    # The default bound is a gibibyte.
    assert ResponseStore(tmp_path / "d.sqlite", max_count=1, max_age=0).max_bytes == 1 << 30


async def test_running_background_rows_are_never_evicted(tmp_path: Path):
    store = ResponseStore(tmp_path / "s.sqlite", max_count=4, max_age=0,
                          max_bytes=40_000, clients=("a", "b"))
    await store.put(body(0, "in_progress"), [], client="a")
    await store.put(body(1, "queued"), [], client="a")
    for i in range(10, 20):
        await store.put(blob(i, 3000), [], client="a")
    # The share (2 rows) is held by the two running rows: every finished row of a goes.
    assert await present(store, [0, 1]) == [0, 1]
    assert await present(store, range(10, 20)) == []
    # Once finished, a row is evictable again: its update applies the bounds.
    assert await store.update(blob(0, 30_000))  # the row was there when it finished
    assert await store.get("resp_0") is None  # bigger than a's share: not kept
    await store.put(body(21), [], client="a")
    await store.update(body(1))
    await store.put(body(22), [], client="a")
    assert await present(store, [1, 21, 22]) == [21, 22]
    # Nor does the age bound take a running row.
    aged = ResponseStore(tmp_path / "t.sqlite", max_count=10, max_age=0.5)
    await aged.put(body(0, "in_progress"), [])
    await aged.put(body(1), [])
    await trio.sleep(0.7)
    await aged.put(body(2), [])
    assert await present(aged, [0, 1, 2]) == [0, 2]


async def test_file_and_folder_modes(tmp_path: Path):
    there = tmp_path / "there"  # a folder that was there: left as it is
    there.mkdir()
    there.chmod(0o755)
    old = os.umask(0o022)  # a permissive umask: what the store makes must not follow it
    try:
        path = there / "made" / "deeper" / "s.sqlite"
        store = ResponseStore(path, max_count=10, max_age=0)
        await store.put(body(0), [{"role": "user", "content": "secret"}])
        await store.get("resp_0")
    finally:
        os.umask(old)
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700 and mode(path.parent.parent) == 0o700
    assert mode(there) == 0o755
    extra = [Path(f"{path}-wal"), Path(f"{path}-shm")]
    assert all(p.exists() for p in extra), list(path.parent.iterdir())
    assert [mode(p) for p in extra] == [0o600, 0o600]
    for p in path.parent.iterdir():
        if p.is_dir():
            assert mode(p) == 0o700, p
            assert all(mode(q) == 0o600 for q in p.iterdir()), list(p.iterdir())
    # A file an earlier version made with the umask's mode is made private when opened.
    old_file = tmp_path / "old.sqlite"
    old_file.write_bytes(b"")
    old_file.chmod(0o644)
    await ResponseStore(old_file, max_count=10, max_age=0).put(body(0), [])
    assert mode(old_file) == 0o600
    await store.close()


HOLDER = r"""
import sys, trio
from pathlib import Path
from server.frontend.responses_store import ResponseStore

async def main():
    store = ResponseStore(Path(sys.argv[1]), max_count=100, max_age=0)
    await store.put({"id": "resp_run", "status": "in_progress", "output": []}, [])
    await store.put({"id": "resp_stop", "status": "in_progress", "output": []}, [])
    print("ready", flush=True)
    while True:  # serves cancel requests as the server does: the row says which
        for rid in await store.cancel_requests():
            await store.update({"id": rid, "status": "cancelled", "output": []})
        await trio.sleep(0.05)

trio.run(main)
"""


async def test_several_processes_share_one_file(tmp_path: Path):
    path = tmp_path / "s.sqlite"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], env=child_env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        # A second process opens the same file: the first one's running rows stay running.
        other = ResponseStore(path, max_count=100, max_age=0)
        assert (await other.get("resp_run")).status == "in_progress"
        assert (await other.get("resp_stop")).status == "in_progress"
        assert (await other.get("resp_run")).runner not in (None, other.owner)
        # A cancel asked for through the row is carried out by the process that runs it.
        assert await other.request_cancel("resp_stop")
        with trio.fail_after(10):
            while (await other.get("resp_stop")).status != "cancelled":
                await trio.sleep(0.05)
        assert not await other.request_cancel("resp_stop")  # finished: nothing to ask
        # A third store opened meanwhile leaves the running row alone too.
        third = ResponseStore(path, max_count=100, max_age=0)
        assert (await third.get("resp_run")).status == "in_progress"
        await third.close()
        assert (await other.get("resp_run")).status == "in_progress"
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # Its process gone, its running row is failed: by the next reader, or the next opener.
    got = (await other.get("resp_run")).body
    assert got["status"] == "failed" and got["error"]["code"] == "server_error"
    await other.close()


async def test_a_file_of_the_single_process_schema_is_upgraded(tmp_path: Path):
    import sqlite3

    import orjson

    path = tmp_path / "s.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE responses (id TEXT PRIMARY KEY, created REAL NOT NULL, "
               "status TEXT NOT NULL, body BLOB NOT NULL, messages BLOB NOT NULL)")
    for i, status in ((0, "in_progress"), (1, "completed")):
        db.execute("INSERT INTO responses VALUES (?, ?, ?, ?, ?)",
                   (f"resp_{i}", time.time() + i, status, orjson.dumps(body(i, status)),
                    b"[]"))
    db.commit()
    db.close()
    store = ResponseStore(path, max_count=2, max_age=0)
    assert (await store.get("resp_0")).status == "failed"  # its process is gone
    assert (await store.get("resp_1")).body == body(1)
    count, size = await store.usage("")
    assert count == 2 and size > len(orjson.dumps(body(1)))  # sizes of the old rows too
    await store.put(body(2), [])  # the old rows are the one client's: the oldest goes
    assert await present(store, [0, 1, 2]) == [1, 2]
    await store.close()


async def test_close_fails_its_running_rows_and_removes_its_lock(tmp_path: Path):
    path = tmp_path / "s.sqlite"
    store = ResponseStore(path, max_count=10, max_age=0)
    await store.put(body(0, "in_progress"), [])
    await store.put(body(1), [])
    assert os.listdir(tmp_path / "s.sqlite.owners") == [store.owner]
    await store.close()
    assert os.listdir(tmp_path / "s.sqlite.owners") == []
    with pytest.raises(RuntimeError, match="closed"):
        await store.get("resp_1")
    reopened = ResponseStore(path, max_count=10, max_age=0)
    got = (await reopened.get("resp_0")).body
    assert got["status"] == "failed" and got["error"]["code"] == "server_error"
    assert (await reopened.get("resp_1")).body == body(1)
    await reopened.close()
