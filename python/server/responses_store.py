"""Stored responses of the Responses API: an embedded SQLite file, so that GET
/v1/responses/{id} and `previous_response_id` outlive the process (vLLM keeps them in a
dict that a restart empties and nothing bounds).

One row per response: its JSON body (what GET returns), the conversation it continued
(the chat messages before its output, instructions left out: they do not carry over to a
later turn), when it was created, its client and its size (the bytes of both JSON texts).

Bounds. The store holds at most `max_count` rows and `max_bytes` bytes, and no row older
than `max_age` seconds. Each client (one per API key; with no keys, every client is one
client) holds at most its share: the bounds divided by the number of clients. A write
evicts its own client's oldest rows until that client is within its share, then, if the
whole store is still over a bound (rows of a key no longer configured), the oldest rows of
clients that are not configured, then the oldest of any. A row larger than its client's
byte share is not kept at all. Rows still running (a background response queued or in
progress) are never evicted, by any bound: they count against their client's share and
the client's finished rows go instead.

Several processes may share one file (replicas on one machine): each store object is an
owner, with an id (pid + random) written on the rows it runs and a lock file it holds
(flock) for as long as it lives, in `<file>.owners/`. A running row whose owner's lock is
free belongs to a process that is gone: it is marked failed, when a store opens the file
and when the row is read. A cancel asked through the row (`request_cancel`) is seen by
the owner, which polls `cancel_requests`. The file must be on a local file system (WAL
needs shared memory, flock a local lock).

The file, its -wal and -shm companions and the lock files are mode 0600; folders made
for them 0700.

Every SQLite call (and the JSON coding of a row) runs in a worker thread, one at a time
over one connection, so the event loop never waits on the disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import secrets
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import trio

from server.state_dir import make_private_dirs

log = logging.getLogger("server.responses_store")

UNFINISHED = ("queued", "in_progress")
DEFAULT_MAX_BYTES = 1 << 30
_LOST = {"code": "server_error",
         "message": "The server stopped before this background response finished."}
_OWNER = re.compile(r"[0-9]+-[0-9a-f]{16}")
_NOT_RUNNING = "status NOT IN (?, ?)"
_COLUMNS = (("client", "TEXT NOT NULL DEFAULT ''"), ("size", "INTEGER NOT NULL DEFAULT 0"),
            ("runner", "TEXT"), ("cancel", "INTEGER NOT NULL DEFAULT 0"))


def client_id(api_key: str | bytes) -> str:
    """The store's name for the client of an API key: a digest, never the key itself."""
    raw = api_key.encode() if isinstance(api_key, str) else api_key
    return hashlib.sha256(raw).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class StoredResponse:
    body: dict[str, Any]  # the response object, as GET returns it
    messages: list[dict[str, Any]]  # the conversation before its output
    runner: str | None = None  # the owner running it (set while queued or in progress)

    @property
    def status(self) -> str:
        return str(self.body.get("status"))


