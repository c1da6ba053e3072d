"""The workload on bare Temporal with the least record that keeps TurnKit's promises in PostgreSQL: a third floor.

:mod:`bench.peers.bare_pg_app` records each step as one row in autocommit: the least any durable record costs. The
spec's promises ask more of a record, and this floor pays exactly that much, through asyncpg with no ORM and no
logic around it, on the same workflow and activities as :mod:`bench.peers.bare_app`:

- **before a paid model call**, a transaction that locks the turn, reads its transcript (payloads carry ids, not
  transcripts), checks the iteration budget and records the request (so a retried request is known);
- **after it**, a transaction that locks the turn, looks for a response already committed for the request (a
  response is never requested again) and appends the response with its charge, once;
- **before an at-most-once tool's effect**, a transaction that locks the turn, counts the turn's tool executions
  (the tool budget) and creates the execution ``running``, once;
- **after it**, a transaction that locks the turn and settles the execution by compare-and-set ``running →
  completed``, appending the tool result only if the compare-and-set won.

Four transactions per iteration, each ``BEGIN``, a lock-and-look statement, one write and a WAL-flushing
``COMMIT``: four round trips, where TurnKit's store sends four to six. What this floor costs above
:mod:`bench.peers.bare_pg_app` is what the spec's record costs PostgreSQL and the driver; what TurnKit costs above
this floor is its own code (see bench/README.md, "The spec's record as a floor").

The tables (``bench_spec_*``) are created in the database of ``--postgres-url`` when the system opens, and emptied
then, so that each run's rows can be counted after it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import asyncpg
from temporalio import activity

from bench.peers import bare_app, bare_pg_app, workload

TURNS, MESSAGES, EXECUTIONS = "bench_spec_turn", "bench_spec_message", "bench_spec_execution"

#: The iteration budget each reserve checks (TurnKit's default ``max_iterations`` is far above the workload's K).
MAX_ITERATIONS = 50

_CREATE = [
    f"""CREATE TABLE IF NOT EXISTS {TURNS} (
        id text PRIMARY KEY,
        status text NOT NULL,
        iterations integer NOT NULL DEFAULT 0,
        request_id text,
        cost_micros bigint NOT NULL DEFAULT 0,
        next_sequence integer NOT NULL DEFAULT 1,
        updated_at timestamptz NOT NULL DEFAULT now()
    )""",
    f"""CREATE TABLE IF NOT EXISTS {MESSAGES} (
        turn_id text NOT NULL,
        sequence integer NOT NULL,
        role text NOT NULL,
        request_id text,
        payload jsonb NOT NULL,
        PRIMARY KEY (turn_id, sequence),
        UNIQUE (turn_id, request_id)
    )""",
    f"""CREATE TABLE IF NOT EXISTS {EXECUTIONS} (
        turn_id text NOT NULL,
        call_id text NOT NULL,
        status text NOT NULL,
        result jsonb,
        PRIMARY KEY (turn_id, call_id)
    )""",
]

_SUBMIT = (
    f"INSERT INTO {TURNS} (id, status) VALUES ($1, 'pending') ON CONFLICT DO NOTHING;"
    f" INSERT INTO {MESSAGES} (turn_id, sequence, role, payload) VALUES ($1, 0, 'user', $2) ON CONFLICT DO NOTHING"
)
# The turn locked, with its transcript: one statement.
_RESERVE_LOOK = f"""
SELECT t.status, t.iterations, t.request_id,
       (SELECT coalesce(json_agg(m.payload ORDER BY m.sequence), '[]') FROM {MESSAGES} m WHERE m.turn_id = t.id)
FROM {TURNS} t WHERE t.id = $1 FOR UPDATE
"""
_RESERVE = (
    f"UPDATE {TURNS} SET status = 'running', iterations = iterations + 1, request_id = $2, updated_at = now()"
    " WHERE id = $1"
)
# The turn locked, with the response already committed for this request, if any.
_PERSIST_LOOK = f"""
SELECT t.status, (SELECT m.payload FROM {MESSAGES} m WHERE m.turn_id = t.id AND m.request_id = $2)
FROM {TURNS} t WHERE t.id = $1 FOR UPDATE
"""
_PERSIST = f"""
WITH charged AS (
    UPDATE {TURNS} SET next_sequence = next_sequence + 1, cost_micros = cost_micros + $3, status = $4,
        updated_at = now()
    WHERE id = $1 AND request_id = $2 RETURNING next_sequence - 1 AS sequence
)
INSERT INTO {MESSAGES} (turn_id, sequence, role, request_id, payload)
SELECT $1, sequence, 'assistant', $2, $5 FROM charged
"""
# The turn locked, with the call's execution and the turn's count of executions (the tool budget).
_OPEN_LOOK = f"""
SELECT t.status, (SELECT e.status FROM {EXECUTIONS} e WHERE e.turn_id = t.id AND e.call_id = $2),
       (SELECT count(*) FROM {EXECUTIONS} e WHERE e.turn_id = t.id)
