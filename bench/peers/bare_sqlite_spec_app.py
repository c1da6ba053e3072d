"""The workload on bare Temporal with the spec's record in SQLite: :mod:`bench.peers.bare_pg_spec_app`'s floor on
TurnKit's embedded store, not a peer.

The same four transactions per iteration (a model request reserved before the call and its answer and charge
committed after it, a tool execution opened before the tool runs and settled by compare-and-set after it), each a
``BEGIN IMMEDIATE`` (SQLite's write lock, as TurnKit's store takes it) and a ``COMMIT``, through the standard
library's :mod:`sqlite3` on one connection in the worker's event loop thread, with TurnKit's pragmas (WAL,
``synchronous=NORMAL``), in a file of a temporary directory. No ORM and no logic around the statements: what the
spec's record costs on SQLite at the least.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
from collections.abc import Callable, Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from temporalio import activity

from bench.peers import bare_app, workload
from bench.peers.bare_pg_spec_app import EXECUTIONS, MESSAGES, TURNS, answer_record, opens, reserves

_CREATE = [
    f"""CREATE TABLE IF NOT EXISTS {TURNS} (
        id TEXT PRIMARY KEY,
        status TEXT NOT NULL,
        iterations INTEGER NOT NULL DEFAULT 0,
        request_id TEXT,
        cost_micros INTEGER NOT NULL DEFAULT 0,
        next_sequence INTEGER NOT NULL DEFAULT 1,
        updated_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
    )""",
    f"""CREATE TABLE IF NOT EXISTS {MESSAGES} (
        turn_id TEXT NOT NULL,
        sequence INTEGER NOT NULL,
        role TEXT NOT NULL,
        request_id TEXT,
        payload TEXT NOT NULL,
        PRIMARY KEY (turn_id, sequence),
        UNIQUE (turn_id, request_id)
    )""",
    f"""CREATE TABLE IF NOT EXISTS {EXECUTIONS} (
        turn_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        status TEXT NOT NULL,
        result TEXT,
        PRIMARY KEY (turn_id, call_id)
    )""",
]
_SUBMIT_TURN = f"INSERT INTO {TURNS} (id, status) VALUES (?, 'pending') ON CONFLICT DO NOTHING"
_SUBMIT_MESSAGE = (
    f"INSERT INTO {MESSAGES} (turn_id, sequence, role, payload) VALUES (?, 0, 'user', ?) ON CONFLICT DO NOTHING"
)
_RESERVE_LOOK = f"""
SELECT t.status, t.iterations, t.request_id,
       (SELECT json_group_array(json(m.payload)) FROM
           (SELECT payload FROM {MESSAGES} WHERE turn_id = t.id ORDER BY sequence) AS m)
FROM {TURNS} t WHERE t.id = ?
"""
_RESERVE = (
    f"UPDATE {TURNS} SET status = 'running', iterations = iterations + 1, request_id = ?,"
    " updated_at = CURRENT_TIMESTAMP WHERE id = ?"
)
_PERSIST_LOOK = f"""
SELECT t.status, (SELECT m.payload FROM {MESSAGES} m WHERE m.turn_id = t.id AND m.request_id = ?)
FROM {TURNS} t WHERE t.id = ?
"""
_CHARGE = (
    f"UPDATE {TURNS} SET next_sequence = next_sequence + 1, cost_micros = cost_micros + ?, status = ?,"
    " updated_at = CURRENT_TIMESTAMP WHERE id = ? AND request_id = ? RETURNING next_sequence - 1"
)
_APPEND = f"INSERT INTO {MESSAGES} (turn_id, sequence, role, request_id, payload) VALUES (?, ?, ?, ?, ?)"
_OPEN_LOOK = f"""
SELECT t.status, (SELECT e.status FROM {EXECUTIONS} e WHERE e.turn_id = t.id AND e.call_id = ?),
       (SELECT count(*) FROM {EXECUTIONS} e WHERE e.turn_id = t.id)