class ResponseStore:
    def __init__(self, path: Path, *, max_count: int, max_age: float,
                 max_bytes: int = DEFAULT_MAX_BYTES, clients: Iterable[str] = ("",)) -> None:
        self.path = path
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.max_age = max_age  # seconds; 0: no age bound
        self.clients = frozenset(clients) or frozenset({""})
        self.share_count = max(1, max_count // len(self.clients))
        self.share_bytes = max(1, max_bytes // len(self.clients))
        self.owner = f"{os.getpid()}-{secrets.token_hex(8)}"
        self._owners = path.with_name(path.name + ".owners")
        self._lock: int | None = None  # the descriptor of this owner's locked file
        self._db: sqlite3.Connection | None = None
        self._limiter = trio.CapacityLimiter(1)  # one connection, one call at a time

    # -- the event loop's face --------------------------------------------------------------
    async def get(self, response_id: str) -> StoredResponse | None:
        return await self._run(self._get, response_id)

    async def put(self, body: dict[str, Any], messages: list[dict[str, Any]],
                  client: str = "") -> None:
        """Insert or replace the response, then evict what the bounds leave no room for.
        A queued or in-progress body is this owner's to run."""
        await self._run(self._put, body, messages, client)

    async def update(self, body: dict[str, Any]) -> bool:
        """Replace the body of a stored response; False when it is gone (evicted)."""
        return bool(await self._run(self._update, body))

    async def request_cancel(self, response_id: str) -> bool:
        """Asks the owner running the response to cancel it; False when nothing runs it."""
        return bool(await self._run(self._request_cancel, response_id))

    async def cancel_requests(self) -> list[str]:
        """The responses this owner runs whose cancel was asked for through the store."""
        return await self._run(self._cancel_requests)

    async def usage(self, client: str = "") -> tuple[int, int]:
        """(rows, bytes) the client holds."""
        return await self._run(self._usage, client)

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    def close(self) -> None:
        """Fails this owner's running rows (nothing runs them any more), then closes the
        file and gives up the lock. Not needed at exit: a dead owner's lock frees itself."""
        if self._db is not None:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._fail_runner(self._db, self.owner)
            self._db.close()
            self._db = None
        if self._lock is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._owners / self.owner)
            os.close(self._lock)
            self._lock = None

    # -- the worker thread's ---------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self._take_ownership()
            self._make_private_file()
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                 timeout=30.0)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                with db:
                    db.execute("BEGIN IMMEDIATE")
                    self._create(db)
                    self._mark_lost(db)
                for suffix in ("-wal", "-shm"):  # SQLite gives them the file's mode
                    self._chmod(Path(f"{self.path}{suffix}"))
            except BaseException:
                db.close()
                raise
            self._sweep_owners()
            self._db = db
        return self._db

    def _create(self, db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, "
                   "created REAL NOT NULL, status TEXT NOT NULL, client TEXT NOT NULL "
                   "DEFAULT '', size INTEGER NOT NULL DEFAULT 0, runner TEXT, cancel "
                   "INTEGER NOT NULL DEFAULT 0, body BLOB NOT NULL, messages BLOB NOT NULL)")
        have = {row[1] for row in db.execute("PRAGMA table_info(responses)")}
        if "runner" not in have:
            # A file of a single-process version: its running rows were that process's.
            self._fail_runner(db, None, legacy=True)
        for name, decl in _COLUMNS:
            if name not in have:
                db.execute(f"ALTER TABLE responses ADD COLUMN {name} {decl}")
        if "size" not in have:
            db.execute("UPDATE responses SET size = length(body) + length(messages)")
        db.execute("CREATE INDEX IF NOT EXISTS responses_created ON responses (created)")
        # Covering the bounds' sums and the eviction order, per client and overall.
        db.execute("CREATE INDEX IF NOT EXISTS responses_client ON responses "
                   "(client, created, status, size)")
        # A row has a runner exactly while it runs.
        db.execute("CREATE INDEX IF NOT EXISTS responses_runner ON responses "
                   "(runner, cancel) WHERE runner IS NOT NULL")

    def _make_private_file(self) -> None:
        make_private_dirs(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        os.close(fd)
        self._chmod(self.path)

    @staticmethod
    def _chmod(path: Path) -> None:
        try:
            os.chmod(path, 0o600)
        except FileNotFoundError:
            pass
        except PermissionError:  # another user's file that this one may write
            log.warning("cannot make %s private (mode 0600): not its owner", path)

    # -- owners ----------------------------------------------------------------------------
    def _take_ownership(self) -> None:
        """Holds a lock on <file>.owners/<owner> for this store's life. The file is locked
        under a temporary name, then renamed: no one sees it unlocked."""
        if self._lock is not None:
            return
        make_private_dirs(self._owners)
        new = self._owners / f".{self.owner}.new"
        fd = os.open(new, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(new, self._owners / self.owner)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(new)
            raise
        self._lock = fd

    def _alive(self, runner: str | None) -> bool:
        """Whether the owner `runner` still holds its lock (its process is alive). A dead
        owner's lock file is removed."""
        if runner == self.owner:
            return True
        if runner is None or not _OWNER.fullmatch(runner):
            return False
        return self._holds_lock(self._owners / runner)

    @staticmethod
    def _holds_lock(path: Path) -> bool:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        except OSError:  # unreadable: not ours to judge, so taken as alive
            return True
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return False
        finally:
            os.close(fd)

    def _sweep_owners(self) -> None:
        """Removes the lock files of owners that are gone (with no running row left)."""
        try:
            names = os.listdir(self._owners)
        except OSError:
            return
        for name in names:
            new = name.startswith(".") and name.endswith(".new")
            bare = name[1:-4] if new else name
            if bare == self.owner or not _OWNER.fullmatch(bare):
                continue
            if new:  # left by a start cut short; a young one may be about to be locked
                with contextlib.suppress(OSError):
                    if time.time() - os.stat(self._owners / name).st_mtime > 60:
                        self._holds_lock(self._owners / name)
            else:
                self._holds_lock(self._owners / name)

    def _mark_lost(self, db: sqlite3.Connection) -> None:
        runners = [r for (r,) in db.execute(
            "SELECT DISTINCT runner FROM responses WHERE runner IS NOT NULL")]
        for runner in runners:
            if not self._alive(runner):
                self._fail_runner(db, runner)

    def _fail_runner(self, db: sqlite3.Connection, runner: str | None, *,
                     legacy: bool = False) -> None:
        """Marks failed the running rows of `runner`, an owner that will not finish them."""
        if legacy:
            rows = db.execute("SELECT id, body FROM responses WHERE status IN (?, ?)",
                              UNFINISHED).fetchall()
        else:
            rows = db.execute("SELECT id, body FROM responses WHERE runner = ?",
                              (runner,)).fetchall()
        for rid, raw in rows:
            body = orjson.loads(raw)
            body.update(status="failed", error=_LOST)
            data = orjson.dumps(body)
            if legacy:
                db.execute("UPDATE responses SET status = ?, body = ? WHERE id = ?",
                           ("failed", data, rid))
            else:
                db.execute("UPDATE responses SET status = ?, body = ?, runner = NULL, "
                           "cancel = 0, size = size - length(body) + ? WHERE id = ?",
                           ("failed", data, len(data), rid))
        if rows:
            log.warning("marked %d unfinished background responses failed (their server "
                        "is gone)", len(rows))

    # -- rows ------------------------------------------------------------------------------
    def _get(self, response_id: str) -> StoredResponse | None:
        db = self._conn()
        row = db.execute("SELECT body, messages, runner, created FROM responses "
                         "WHERE id = ?", (response_id,)).fetchone()
        if row is None:
            return None
        raw, messages, runner, created = row
        if runner is not None and not self._alive(runner):
            with db:
                db.execute("BEGIN IMMEDIATE")
                self._fail_runner(db, runner)
            return self._get(response_id)
        if runner is None and self.max_age > 0 and created < time.time() - self.max_age:
            return None  # past the age bound: the next write deletes it
        return StoredResponse(orjson.loads(raw), orjson.loads(messages), runner)

    def _put(self, body: dict[str, Any], messages: list[dict[str, Any]], client: str) -> None:
        db = self._conn()
        status = body["status"]
        running = status in UNFINISHED
        data, conversation = orjson.dumps(body), orjson.dumps(messages)
        size = len(data) + len(conversation)
        with db:  # one transaction: the row and the evictions it makes
            db.execute("BEGIN IMMEDIATE")
            if not running and size > self.share_bytes:
                db.execute("DELETE FROM responses WHERE id = ?", (body["id"],))
                log.warning("response %s not stored: %d bytes, more than a client's share "
                            "of the store (%d)", body["id"], size, self.share_bytes)
                return
            db.execute("INSERT OR REPLACE INTO responses (id, created, status, client, size, "
                       "runner, cancel, body, messages) VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?)",
                       (body["id"], time.time(), status, client, size,
                        self.owner if running else None, data, conversation))
            self._evict(db, client)

    def _update(self, body: dict[str, Any]) -> int:
        db = self._conn()
        status = body["status"]
        running = status in UNFINISHED
        data = orjson.dumps(body)
        with db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT client, length(messages) FROM responses WHERE id = ?",
                             (body["id"],)).fetchone()
            if row is None:
                return 0
            client, conversation = row
            size = len(data) + conversation
            if not running and size > self.share_bytes:
                db.execute("DELETE FROM responses WHERE id = ?", (body["id"],))
                log.warning("response %s dropped from the store: %d bytes, more than a "
                            "client's share (%d)", body["id"], size, self.share_bytes)
                return 1
            db.execute("UPDATE responses SET status = ?, body = ?, size = ?, runner = ?, "
                       "cancel = CASE WHEN ? THEN cancel ELSE 0 END WHERE id = ?",
                       (status, data, size, self.owner if running else None, running,
                        body["id"]))
            self._evict(db, client)
        return 1

    def _request_cancel(self, response_id: str) -> int:
        db = self._conn()
        return db.execute("UPDATE responses SET cancel = 1 WHERE id = ? AND runner IS NOT NULL",
                          (response_id,)).rowcount

    def _cancel_requests(self) -> list[str]:
        return [rid for (rid,) in self._conn().execute(
            "SELECT id FROM responses WHERE runner = ? AND cancel = 1", (self.owner,))]

    def _usage(self, client: str) -> tuple[int, int]:
        count, size = self._conn().execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM responses WHERE client = ?",
            (client,)).fetchone()
        return count, size

    # -- bounds ----------------------------------------------------------------------------
    def _evict(self, db: sqlite3.Connection, client: str) -> None:
        if self.max_age > 0:
            db.execute(f"DELETE FROM responses WHERE created < ? AND {_NOT_RUNNING}",
                       (time.time() - self.max_age, *UNFINISHED))
        count, size = self._usage(client)
        if count > self.share_count or size > self.share_bytes:
            rows = db.execute("SELECT rowid, size, client FROM responses WHERE client = ? AND "
                              f"{_NOT_RUNNING} ORDER BY created, rowid",
                              (client, *UNFINISHED))
            self._delete_oldest(db, rows, count, size, self.share_count, self.share_bytes)
        count, size = db.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) "
                                 "FROM responses").fetchone()
        if count > self.max_count or size > self.max_bytes:
            # Clients no configured key names first (rows of an earlier configuration).
            rows = [r for r in db.execute(f"SELECT rowid, size, client FROM responses WHERE "
                                          f"{_NOT_RUNNING} ORDER BY created, rowid",
                                          UNFINISHED)]
            strangers = [r for r in rows if r[2] not in self.clients]
            count, size = self._delete_oldest(db, strangers, count, size, self.max_count,
                                              self.max_bytes)
            self._delete_oldest(db, [r for r in rows if r[2] in self.clients], count, size,
                                self.max_count, self.max_bytes)

    @staticmethod
    def _delete_oldest(db: sqlite3.Connection, rows: Iterable[tuple[int, int, str]],
                       count: int, size: int, max_count: int,
                       max_bytes: int) -> tuple[int, int]:
        """Deletes `rows` (oldest first) until count and size are within the bounds."""
        victims = []
        for rowid, row_size, _ in rows:
            if count <= max_count and size <= max_bytes:
                break
            victims.append((rowid,))
            count -= 1
            size -= row_size
        db.executemany("DELETE FROM responses WHERE rowid = ?", victims)
        return count, size