FROM {TURNS} t WHERE t.id = $1 FOR UPDATE
"""
_OPEN = f"INSERT INTO {EXECUTIONS} (turn_id, call_id, status) VALUES ($1, $2, 'running') ON CONFLICT DO NOTHING"
_COMMIT_LOCK = f"SELECT status FROM {TURNS} WHERE id = $1 FOR UPDATE"
_COMMIT = f"""
WITH settled AS (
    UPDATE {EXECUTIONS} SET status = 'completed', result = $3
    WHERE turn_id = $1 AND call_id = $2 AND status = 'running' RETURNING 1
), appended AS (
    UPDATE {TURNS} SET next_sequence = next_sequence + 1, updated_at = now()
    WHERE id = $1 AND EXISTS (SELECT 1 FROM settled) RETURNING next_sequence - 1 AS sequence
)
INSERT INTO {MESSAGES} (turn_id, sequence, role, payload) SELECT $1, sequence, 'tool', $3 FROM appended
"""


def reserves(turn_id: str | None, request_id: str, look: Any) -> bool:
    """Whether the reserve's look (status, iterations, reserved request, transcript) asks for ``request_id`` to be
    reserved now: not for a retry of the request already reserved; raises for a turn that has ended or is over its
    iteration budget."""
    status, iterations, reserved, _transcript = look or (None, 0, None, None)
    if status not in ("pending", "running"):
        raise RuntimeError(f"turn {turn_id} is {status}")
    if reserved == request_id:  # a retry of a reserved request counts no new iteration
        return False
    if iterations >= MAX_ITERATIONS:
        raise RuntimeError(f"turn {turn_id} is over its iteration budget")
    return True


def answer_record(answer: bare_app.ModelAnswer) -> tuple[str, str]:
    """The stored answer (JSON) and the turn's status after it."""
    if answer.query is not None:
        return json.dumps({"query": answer.query}), "running"
    return json.dumps({"text": answer.text}), "completed"


def opens(turn_id: str | None, call_id: str, look: Any) -> bool:
    """Whether the open's look (turn status, the call's execution status, the turn's count of executions) asks for
    the execution to be created now: not when a retry finds it running; raises for a call already settled."""
    _status, execution, _count = look or (None, None, 0)
    if execution is not None and execution != "running":
        raise RuntimeError(f"call {call_id} of turn {turn_id} is already {execution}")
    return execution is None


class System(bare_pg_app.System):
    """Bare Temporal with the spec's record in PostgreSQL, for :mod:`bench.peers.serve`."""

    name = "bare-pg-spec"

    async def _create_tables(self, connection: asyncpg.pool.PoolConnectionProxy) -> None:
        for statement in _CREATE:
            await connection.execute(statement)
        await connection.execute(f"TRUNCATE {TURNS}, {MESSAGES}, {EXECUTIONS}")

    def activities(self) -> list[Callable[..., Any]]:
        return [self.model, self.lookup]

    async def _before_start(self, workflow_id: str, prompt: str) -> None:
        """The submit, as TurnKit's client writes the turn and its message before it starts the workflow (whose id
        is the turn's): both in one round trip."""
        assert self._pool is not None
        submit = _SUBMIT.replace("$1", _literal(workflow_id)).replace("$2", _literal(json.dumps({"text": prompt})))
        async with self._pool.acquire() as connection:
            await connection.execute(submit)

    @activity.defn(name="model")
    async def model(self, call: bare_app.ModelCall) -> bare_app.ModelAnswer:
        """Reserve the request, ask the scripted model, commit its answer and charge once."""
        assert self._pool is not None
        info = activity.info()
        turn_id, request_id = info.workflow_id, info.activity_id
        async with self._pool.acquire() as connection, connection.transaction():
            if reserves(turn_id, request_id, await connection.fetchrow(_RESERVE_LOOK, turn_id)):
                await connection.execute(_RESERVE, turn_id, request_id)
        answer = await bare_app.model(call)
        payload, status = answer_record(answer)
        async with self._pool.acquire() as connection, connection.transaction():
            _status, committed = await connection.fetchrow(_PERSIST_LOOK, turn_id, request_id) or (None, None)
            if committed is None:
                await connection.execute(_PERSIST, turn_id, request_id, 1, status, payload)
        return answer

    @activity.defn(name=workload.TOOL_NAME)
    async def lookup(self, q: str) -> str:
        """Open the call's execution, run the tool, settle the execution by compare-and-set."""
        assert self._pool is not None
        info = activity.info()
        turn_id, call_id = info.workflow_id, info.activity_id
        async with self._pool.acquire() as connection, connection.transaction():
            if opens(turn_id, call_id, await connection.fetchrow(_OPEN_LOOK, turn_id, call_id)):
                await connection.execute(_OPEN, turn_id, call_id)
        result = await bare_app.lookup(q)
        async with self._pool.acquire() as connection, connection.transaction():
            await connection.fetchrow(_COMMIT_LOCK, turn_id)
            await connection.execute(_COMMIT, turn_id, call_id, json.dumps({"q": q, "result": result}))
        return result


def _literal(value: str) -> str:
    """``value`` as a SQL string literal, for the submit's two statements in one simple-protocol round trip."""
    return "'" + value.replace("'", "''") + "'"
