"""Stored responses of the Responses API: an embedded SQLite file, so that GET
/v1/responses/{id} and `previous_response_id` outlive the process (vLLM keeps them in a
dict that a restart empties and nothing bounds).

One row per response: its JSON body (what GET returns), the conversation it continued
(the chat messages before its output, instructions left out: they do not carry over to a
later turn) and when it was created. The store is bounded by count and by age: each write
evicts the oldest rows beyond `max_count` and every row older than `max_age` seconds.

Every SQLite call (and the JSON coding of a row) runs in a worker thread, one at a time
over one connection, so the event loop never waits on the disk. The file is opened on
first use; rows a previous process left queued or in progress (background responses it
was still running) are marked failed then, since nothing runs them any more. One server
owns a store file at a time.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import trio

log = logging.getLogger("server.responses_store")

UNFINISHED = ("queued", "in_progress")
_LOST = {"code": "server_error",
         "message": "The server stopped before this background response finished."}


@dataclass(frozen=True, slots=True)
class StoredResponse:
    body: dict[str, Any]  # the response object, as GET returns it
    messages: list[dict[str, Any]]  # the conversation before its output

    @property
    def status(self) -> str:
        return str(self.body.get("status"))


class ResponseStore:
    def __init__(self, path: Path, *, max_count: int, max_age: float) -> None:
        self.path = path
        self.max_count = max_count
        self.max_age = max_age  # seconds; 0: no age bound
        self._db: sqlite3.Connection | None = None
        self._limiter = trio.CapacityLimiter(1)  # one connection, one call at a time

    # -- the event loop's face --------------------------------------------------------------
    async def get(self, response_id: str) -> StoredResponse | None:
        return await self._run(self._get, response_id)

    async def put(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        """Insert or replace the response, then evict what the bounds leave no room for."""
        await self._run(self._put, body, messages)

    async def update(self, body: dict[str, Any]) -> bool:
        """Replace the body of a stored response; False when it is gone (evicted)."""
        return bool(await self._run(self._update, body))

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    # -- the worker thread's ---------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, "
                       "created REAL NOT NULL, status TEXT NOT NULL, body BLOB NOT NULL, "
                       "messages BLOB NOT NULL)")
            db.execute("CREATE INDEX IF NOT EXISTS responses_created ON responses (created)")
            self._mark_lost(db)
            self._db = db
        return self._db

    def _mark_lost(self, db: sqlite3.Connection) -> None:
        rows = db.execute("SELECT id, body FROM responses WHERE status IN (?, ?)",
                          UNFINISHED).fetchall()
        for rid, raw in rows:
            body = orjson.loads(raw)
            body.update(status="failed", error=_LOST)
            db.execute("UPDATE responses SET status = ?, body = ? WHERE id = ?",
                       ("failed", orjson.dumps(body), rid))
        if rows:
            log.warning("marked %d unfinished background responses failed", len(rows))

    def _get(self, response_id: str) -> StoredResponse | None:
        db = self._conn()
        self._evict_old(db)
        row = db.execute("SELECT body, messages FROM responses WHERE id = ?",
                         (response_id,)).fetchone()
        if row is None:
            return None
        return StoredResponse(orjson.loads(row[0]), orjson.loads(row[1]))

    def _put(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        db = self._conn()
        with db:  # one transaction: the row and the evictions it makes
            db.execute("BEGIN")
            db.execute("INSERT OR REPLACE INTO responses (id, created, status, body, messages) "
                       "VALUES (?, ?, ?, ?, ?)",
                       (body["id"], time.time(), body["status"], orjson.dumps(body),
                        orjson.dumps(messages)))
            self._evict_old(db)
            # The count comes from the small created index; the oldest rows go first.
            (count,) = db.execute("SELECT COUNT(*) FROM responses").fetchone()
            if count > self.max_count:
                db.execute("DELETE FROM responses WHERE rowid IN (SELECT rowid FROM "
                           "responses ORDER BY created, rowid LIMIT ?)",
                           (count - self.max_count,))

    def _update(self, body: dict[str, Any]) -> int:
        cur = self._conn().execute("UPDATE responses SET status = ?, body = ? WHERE id = ?",
                                   (body["status"], orjson.dumps(body), body["id"]))
        return cur.rowcount

    def _evict_old(self, db: sqlite3.Connection) -> None:
        if self.max_age > 0:
            db.execute("DELETE FROM responses WHERE created < ?", (time.time() - self.max_age,))
