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
owner (server.frontend.responses_owners) whose name is written on the rows it runs. A running row
whose owner is gone is marked failed, when a store opens the file and when the row is
read. A cancel asked through the row (`request_cancel`) is seen by the owner, which polls
`cancel_requests`. The file must be on a local file system (WAL needs shared memory,
flock a local lock).

The file and its -wal and -shm companions are mode 0600; folders made for them 0700.

Every SQLite call (and the JSON coding of a row) runs in a worker thread, one at a time
over one connection, so the event loop never waits on the disk.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import trio

from server.frontend.responses_owners import Owner
from server.state_dir import make_private_dirs

log = logging.getLogger("server.frontend.responses_store")

UNFINISHED = ("queued", "in_progress")
DEFAULT_MAX_BYTES = 1 << 30
_LOST = {"code": "server_error",
         "message": "The server stopped before this background response finished."}
_NOT_RUNNING = "status NOT IN (?, ?)"
# The columns added to the single-process version's table (id, created, status, body,
# messages); a new file gets them the same way.
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
        return self.body["status"]


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
        self._owner = Owner(path)
        self.owner = self._owner.name
        self._db: sqlite3.Connection | None = None
        self._closed = False
        self._limiter = trio.CapacityLimiter(1)  # one connection, one call at a time

    # -- the event loop's ------------------------------------------------------------------
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
        """Asks the owner running the response, another one than this, to cancel it; False
        when no other owner runs it."""
        return bool(await self._run(self._request_cancel, response_id))

    async def cancel_requests(self) -> list[str]:
        """The responses this owner runs whose cancel was asked for through the store."""
        return await self._run(self._cancel_requests)

    async def usage(self, client: str = "") -> tuple[int, int]:
        """(rows, bytes) the client holds."""
        return await self._run(lambda: self._usage(self._conn(), client))

    async def close(self) -> None:
        """Fails this owner's running rows (nothing runs them any more), closes the file
        and removes this owner's lock file; the store is not used after. Not needed at
        exit: a dead owner's lock frees itself, and the next opener removes its file."""
        await self._run(self._close)

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    # -- the worker thread's ---------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise RuntimeError(f"the response store {self.path} is closed")
        if self._db is None:
            self._owner.take()
            make_private_dirs(self.path.parent)
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            _make_private(self.path)  # a file an earlier version made with the umask's mode
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                 timeout=30.0)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                with _transaction(db):
                    self._create(db)
                    self._mark_lost(db)
                for suffix in ("-wal", "-shm"):  # SQLite gives them the file's mode
                    _make_private(Path(f"{self.path}{suffix}"))
            except BaseException:
                db.close()
                raise
            self._owner.sweep()
            self._db = db
        return self._db

    def _close(self) -> None:
        if self._db is not None:
            with _transaction(self._db):
                self._fail_rows(self._db, "runner = ?", (self.owner,))
            self._db.close()
            self._db = None
        self._owner.release()
        self._closed = True

    def _create(self, db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, "
                   "created REAL NOT NULL, status TEXT NOT NULL, body BLOB NOT NULL, "
                   "messages BLOB NOT NULL)")
        have = {row[1] for row in db.execute("PRAGMA table_info(responses)")}
        for name, decl in _COLUMNS:
            if name not in have:
                db.execute(f"ALTER TABLE responses ADD COLUMN {name} {decl}")
        if "runner" not in have:
            # A new file, or one of the single-process version: its running rows were
            # that process's, which is gone.
            db.execute("UPDATE responses SET size = length(body) + length(messages)")
            self._fail_rows(db, "status IN (?, ?)", UNFINISHED)
        db.execute("CREATE INDEX IF NOT EXISTS responses_created ON responses (created)")
        # Covering the bounds' sums and the eviction order, per client and overall.
        db.execute("CREATE INDEX IF NOT EXISTS responses_client ON responses "
                   "(client, created, status, size)")
        # A row has a runner exactly while it runs.
        db.execute("CREATE INDEX IF NOT EXISTS responses_runner ON responses "
                   "(runner, cancel) WHERE runner IS NOT NULL")

    def _mark_lost(self, db: sqlite3.Connection) -> None:
        runners = db.execute("SELECT DISTINCT runner FROM responses "
                             "WHERE runner IS NOT NULL").fetchall()
        for (runner,) in runners:
            if not self._owner.alive(runner):
                self._fail_rows(db, "runner = ?", (runner,))

    @staticmethod
    def _fail_rows(db: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> None:
        """Marks failed the running rows `where` selects, whose owner will not finish them."""
        rows = db.execute(f"SELECT id, body FROM responses WHERE {where}", args).fetchall()
        for rid, raw in rows:
            body = orjson.loads(raw)
            body.update(status="failed", error=_LOST)
            data = orjson.dumps(body)
            db.execute("UPDATE responses SET status = 'failed', body = ?, runner = NULL, "
                       "cancel = 0, size = size - length(body) + ? WHERE id = ?",
                       (data, len(data), rid))
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
        if runner is not None and not self._owner.alive(runner):
            with _transaction(db):
                self._fail_rows(db, "runner = ?", (runner,))
            return self._get(response_id)
        if runner is None and self.max_age > 0 and created < time.time() - self.max_age:
            return None  # past the age bound: the next write deletes it
        return StoredResponse(orjson.loads(raw), orjson.loads(messages), runner)

    def _put(self, body: dict[str, Any], messages: list[dict[str, Any]], client: str) -> None:
        data, conversation = orjson.dumps(body), orjson.dumps(messages)
        size = len(data) + len(conversation)
        running = body["status"] in UNFINISHED
        db = self._conn()
        with _transaction(db):  # one transaction: the row and the evictions it makes
            if self._fits(db, body, size):
                db.execute("INSERT OR REPLACE INTO responses (id, created, status, client, "
                           "size, runner, cancel, body, messages) "
                           "VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?)",
                           (body["id"], time.time(), body["status"], client, size,
                            self.owner if running else None, data, conversation))
                self._evict(db, client)

    def _update(self, body: dict[str, Any]) -> int:
        data = orjson.dumps(body)
        running = body["status"] in UNFINISHED
        db = self._conn()
        with _transaction(db):
            row = db.execute("SELECT client, length(messages) FROM responses WHERE id = ?",
                             (body["id"],)).fetchone()
            if row is None:
                return 0
            client, conversation = row
            size = len(data) + conversation
            if self._fits(db, body, size):
                db.execute("UPDATE responses SET status = ?, body = ?, size = ?, runner = ?, "
                           "cancel = CASE WHEN ? THEN cancel ELSE 0 END WHERE id = ?",
                           (body["status"], data, size, self.owner if running else None,
                            running, body["id"]))
                self._evict(db, client)
        return 1

    def _fits(self, db: sqlite3.Connection, body: dict[str, Any], size: int) -> bool:
        """Whether the row may be kept: a running one always, a finished one within its
        client's byte share. One that does not fit is deleted, if it was there."""
        if body["status"] in UNFINISHED or size <= self.share_bytes:
            return True
        db.execute("DELETE FROM responses WHERE id = ?", (body["id"],))
        log.warning("response %s not stored: %d bytes, more than a client's share of the "
                    "store (%d)", body["id"], size, self.share_bytes)
        return False

    def _request_cancel(self, response_id: str) -> int:
        return self._conn().execute(
            "UPDATE responses SET cancel = 1 WHERE id = ? AND runner IS NOT NULL "
            "AND runner != ?", (response_id, self.owner)).rowcount

    def _cancel_requests(self) -> list[str]:
        return [rid for (rid,) in self._conn().execute(
            "SELECT id FROM responses WHERE runner = ? AND cancel = 1", (self.owner,))]

    @staticmethod
    def _usage(db: sqlite3.Connection, client: str | None) -> tuple[int, int]:
        """(rows, bytes) of the client, or of the whole store (None)."""
        where, args = ("", ()) if client is None else ("WHERE client = ?", (client,))
        count, size = db.execute(
            f"SELECT COUNT(*), COALESCE(SUM(size), 0) FROM responses {where}", args).fetchone()
        return count, size

    # -- bounds ----------------------------------------------------------------------------
    def _evict(self, db: sqlite3.Connection, client: str) -> None:
        if self.max_age > 0:
            db.execute(f"DELETE FROM responses WHERE created < ? AND {_NOT_RUNNING}",
                       (time.time() - self.max_age, *UNFINISHED))
        _trim(db, self._usage(db, client), (self.share_count, self.share_bytes),
              f"client = ? AND {_NOT_RUNNING} ORDER BY created, rowid", (client, *UNFINISHED))
        # Then the whole store: clients no configured key names go first (rows of an
        # earlier configuration), then the oldest of any.
        marks = ", ".join("?" * len(self.clients))
        _trim(db, self._usage(db, None), (self.max_count, self.max_bytes),
              f"{_NOT_RUNNING} ORDER BY client IN ({marks}), created, rowid",
              (*UNFINISHED, *self.clients))


def _trim(db: sqlite3.Connection, usage: tuple[int, int], bounds: tuple[int, int],
          rows: str, args: tuple[Any, ...]) -> None:
    """Deletes the rows `SELECT ... FROM responses WHERE <rows>` yields, in its order, until
    `usage` (rows, bytes) is within `bounds` (rows, bytes)."""
    (count, size), (max_count, max_bytes) = usage, bounds
    if count <= max_count and size <= max_bytes:
        return
    victims = []
    cursor = db.execute(f"SELECT rowid, size FROM responses WHERE {rows}", args)
    for rowid, row_size in cursor:
        victims.append((rowid,))
        count -= 1
        size -= row_size
        if count <= max_count and size <= max_bytes:
            break
    cursor.close()
    db.executemany("DELETE FROM responses WHERE rowid = ?", victims)


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """A write transaction, taken at once (no later upgrade to fail on a busy file)."""
    with db:
        db.execute("BEGIN IMMEDIATE")
        yield


def _make_private(path: Path) -> None:
    """Mode 0600 for a file of the store, if it is there."""
    try:
        os.chmod(path, 0o600)
    except FileNotFoundError:
        pass
    except PermissionError:  # another user's file that this one may write
        log.warning("cannot make %s private (mode 0600): not its owner", path)
