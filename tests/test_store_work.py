"""Store work per iteration does not grow with the turn's length (issue 9; measured by ``bench/store_work.py``).

Every SQL statement the store runs inside a ``turnkit.model`` or ``tool:<name>`` activity is counted, with the rows
its ``SELECT`` returned. The read that builds the model request (the turn's context, bounded by ``sequence <=``) is
inherently as long as the conversation and is left out; everything else must cost the same at K = 2 and K = 8.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from temporalio import activity

import turnkit
from turnkit.model import ModelRequest, Result
from turnkit.runtime import TurnKit
from turnkit.store import Store
from turnkit.testing import ScriptedClient, call_tools


@turnkit.tool(recovery="replay_safe")
async def lookup(q: str) -> str:
    """Look something up.

    Args:
        q: The query.
    """
    return f"result for {q}"


def _looper(k: int) -> ScriptedClient:
    def script(request: ModelRequest) -> Result:
        done = 0
        for message in reversed(request.messages):
            if message.get("role") == "user":
                break
            done += message.get("role") == "tool"
        if done < k:
            return call_tools(("lookup", {"q": f"q{done}"}))
        return Result.build(text=f"done after {done}")

    return ScriptedClient(script)


Work = dict[tuple[str, str], list[int]]  # (activity type, activity id) -> [statements, rows read]


@contextmanager
def counting(store: Store) -> Iterator[Work]:
    """Statements and rows read per activity execution, the model request's context read excluded."""
    work: Work = defaultdict(lambda: [0, 0])
    context_read: dict[int, bool] = {}  # by cursor: whether its last statement read the request's context

    def activity_counts() -> list[int] | None:
        try:
            info = activity.info()
        except RuntimeError:
            return None
        return work[(info.activity_type, info.activity_id)]

    def row_read(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> tuple[Any, ...]:
        # Inline SQLite: the rows are fetched after the statement's event, one by one through the row factory.
        counts = activity_counts()
        if counts is not None and not context_read.get(id(cursor), False):
            counts[1] += 1
        return row

    def after(_conn: Any, cursor: Any, statement: str, _params: Any, _context: Any, _many: bool) -> None:
        counts = activity_counts()
        if counts is None:
            return
        text = " ".join(statement.split()).lower()
        if "pg_notify(" in text:
            return  # the live transport's (turnkit/store/live.py), sent only while someone watches: not store work
        context_read[id(cursor)] = context = (
            text.startswith("select") and "from turnkit_messages" in text and "turnkit_messages.sequence <=" in text
        )
        if context:
            return  # the context of the request: as long as the conversation, by nature
        counts[0] += 1
        if text.startswith("select"):
            # SQLAlchemy's asyncpg cursor keeps the rows; a direct statement's cursor has their count (PostgreSQL's
            # "SELECT n"): turnkit/store/postgres_direct.py.
            rows = getattr(cursor, "_rows", None)
            counts[1] += len(rows) if rows is not None else max(getattr(cursor, "rowcount", 0), 0)

    raw = store.inline.dbapi_connection if store.inline is not None else None
    if raw is not None:
        raw.row_factory = row_read
    for engine in store.sync_engines:
        event.listen(engine, "after_cursor_execute", after)
    try:
        yield work
    finally:
        for engine in store.sync_engines:
            event.remove(engine, "after_cursor_execute", after)
        if raw is not None:
            raw.row_factory = None


async def _turn_work(tk: TurnKit, k: int) -> tuple[list[list[int]], list[list[int]]]:
    """[statements, rows read] of each model call and each tool call of one K-iteration turn, in order."""
    agent = turnkit.Agent(f"store_work_{k}", model="scripted", tools=[lookup], client=_looper(k), compaction=False)
    with counting(tk.store) as work:
        turn = await (await tk.conversation(agent)).ask("go")
        assert turn.status == "completed" and turn.output_text == f"done after {k}", turn.error
        by_type = {
            kind: [counts for (t, _), counts in work.items() if t == kind] for kind in ("turnkit.model", "tool:lookup")
        }
    model, tools = by_type["turnkit.model"], by_type["tool:lookup"]
    assert len(model) == k + 1 and len(tools) == k
    # Every call reads rows (the turn, its execution...): a count of zero would mean the rows went uncounted.
    assert all(rows > 0 for _, rows in model + tools), (model, tools)
    return model, tools


async def test_store_work_per_model_and_tool_call_does_not_grow_with_the_turn(tk: TurnKit) -> None:
    """issue 9: the reads per model call at K = 8 are those at K = 2 (no listing of the turn's messages or tree)."""
    short_model, short_tools = await _turn_work(tk, 2)
    long_model, long_tools = await _turn_work(tk, 8)
    # A model call that proposes a tool call, late in the turn, costs what the second one of a short turn does; so
    # does the final answer, and every tool call.
    assert long_model[-2] == short_model[-2] == short_model[1]
    assert long_model[-1] == short_model[-1]
    assert long_tools[-1] == short_tools[-1] == short_tools[0]
    assert all(call == long_tools[0] for call in long_tools)


async def test_store_transactions_per_model_and_tool_call(tk: TurnKit) -> None:
    """issue 9: a model call opens two store transactions (the reserve, which also reads what the prompt shows, and
    the persist) and the final answer one more (what its end signals: callback and waiters together); a tool call
    two (the reserve, which also reads its stored arguments, and the commit).

    Live streaming is off here: on PostgreSQL its ``NOTIFY`` batches go through the same engine, one autocommit
    statement per batch of deltas and one ``committed`` per call (docs/design.md, "Streaming"), and are no part of the
    store's transactions."""
    turnkit.configure(stream_model_calls=False)
    agent = turnkit.Agent("store_trips", model="scripted", tools=[lookup], client=_looper(2), compaction=False)
    transactions: dict[tuple[str, str], int] = defaultdict(int)

    def begin(_conn: Any) -> None:
        try:
            info = activity.info()
        except RuntimeError:
            return
        transactions[(info.activity_type, info.activity_id)] += 1

    for engine in tk.store.sync_engines:
        event.listen(engine, "begin", begin)
    try:
        turn = await (await tk.conversation(agent)).ask("go")
    finally:
        for engine in tk.store.sync_engines:
            event.remove(engine, "begin", begin)
    assert turn.status == "completed", turn.error
    by_type: dict[str, list[int]] = defaultdict(list)
    for (kind, _), count in sorted(transactions.items(), key=lambda item: int(item[0][1])):
        by_type[kind].append(count)
    assert by_type["turnkit.model"] == [2, 2, 3]
    assert by_type["tool:lookup"] == [2, 2]


async def test_a_tool_call_reads_no_conversation_row_from_the_database(tk: TurnKit) -> None:
    """issue 9: a tool call sends no read of its conversation's row: a function tool without a ``ToolContext`` does
    not need it, and one with a context (which shows the subject; tests/test_prompt.py) takes the row the store
    keeps (a conversation row never changes once committed: ``Store.conversation_rows``)."""
    seen: list[dict[str, Any] | None] = []

    @turnkit.tool(name="lookup", recovery="replay_safe")
    async def lookup_with_context(q: str, context: turnkit.ToolContext) -> str:
        """Look something up, knowing the subject.

        Args:
            q: The query.
        """
        seen.append(context.subject)
        return f"result for {q}"

    reads: dict[str, list[str]] = {}
    for name, tool in (("plain", lookup), ("with_context", lookup_with_context)):
        agent = turnkit.Agent(f"context_{name}", model="scripted", tools=[tool], client=_looper(1), compaction=False)
        conversation = await tk.conversation(agent, subject={"type": "ticket", "id": "T-1"})
        statements: list[str] = []

        def after(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            try:
                if activity.info().activity_type == "tool:lookup":
                    statements.append(" ".join(statement.split()).lower())  # noqa: B023 (listener removed below)
            except RuntimeError:
                return

        for engine in tk.store.sync_engines:
            event.listen(engine, "after_cursor_execute", after)
        try:
            turn = await conversation.ask("go")
        finally:
            for engine in tk.store.sync_engines:
                event.remove(engine, "after_cursor_execute", after)
        assert turn.status == "completed", turn.error
        # The row's reads, not the lock that the result's append takes on PostgreSQL (which reads the row as well).
        row_reads = [s for s in statements if s.startswith("select turnkit_conversations.id as id")]
        reads[name] = [s for s in row_reads if "for update" not in s]
    assert reads == {"plain": [], "with_context": []}
    assert seen == [{"type": "ticket", "id": "T-1"}]