FROM {TURNS} t WHERE t.id = ?
"""
_OPEN = f"INSERT INTO {EXECUTIONS} (turn_id, call_id, status) VALUES (?, ?, 'running') ON CONFLICT DO NOTHING"
_SETTLE = (
    f"UPDATE {EXECUTIONS} SET status = 'completed', result = ? WHERE turn_id = ? AND call_id = ? AND status = 'running'"
    " RETURNING 1"
)
_NEXT_SEQUENCE = (
    f"UPDATE {TURNS} SET next_sequence = next_sequence + 1, updated_at = CURRENT_TIMESTAMP WHERE id = ?"
    " RETURNING next_sequence - 1"
)


class System(bare_app.System):
    """Bare Temporal with the spec's record in SQLite, for :mod:`bench.peers.serve`."""

    name = "bare-sqlite-spec"

    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory(prefix="bench-sqlite-spec-")
        self.path = Path(self._tmp.name) / "record.db"
        self._db: sqlite3.Connection | None = None

    def activities(self) -> list[Callable[..., Any]]:
        return [self.model, self.lookup]

    async def open(self, address: str) -> None:
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        # TurnKit's store's pragmas (turnkit/store/engine.py), copied: this process holds no TurnKit module.
        for pragma in ("journal_mode=WAL", "busy_timeout=60000", "synchronous=NORMAL"):
            self._db.execute(f"PRAGMA {pragma}").close()
        for statement in _CREATE:
            self._db.execute(statement).close()
        await super().open(address)

    @contextmanager
    def _transaction(self) -> Generator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` on the one connection (rolled back when the block raises)."""
        assert self._db is not None
        self._db.execute("BEGIN IMMEDIATE").close()
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK").close()
            raise
        self._db.execute("COMMIT").close()

    async def _before_start(self, workflow_id: str, prompt: str) -> None:
        """The submit: the turn and its message in one transaction, before its workflow starts."""
        with self._transaction() as db:
            db.execute(_SUBMIT_TURN, (workflow_id,)).close()
            db.execute(_SUBMIT_MESSAGE, (workflow_id, json.dumps({"text": prompt}))).close()

    @activity.defn(name="model")
    async def model(self, call: bare_app.ModelCall) -> bare_app.ModelAnswer:
        """Reserve the request, ask the scripted model, commit its answer and charge once."""
        info = activity.info()
        turn_id, request_id = info.workflow_id, info.activity_id
        with self._transaction() as db:
            if reserves(turn_id, request_id, db.execute(_RESERVE_LOOK, (turn_id,)).fetchone()):
                db.execute(_RESERVE, (request_id, turn_id)).close()
        answer = await bare_app.model(call)
        payload, status = answer_record(answer)
        with self._transaction() as db:
            _status, committed = db.execute(_PERSIST_LOOK, (request_id, turn_id)).fetchone() or (None, None)
            if committed is None:
                charged = db.execute(_CHARGE, (1, status, turn_id, request_id)).fetchall()
                for (sequence,) in charged:  # none when the request is not the turn's reserved one
                    db.execute(_APPEND, (turn_id, sequence, "assistant", request_id, payload)).close()
        return answer

    @activity.defn(name=workload.TOOL_NAME)
    async def lookup(self, q: str) -> str:
        """Open the call's execution, run the tool, settle the execution by compare-and-set."""
        info = activity.info()
        turn_id, call_id = info.workflow_id, info.activity_id
        with self._transaction() as db:
            if opens(turn_id, call_id, db.execute(_OPEN_LOOK, (call_id, turn_id)).fetchone()):
                db.execute(_OPEN, (turn_id, call_id)).close()
        result = await bare_app.lookup(q)
        content = json.dumps({"q": q, "result": result})
        with self._transaction() as db:
            if db.execute(_SETTLE, (content, turn_id, call_id)).fetchall():
                [(sequence,)] = db.execute(_NEXT_SEQUENCE, (turn_id,)).fetchall()
                db.execute(_APPEND, (turn_id, sequence, "tool", None, content)).close()
        return result

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            if self._db is not None:
                self._db.close()
            self._tmp.cleanup()
