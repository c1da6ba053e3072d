"""The store contract (behaviour §2.8 to §2.10, §10 T75, T76, T99, T100) on SQLite and PostgreSQL.

Every test runs once per backend through the ``database_url`` fixture. The PostgreSQL database is shared by the
whole session, so tests only look at records they created (fresh ids, unique agent names and keys).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import re
import sqlite3
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import event, func, inspect, select, text
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, StatementError

from turnkit._engine.ids import new_claim_token, new_id
from turnkit.kernel.errors import RecordNotFound, ToolError
from turnkit.kernel.records import (
    CANCELLABLE_TURN_STATUSES,
    TERMINAL_TURN_STATUSES,
    ConversationRecord,
    TreeUsage,
    TurnRecord,
)
from turnkit.store import Store, sqlite_inline, sqlite_trips
from turnkit.store.direct import CompiledStatement, DirectCursor
from turnkit.store.errors import transient_store_error
from turnkit.store.postgres_direct import DRIVER_TRANSACTION
from turnkit.store.rows import NewRow
from turnkit.store.schema import Base, ConversationRow, MessageRow, ToolExecutionRow, TurnRow
from turnkit.store.statements import TURN_OR_UNFINISHED_OF_CONVERSATION
from turnkit.store.store import KeptRows, Look

ID_RE = r"[0-9a-f]{24}"


def _name(prefix: str = "agent") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def _conversation(store: Store, **attrs: Any) -> ConversationRecord:
    attrs.setdefault("agent_name", _name())
    async with store.atomic() as tx:
        return await tx.create_conversation(**attrs)


async def _turn(store: Store, conversation_id: str, **attrs: Any) -> TurnRecord:
    attrs.setdefault("agent_name", "agent")
    async with store.atomic(conversation_id=conversation_id) as tx:
        return await tx.create_turn(conversation_id=conversation_id, **attrs)


async def _count(store: Store, column: Any, *where: Any) -> int:
    async with store.atomic() as tx:
        return int(await tx.connection.scalar(select(func.count(column)).where(*where)) or 0)


# 1. Ids --------------------------------------------------------------------------------------------------------------


async def test_ids_have_spec_prefixes_and_24_lowercase_hex(store: Store) -> None:
    for kind, prefix in [
        ("conversation", "conv"),
        ("message", "msg"),
        ("turn", "turn"),
        ("tool_execution", "tool"),
        ("delivery", "delivery"),
    ]:
        generated = {new_id(kind) for _ in range(20)}  # type: ignore[arg-type]
        assert len(generated) == 20
        for value in generated:
            assert re.fullmatch(rf"{prefix}_{ID_RE}", value), value
    assert re.fullmatch(r"[0-9a-f]{32}", new_claim_token())

    # The store allocates ids of that shape for every record type it names.
    conversation = await _conversation(store)
    message = await store.append_message(conversation.id, role="user", text="hi")
    turn = await _turn(store, conversation.id)
    async with store.atomic() as tx:
        execution, _ = await tx.create_tool_execution(turn_id=turn.id, tool_call_id="call-1", tool_name="echo")
        delivery, _ = await tx.create_delivery(
            source_conversation_id=conversation.id,
            destination_conversation_id=conversation.id,
            key=_name("key"),
            payload={"text": "x"},
        )
    assert re.fullmatch(rf"conv_{ID_RE}", conversation.id)
    assert re.fullmatch(rf"msg_{ID_RE}", message.id)
    assert re.fullmatch(rf"turn_{ID_RE}", turn.id)
    assert re.fullmatch(rf"tool_{ID_RE}", execution.id)
    assert re.fullmatch(rf"delivery_{ID_RE}", delivery.id)
    assert turn.root_turn_id == turn.id  # root defaults to the turn itself
    assert turn.status == "pending" and turn.options.stored() == {} and turn.usage == {}
    assert execution.status == "pending" and execution.arguments == {}


# 2. Idempotent creates -----------------------------------------------------------------------------------------------


async def test_create_with_existing_id_returns_existing_and_writes_nothing(store: Store) -> None:
    conversation_id = new_id("conversation")
    first = await _conversation(store, id=conversation_id, agent_name="alpha", model="m1", metadata={"a": 1})
    again = await _conversation(store, id=conversation_id, agent_name="beta", model="m2", metadata={"b": 2})
    assert again.model_dump() == first.model_dump()
    assert (await store.load_conversation(conversation_id)).agent_name == "alpha"
    assert await _count(store, ConversationRow.id, ConversationRow.uid == conversation_id) == 1

    turn_id = new_id("turn")
    turn = await _turn(store, conversation_id, id=turn_id, model="m1", options={"x": 1})
    turn_again = await _turn(store, conversation_id, id=turn_id, model="m2", options={"y": 2}, status="running")
    assert turn_again.model_dump() == turn.model_dump()
    loaded = await store.load_turn(turn_id)
    assert loaded.status == "pending" and loaded.model == "m1" and loaded.options.stored() == {"x": 1}
    assert await _count(store, TurnRow.id, TurnRow.uid == turn_id) == 1

    message_id = new_id("message")
    message = await store.append_message(conversation_id, id=message_id, role="user", text="first")
    message_again = await store.append_message(conversation_id, id=message_id, role="assistant", text="second")
    assert message_again.model_dump() == message.model_dump()
    messages = await store.list_messages(conversation_id)
    assert [(m.id, m.sequence, m.role, m.content) for m in messages] == [
        (message_id, 1, "user", [{"type": "text", "text": "first"}])
    ]


async def test_concurrent_creates_with_the_same_id_return_one_record(store: Store) -> None:
    """A retried activity racing its zombie: every creator gets the same record, and one row exists."""
    conversation_id, turn_id, message_id = new_id("conversation"), new_id("turn"), new_id("message")
    conversations = await asyncio.gather(*(_conversation(store, id=conversation_id) for _ in range(6)))
    assert len({c.id for c in conversations}) == 1
    assert await _count(store, ConversationRow.id, ConversationRow.uid == conversation_id) == 1

    turns = await asyncio.gather(*(_turn(store, conversation_id, id=turn_id) for _ in range(6)))
    assert len({t.id for t in turns}) == 1
    assert await _count(store, TurnRow.id, TurnRow.uid == turn_id) == 1

    async def append(text: str) -> Any:
        async with store.atomic() as tx:  # no conversation lock taken up front by the caller
            return await tx.append_message(conversation_id, id=message_id, role="user", text=text)

    messages = await asyncio.gather(*(append(f"m{i}") for i in range(6)))
    assert len({(m.id, m.sequence, m.text) for m in messages}) == 1
    assert [m.sequence for m in await store.list_messages(conversation_id)] == [1]

    async def wait() -> Any:
        async with store.atomic() as tx:
            return await tx.create_wait(turn_id=turn_id, target_turn_id="turn_target")

    waits = await asyncio.gather(*(wait() for _ in range(6)))
    assert sum(created for _, created in waits) == 1
    async with store.atomic() as tx:
        assert len(await tx.list_waits(turn_id=turn_id)) == 1


# 3. append_message validation ----------------------------------------------------------------------------------------


async def test_append_message_validations(store: Store) -> None:
    conversation = await _conversation(store)
    with pytest.raises(ValueError, match="unknown message role"):
        await store.append_message(conversation.id, role="system", text="x")
    with pytest.raises(ValueError, match="unknown message kind"):
        await store.append_message(conversation.id, role="user", kind="video", text="x")
    assert await store.list_messages(conversation.id) == []

    missing = new_id("conversation")
    with pytest.raises(RecordNotFound):
        await store.append_message(missing, role="user", text="lost")
    assert await _count(store, MessageRow.id, MessageRow.conversation_uid == missing) == 0

    first = await store.append_message(conversation.id, role="user", text="hello")
    assert first.sequence == 1
    assert first.content == [{"type": "text", "text": "hello"}]
    assert first.text == "hello"
    assert first.kind == "text" and first.turn_id is None
    untyped = await store.append_message(conversation.id, role="assistant", content=[{"text": "no type"}])
    assert untyped.sequence == 2
    assert untyped.content == [{"type": "text", "text": "no type"}]


# 4. Concurrent appends -----------------------------------------------------------------------------------------------


async def test_fifty_concurrent_appends_get_sequences_1_to_50(store: Store) -> None:
    conversation = await _conversation(store)
    results = await asyncio.gather(
        *(store.append_message(conversation.id, role="user", text=f"m{i}") for i in range(50))
    )
    assert sorted(m.sequence for m in results) == list(range(1, 51))
    assert len({m.id for m in results}) == 50
    stored = await store.list_messages(conversation.id)
    assert [m.sequence for m in stored] == list(range(1, 51))
    assert sorted(m.text for m in stored) == sorted(f"m{i}" for i in range(50))
    # Each returned record matches what was stored under its sequence.
    by_sequence = {m.sequence: m.id for m in stored}
    assert all(by_sequence[m.sequence] == m.id for m in results)


@pytest.mark.parametrize("returning", [True, False], ids=["insert-returning", "no-insert-returning"])
async def test_an_append_reads_the_latest_sequence_in_its_insert(
    store: Store, returning: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 9: with ``INSERT … RETURNING`` an append is one statement (its sequence computed in the INSERT, after the
    conversation's lock on PostgreSQL); a SQLite without it reads the latest sequence first. Either way concurrent
    appends get gap-free sequences and a missing conversation is RecordNotFound with nothing written."""
    if not returning and store.dialect == "postgresql":
        pytest.skip("PostgreSQL always has INSERT … RETURNING: the fallback serves a SQLite older than 3.35")
    monkeypatch.setattr(store.engine.dialect, "insert_returning", returning)
    conversation = await _conversation(store)
    sent, stop = _statements(store)
    try:
        async with store.atomic(conversation_id=conversation.id) as tx:
            before = len(sent)
            await tx.append_message(conversation.id, role="user", text="first")
            assert sent[before:] == (["INSERT"] if returning else ["SELECT", "INSERT"])
    finally:
        stop()
    appended = await asyncio.gather(
        *(store.append_message(conversation.id, role="user", text=f"m{i}") for i in range(8))
    )
    assert sorted(m.sequence for m in appended) == list(range(2, 10))
    assert [m.sequence for m in await store.list_messages(conversation.id)] == list(range(1, 10))
    missing = new_id("conversation")
    with pytest.raises(RecordNotFound):
        await store.append_message(missing, role="user", text="lost")
    assert await _count(store, MessageRow.id, MessageRow.conversation_uid == missing) == 0


async def test_an_append_with_an_existing_id_or_a_second_tool_result_writes_nothing(store: Store) -> None:
    """Issue 9: an append with an explicit id, and an execution's tool result, check for the existing message inside
    their INSERT (one statement after the conversation's lock); only when nothing was inserted does a read tell the
    existing message (returned, nothing written) from a missing conversation (RecordNotFound)."""
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id)
    message_id = new_id("message")
    sent, stop = _statements(store)
    try:
        async with store.atomic(conversation_id=conversation.id) as tx:
            before = len(sent)
            first = await tx.append_message(conversation.id, role="user", text="once", id=message_id)
            assert sent[before:] == ["INSERT"]
            again = await tx.append_message(conversation.id, role="user", text="twice", id=message_id)
            assert sent[before + 1 :] == ["INSERT", "SELECT"]  # nothing inserted: the existing message is read
            assert again == first
            result, created = await tx.append_tool_result(
                conversation.id, turn_id=turn.id, tool_execution_id="ex_1", content=[{"text": "a"}], metadata={}
            )
            assert created and result.sequence == 2 and result.kind == "tool_result" and result.role == "tool"
            repeat, created = await tx.append_tool_result(
                conversation.id, turn_id=turn.id, tool_execution_id="ex_1", content=[{"text": "b"}], metadata={}
            )
            assert not created and repeat == result
    finally:
        stop()
    assert [m.text for m in await store.list_messages(conversation.id)] == ["once", "a"]
    missing = new_id("conversation")
    with pytest.raises(RecordNotFound):
        await store.append_message(missing, role="user", text="lost", id=new_id("message"))
    with pytest.raises(RecordNotFound):
        async with store.atomic() as tx:
            await tx.append_tool_result(missing, turn_id=turn.id, tool_execution_id="ex_2", content=[], metadata={})
    assert await _count(store, MessageRow.id, MessageRow.conversation_uid == missing) == 0


async def test_concurrent_tool_results_of_one_execution_append_one_message(store: Store) -> None:
    """Every call gets one result: two transactions appending the same execution's result at once (a zombie attempt
    and its retry) write one message; the second sees the first's, after the conversation's lock."""
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id)

    async def append(text: str) -> tuple[str, bool]:
        async with store.atomic() as tx:
            message, created = await tx.append_tool_result(
                conversation.id, turn_id=turn.id, tool_execution_id="ex_race", content=[{"text": text}], metadata={}
            )
            return message.id, created

    results = await asyncio.gather(
        *(asyncio.create_task(append(f"r{i}"), context=contextvars.Context()) for i in range(6))
    )
    assert sum(created for _, created in results) == 1
    assert len({message_id for message_id, _ in results}) == 1
    assert len(await store.list_messages(conversation.id)) == 1


async def test_concurrent_appends_to_two_conversations_stay_gap_free(store: Store) -> None:
    a = await _conversation(store)
    b = await _conversation(store)
    calls = [store.append_message(conv.id, role="user", text=f"{i}") for i in range(20) for conv in (a, b)]
    await asyncio.gather(*calls)
    for conv in (a, b):
        assert [m.sequence for m in await store.list_messages(conv.id)] == list(range(1, 21))


# 5. update_turn whitelist --------------------------------------------------------------------------------------------


async def test_update_turn_whitelist_status_and_updated_at(store: Store) -> None:
    """T99: ``update_turn(id, bogus=True)`` raises "unknown turn update attributes" and ``status="lost"`` "unknown turn
    status", leaving the turn unchanged; a valid update is stored and moves ``updated_at``."""
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id, options={"keep": {"me": True}})
    async with store.atomic() as tx:
        with pytest.raises(ValueError, match="unknown turn update attributes"):
            await tx.update_turn(turn.id, bogus=True)
        with pytest.raises(ValueError, match="unknown turn status"):
            await tx.update_turn(turn.id, status="lost")
        with pytest.raises(ValueError, match="unknown turn update attributes"):
            await tx.update_turn(turn.id, agent_name="other")  # a real column, but not updatable
    loaded = await store.load_turn(turn.id)
    assert loaded.status == "pending" and loaded.updated_at == turn.updated_at

    async with store.atomic() as tx:
        updated = await tx.update_turn(
            turn.id, status="failed", error={"class": "X", "message": "boom"}, output_text="out", cost=0.25
        )
    assert updated.status == "failed"
    assert updated.updated_at > turn.updated_at
    reloaded = await store.load_turn(turn.id)
    assert reloaded.model_dump() == updated.model_dump()
    assert reloaded.error == {"class": "X", "message": "boom"}
    assert reloaded.options.stored() == {"keep": {"me": True}}
    assert reloaded.created_at == turn.created_at

    async with store.atomic() as tx:
        with pytest.raises(RecordNotFound):
            await tx.update_turn(new_id("turn"), status="running")


# 6. Claims (CAS) -----------------------------------------------------------------------------------------------------


async def _claim_turn(store: Store, turn_id: str, **kwargs: Any) -> TurnRecord | None:
    async with store.atomic() as tx:
        return await tx.claim_turn(turn_id, **kwargs)


async def test_claim_turn_is_compare_and_set(store: Store) -> None:
    """T100: of two ``claim_turn`` calls on a pending turn, the first returns it running and the second returns None;
    ``started_at`` and the claim token keep the first claim's values."""
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id)
    started = datetime.now(UTC)
    first = await _claim_turn(store, turn.id, claim_token="a" * 32, started_at=started)
    assert first is not None
    assert first.status == "running" and first.claim_token == "a" * 32
    assert first.updated_at > turn.updated_at
    second = await _claim_turn(store, turn.id, claim_token="b" * 32, started_at=started + timedelta(seconds=5))
    assert second is None
    stored = await store.load_turn(turn.id)
    assert stored.claim_token == "a" * 32
    assert stored.started_at == first.started_at
    assert abs(stored.started_at - started) < timedelta(milliseconds=1)  # type: ignore[operator]

    # Rotation (from == to) and several accepted source statuses.
    rotated = await _claim_turn(store, turn.id, from_="running", to="running", claim_token="c" * 32)
    assert rotated is not None and rotated.claim_token == "c" * 32 and rotated.updated_at > stored.updated_at
    assert rotated.started_at == stored.started_at
    assert await _claim_turn(store, turn.id, from_=["pending", "waiting"], to="running") is None
    with pytest.raises(ValueError, match="unknown turn status"):
        await _claim_turn(store, turn.id, from_="running", to="lost")
    assert await _claim_turn(store, new_id("turn")) is None


async def test_concurrent_claim_turn_exactly_one_wins(store: Store) -> None:
    """T50 (SQLite and PostgreSQL): ten concurrent claims of one pending turn: exactly one claim token wins and is
    the one stored."""
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id)
    tokens = [new_claim_token() for _ in range(10)]
    results = await asyncio.gather(*(_claim_turn(store, turn.id, claim_token=token) for token in tokens))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    stored = await store.load_turn(turn.id)
    assert stored.status == "running"
    assert stored.claim_token == winners[0].claim_token


async def test_tree_cost_counts_from_the_row_as_written_over_not_as_read_unlocked(store: Store) -> None:
    """Root-tree counters (issue 9, one read per turn write fewer): a turn write may count its change from the row its
    transaction read, but on PostgreSQL only from a row it had locked; a cost another writer committed after an
    unlocked read is counted from, not counted twice."""
    if store.dialect != "postgresql":
        pytest.skip("SQLite serialises writers (BEGIN IMMEDIATE): no other writer commits inside a transaction")
    conversation = await _conversation(store)
    root = await _turn(store, conversation.id)
    child = await _turn(store, conversation.id, root_turn_id=root.id)

    async def other_writer() -> None:
        async with store.atomic() as tx:
            await tx.update_turn(child.id, cost=1.0)

    async with store.atomic() as tx:
        assert (await tx.find_turn(child.id)) is not None  # read without a lock: cost 0
        # A task with a context of its own: its atomic() opens a second transaction instead of joining this one.
        await asyncio.create_task(other_writer(), context=contextvars.Context())
        await tx.update_turn(child.id, cost=3.0)
    async with store.atomic() as tx:
        assert (await tx.tree_usage(root.id)).cost == 3.0  # 1.0, then 3.0 over it: not 1.0 + 3.0


async def test_tool_counts_count_from_the_root_row_as_read_locked_and_never_as_read_unlocked(store: Store) -> None:
    """Root-tree counters (issue 9, one read per tool call fewer): a tool call counts its execution from the root's
    by-name counts its transaction read under the root's lock; read without it (PostgreSQL), an execution another
    writer committed meanwhile is counted from the row, not lost."""
    conversation = await _conversation(store)
    root = await _turn(store, conversation.id)
    child = await _turn(store, conversation.id, root_turn_id=root.id)

    async def other_writer() -> None:
        async with store.atomic(turn_id=root.id) as tx:
            await tx.create_tool_execution(turn_id=child.id, tool_call_id="other", tool_name="echo", status="running")

    async with store.atomic(turn_id=root.id) as tx:  # the root's lock: its counts are read once
        await tx.load_turn(child.id)
        assert (await tx.tree_usage(root.id)).tool_executions_by_name == {}
        for call in ("a", "b"):
            await tx.create_tool_execution(turn_id=child.id, tool_call_id=call, tool_name="echo", status="running")
    if store.dialect == "postgresql":
        async with store.atomic() as tx:  # no lock: another writer may count in between
            await tx.load_turn(child.id)
            assert (await tx.tree_usage(root.id)).tool_executions_by_name == {"echo": 2}
            await asyncio.create_task(other_writer(), context=contextvars.Context())
            await tx.create_tool_execution(turn_id=child.id, tool_call_id="c", tool_name="echo", status="running")
    async with store.atomic() as tx:
        usage = await tx.tree_usage(root.id)
        tree = await tx.list_turns(root_turn_id=root.id)
        executions = [e for t in tree for e in await tx.list_tool_executions(turn_id=t.id)]
    assert usage == TreeUsage.from_records(tree, executions)
    assert usage.tool_executions_by_name == {"echo": 4 if store.dialect == "postgresql" else 2}


async def test_claim_tool_execution_first_commit_wins(store: Store) -> None:
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id)
    async with store.atomic() as tx:
        execution, created = await tx.create_tool_execution(
            turn_id=turn.id, tool_call_id="call-1", tool_name="echo", status="running"
        )
    assert created

    async def claim(to: str, **attrs: Any) -> Any:
        async with store.atomic() as tx:
            return await tx.claim_tool_execution(execution.id, from_="running", to=to, **attrs)

    now = datetime.now(UTC)
    results = await asyncio.gather(
        claim("completed", result={"ok": True}, completed_at=now),
        claim("interrupted", error={"message": "interrupted"}, completed_at=now),
    )
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    stored = await _load_execution(store, execution.id)
    assert stored.status == winners[0].status
    if stored.status == "completed":
        assert stored.result == {"ok": True} and stored.error is None
    else:
        assert stored.status == "interrupted" and stored.error == {"message": "interrupted"} and stored.result is None

    # Sequentially: once terminal, a late result loses.
    assert await claim("completed", result={"late": True}) is None
    assert (await _load_execution(store, execution.id)).model_dump() == stored.model_dump()
    async with store.atomic() as tx:
        with pytest.raises(ValueError, match="unknown tool execution update attributes"):
            await tx.claim_tool_execution(execution.id, from_="completed", to="failed", tool_name="x")
        with pytest.raises(ValueError, match="unknown tool execution status"):
            await tx.claim_tool_execution(execution.id, to="lost")


async def _load_execution(store: Store, execution_id: str) -> Any:
    async with store.atomic() as tx:
        return await tx.load_tool_execution(execution_id)


# 7. Tool executions: get-or-create -----------------------------------------------------------------------------------


async def test_create_tool_execution_is_get_or_create(store: Store) -> None:
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id)
    async with store.atomic() as tx:
        first, created = await tx.create_tool_execution(
            turn_id=turn.id, tool_call_id="call-1", tool_name="echo", arguments={"b": 1, "a": {"c": [1, 2]}}
        )
    assert created and first.arguments == {"a": {"c": [1, 2]}, "b": 1}
    async with store.atomic() as tx:
        again, created_again = await tx.create_tool_execution(
            turn_id=turn.id, tool_call_id="call-1", tool_name="other", arguments={"z": 0}, status="running"
        )
    assert not created_again
    assert again.model_dump() == first.model_dump()
    # Same call id on another turn is a different execution.
    other_turn = await _turn(store, conversation.id)
    async with store.atomic() as tx:
        other, other_created = await tx.create_tool_execution(
            turn_id=other_turn.id, tool_call_id="call-1", tool_name="echo"
        )
    assert other_created and other.id != first.id


async def test_concurrent_create_tool_execution_yields_one_row(store: Store) -> None:
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id)

    async def create(i: int) -> Any:
        async with store.atomic() as tx:
            return await tx.create_tool_execution(
                turn_id=turn.id, tool_call_id="call-x", tool_name="echo", arguments={"i": i}
            )

    results = await asyncio.gather(*(create(i) for i in range(10)))
    assert sum(created for _, created in results) == 1
    assert len({record.id for record, _ in results}) == 1
    assert await _count(store, ToolExecutionRow.id, ToolExecutionRow.turn_uid == turn.id) == 1


# 8. Listing ----------------------------------------------------------------------------------------------------------


async def test_list_messages_filters_and_order(store: Store) -> None:
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id)
    other_turn = await _turn(store, conversation.id)
    spec = [None, None, None, turn.id, other_turn.id, turn.id, None]  # sequences 1..7
    for i, owner in enumerate(spec, start=1):
        role = "user" if owner is None else "assistant"
        await store.append_message(conversation.id, role=role, text=f"m{i}", turn_id=owner)
    # Noise in another conversation must never show up.
    noise = await _conversation(store)
    await store.append_message(noise.id, role="user", text="noise", turn_id=turn.id)

    def seqs(messages: list[Any]) -> list[int]:
        return [m.sequence for m in messages]

    assert seqs(await store.list_messages(conversation.id)) == [1, 2, 3, 4, 5, 6, 7]
    # messages_for_turn: the frozen context (sequence <= 2) plus the turn's own messages.
    assert seqs(await store.list_messages(conversation.id, through_sequence=2, turn_id=turn.id)) == [1, 2, 4, 6]
    assert seqs(await store.list_messages(conversation.id, through_sequence=2)) == [1, 2]
    assert seqs(await store.list_messages(conversation.id, through_sequence=0, turn_id=other_turn.id)) == [5]
    async with store.atomic() as tx:
        assert seqs(await tx.list_messages(conversation.id, after_sequence=4)) == [5, 6, 7]
        assert seqs(await tx.list_messages(conversation.id, after_sequence=7)) == []
        assert seqs(await tx.list_messages(conversation.id, through_sequence=5, after_sequence=2)) == [3, 4, 5]
        assert await tx.latest_message_sequence(conversation.id) == 7
        assert await tx.latest_message_sequence(new_id("conversation")) == 0


async def test_list_turns_filters_are_anded_and_ordered(store: Store) -> None:
    c1 = await _conversation(store)
    c2 = await _conversation(store)
    alpha, beta = _name("alpha"), _name("beta")
    root = await _turn(store, c1.id, agent_name=alpha)
    child_a = await _turn(store, c2.id, agent_name=alpha, root_turn_id=root.id, parent_turn_id=root.id)
    child_b = await _turn(store, c2.id, agent_name=beta, root_turn_id=root.id, parent_turn_id=root.id)
    grandchild = await _turn(store, c1.id, agent_name=beta, root_turn_id=root.id, parent_turn_id=child_b.id)
    unrelated = await _turn(store, c1.id, agent_name=alpha)

    def ids(turns: list[TurnRecord]) -> list[str]:
        return [t.id for t in turns]

    assert ids(await store.list_turns(root_turn_id=root.id)) == [root.id, child_a.id, child_b.id, grandchild.id]
    assert ids(await store.list_turns(conversation_id=c1.id)) == [root.id, grandchild.id, unrelated.id]
    assert ids(await store.list_turns(agent_name=alpha)) == [root.id, child_a.id, unrelated.id]
    assert ids(await store.list_turns(root_turn_id=root.id, agent_name=beta)) == [child_b.id, grandchild.id]
    assert ids(await store.list_turns(root_turn_id=root.id, conversation_id=c2.id, agent_name=alpha)) == [child_a.id]
    assert ids(await store.list_turns(conversation_id=c2.id, agent_name=_name("nobody"))) == []
    assert ids(await store.list_turns(conversation_id=c1.id, has_parent=True)) == [grandchild.id]
    assert ids(await store.list_turns(conversation_id=c1.id, has_parent=False)) == [root.id, unrelated.id]
    async with store.atomic() as tx:
        await tx.claim_turn(child_b.id, from_="pending", to="running")
    assert ids(await store.list_turns(root_turn_id=root.id, statuses=["running", "waiting"])) == [child_b.id]
    assert ids(await store.list_turns(conversation_id=c2.id, statuses=[])) == []
    # Ordering is created_at, then id: insertion order here.
    listed = await store.list_turns(root_turn_id=root.id)
    assert [(t.created_at, t.id) for t in listed] == sorted((t.created_at, t.id) for t in listed)


async def test_list_tool_executions_by_turn_and_root_tree(store: Store) -> None:
    conversation = await _conversation(store)
    root = await _turn(store, conversation.id)
    child = await _turn(store, conversation.id, root_turn_id=root.id, parent_turn_id=root.id)
    grandchild = await _turn(store, conversation.id, root_turn_id=root.id, parent_turn_id=child.id)
    other_root = await _turn(store, conversation.id)
    created: list[str] = []
    async with store.atomic() as tx:
        for turn in (root, child, grandchild, root, other_root):
            record, _ = await tx.create_tool_execution(
                turn_id=turn.id, tool_call_id=f"call-{len(created)}", tool_name="echo"
            )
            created.append(record.id)
    tree = await store.list_tool_executions(root_turn_id=root.id)
    assert [e.id for e in tree] == created[:4]
    assert [e.id for e in await store.list_tool_executions(turn_id=root.id)] == [created[0], created[3]]
    assert [e.id for e in await store.list_tool_executions(turn_id=grandchild.id)] == [created[2]]
    assert [e.id for e in await store.list_tool_executions(root_turn_id=other_root.id)] == [created[4]]


# 9. Deliveries (T75, T76) --------------------------------------------------------------------------------------------


async def test_delivery_key_idempotency_and_conflicts(store: Store) -> None:
    """T75: retrying alice's delivery key "request-1" with the same content returns the same delivery; reusing it for
    another route or changed content raises ``ToolError`` whose text excludes alice's content, and 1 delivery exists."""
    alice = await _conversation(store)
    bob = await _conversation(store)
    dest = await _conversation(store)
    key = _name("request-1")
    secret = "alice-secret-content-7f3a"

    async def deliver(source: str, destination: str, payload: dict[str, Any], turn: str | None = None) -> Any:
        async with store.atomic() as tx:
            return await tx.create_delivery(
                source_conversation_id=source,
                destination_conversation_id=destination,
                source_turn_id=turn,
                key=key,
                payload=payload,
            )

    original, created = await deliver(alice.id, dest.id, {"text": secret})
    assert created and original.delivered_at is None and original.message_id is None
    retry, created_again = await deliver(alice.id, dest.id, {"text": secret})
    assert not created_again and retry.model_dump() == original.model_dump()

    conflicts = [
        (bob.id, dest.id, {"text": "bob's message"}, None),  # another route and content
        (bob.id, dest.id, {"text": secret}, None),  # another source
        (alice.id, bob.id, {"text": secret}, None),  # another destination
        (alice.id, dest.id, {"text": secret + "!"}, None),  # changed content
        (alice.id, dest.id, {"text": secret, "principal": "x"}, None),  # extra payload key
        (alice.id, dest.id, {"text": secret}, new_id("turn")),  # another source turn
    ]
    for source, destination, payload, turn in conflicts:
        with pytest.raises(ToolError, match="delivery key is already used for a different message") as info:
            await deliver(source, destination, payload, turn)
        assert secret not in str(info.value)
        assert "bob's message" not in str(info.value)

    async with store.atomic() as tx:
        listed = await tx.list_deliveries(destination_conversation_id=dest.id)
        assert [d.id for d in listed] == [original.id]
        assert [d.id for d in await tx.list_deliveries(source_conversation_id=alice.id)] == [original.id]
        assert await tx.list_deliveries(source_conversation_id=bob.id) == []
        assert (await tx.load_delivery(original.id)).payload == {"text": secret}


async def test_delivery_payload_key_order_is_canonicalised(store: Store) -> None:
    """T76: the same delivery with its payload keys in another order, or keyed by ints instead of strings, is treated
    as the same delivery (JSON canonicalisation); a different value under the same key is a conflict."""
    conversation = await _conversation(store)
    key = _name("k")
    async with store.atomic() as tx:
        first, created = await tx.create_delivery(
            source_conversation_id=conversation.id,
            destination_conversation_id=conversation.id,
            key=key,
            payload={"b": 1, "a": 2, "nested": {"y": [1, {"q": 1, "p": 2}], "x": None}},
        )
    async with store.atomic() as tx:
        second, created_again = await tx.create_delivery(
            source_conversation_id=conversation.id,
            destination_conversation_id=conversation.id,
            key=key,
            payload={"nested": {"x": None, "y": [1, {"p": 2, "q": 1}]}, "a": 2, "b": 1},
        )
    assert created and not created_again
    assert second.id == first.id
    # T76: non-string keys are stringified (the gem's symbol and string keys): a payload keyed by ints, or by ints
    # and strings mixed, is the same delivery as its string-keyed twin.
    other = _name("k")
    string_keyed = {"1": "one", "nested": {"2": [True], "b": None}, "7": None}
    int_keyed = {1: "one", "nested": {2: [True], "b": None}, 7: None}
    mixed_keys = {"1": "one", "nested": {2: [True], "b": None}, 7: None}
    deliveries = []
    for payload in (string_keyed, int_keyed, mixed_keys):
        async with store.atomic() as tx:
            deliveries.append(
                await tx.create_delivery(
                    source_conversation_id=conversation.id,
                    destination_conversation_id=conversation.id,
                    key=other,
                    payload=payload,
                )
            )
    assert [created for _, created in deliveries] == [True, False, False]
    assert len({record.id for record, _ in deliveries}) == 1 and deliveries[0][0].id != first.id
    assert deliveries[1][0].payload == string_keyed
    # ... and the payload is really compared: another value under the same key is a different message.
    with pytest.raises(ToolError, match="already used for a different message"):
        async with store.atomic() as tx:
            await tx.create_delivery(
                source_conversation_id=conversation.id,
                destination_conversation_id=conversation.id,
                key=other,
                payload={1: "two", "nested": {2: [True], "b": None}, 7: None},
            )


async def test_concurrent_create_delivery_same_key_one_row(store: Store) -> None:
    conversation = await _conversation(store)
    key = _name("k")

    async def create() -> Any:
        async with store.atomic() as tx:
            return await tx.create_delivery(
                source_conversation_id=conversation.id,
                destination_conversation_id=conversation.id,
                key=key,
                payload={"text": "hi"},
            )

    results = await asyncio.gather(*(create() for _ in range(8)))
    assert sum(created for _, created in results) == 1
    assert len({record.id for record, _ in results}) == 1


async def test_mark_delivered_is_compare_and_set(store: Store) -> None:
    conversation = await _conversation(store)
    async with store.atomic() as tx:
        delivery, _ = await tx.create_delivery(
            source_conversation_id=conversation.id,
            destination_conversation_id=conversation.id,
            key=_name("k"),
            payload={"text": "hi"},
        )
        other, _ = await tx.create_delivery(
            source_conversation_id=conversation.id,
            destination_conversation_id=conversation.id,
            key=_name("k"),
            payload={"text": "other"},
        )
    message = await store.append_message(conversation.id, role="user", text="hi", metadata={"delivery_id": delivery.id})
    async with store.atomic() as tx:
        pending = await tx.list_deliveries(destination_conversation_id=conversation.id, pending=True)
        assert [d.id for d in pending] == [delivery.id, other.id]
        marked = await tx.mark_delivered(delivery.id, message_id=message.id)
    assert marked is not None and marked.message_id == message.id and marked.delivered_at is not None
    async with store.atomic() as tx:
        assert await tx.mark_delivered(delivery.id, message_id=new_id("message")) is None
        stored = await tx.load_delivery(delivery.id)
        assert stored.message_id == message.id and stored.delivered_at == marked.delivered_at
        pending = await tx.list_deliveries(destination_conversation_id=conversation.id, pending=True)
        assert [d.id for d in pending] == [other.id]
        assert [d.id for d in await tx.list_deliveries(destination_conversation_id=conversation.id, limit=1)] == [
            delivery.id
        ]
        with pytest.raises(RecordNotFound):
            await tx.load_delivery(new_id("delivery"))


# 10. Waits -----------------------------------------------------------------------------------------------------------


async def test_waits_are_idempotent_and_filterable(store: Store) -> None:
    waiter, other_waiter = new_id("turn"), new_id("turn")
    target_a, target_b = new_id("turn"), new_id("turn")
    async with store.atomic() as tx:
        first, created = await tx.create_wait(turn_id=waiter, target_turn_id=target_a)
        again, created_again = await tx.create_wait(turn_id=waiter, target_turn_id=target_a)
        await tx.create_wait(turn_id=waiter, target_turn_id=target_b)
        await tx.create_wait(turn_id=other_waiter, target_turn_id=target_a)
    assert created and not created_again
    assert again.model_dump() == first.model_dump()
    async with store.atomic() as tx:
        again_later, created_later = await tx.create_wait(turn_id=waiter, target_turn_id=target_a)
        assert not created_later and again_later.created_at == first.created_at

        def pairs(waits: list[Any]) -> list[tuple[str, str]]:
            return [(w.turn_id, w.target_turn_id) for w in waits]

        assert pairs(await tx.list_waits(turn_id=waiter)) == [(waiter, target_a), (waiter, target_b)]
        assert pairs(await tx.list_waits(target_turn_id=target_a)) == [(waiter, target_a), (other_waiter, target_a)]
        assert pairs(await tx.list_waits(turn_id=other_waiter, target_turn_id=target_b)) == []
        assert pairs(await tx.list_waits(turn_id=waiter, target_turn_id=target_b)) == [(waiter, target_b)]


# 11. Atomicity -------------------------------------------------------------------------------------------------------


class _Boom(Exception):
    pass


async def test_atomic_rolls_back_every_write(store: Store) -> None:
    conversation = await _conversation(store)
    await store.append_message(conversation.id, role="user", text="kept")
    with pytest.raises(_Boom):
        async with store.atomic(conversation_id=conversation.id) as tx:
            await tx.append_message(conversation.id, role="user", text="one")
            second = await tx.append_message(conversation.id, role="assistant", text="two")
            assert second.sequence == 3
            raise _Boom
    stored = await store.list_messages(conversation.id)
    assert [(m.sequence, m.text) for m in stored] == [(1, "kept")]
    # The sequence allocator did not leak the rolled-back numbers.
    assert (await store.append_message(conversation.id, role="user", text="next")).sequence == 2


async def test_nested_atomic_joins_the_outer_transaction(store: Store) -> None:
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id)
    with pytest.raises(_Boom):
        async with store.atomic(conversation_id=conversation.id) as outer:
            await outer.append_message(conversation.id, role="user", text="outer")
            async with store.atomic(conversation_id=conversation.id, turn_id=turn.id) as inner:
                assert inner is outer
                await inner.update_turn(turn.id, status="running")
                await inner.append_message(conversation.id, role="assistant", text="inner")
            # The wrapper methods join too (one transaction per call only at the outermost level).
            joined = await store.append_message(conversation.id, role="user", text="wrapper")
            assert joined.sequence == 3
            assert (await store.load_turn(turn.id)).status == "running"
            raise _Boom
    assert await store.list_messages(conversation.id) == []
    assert (await store.load_turn(turn.id)).status == "pending"

    # Without an exception, the nested writes commit with the outer block.
    async with store.atomic(conversation_id=conversation.id) as outer, store.atomic() as inner:
        assert inner is outer
        await inner.append_message(conversation.id, role="user", text="committed")
    assert [m.text for m in await store.list_messages(conversation.id)] == ["committed"]


async def test_a_transaction_reads_its_own_writes(store: Store) -> None:
    """Issue 9 (docs/design.md "The store's SQL is built once"): reads are prebuilt Core selects and writes Core
    statements whose SET clause comes from their parameters; within one transaction each get-or-create that finds a
    record, each compare-and-set, each list and the tree's counters see every write before them."""
    conversation = await _conversation(store)
    async with store.atomic(conversation_id=conversation.id) as tx:
        first = await tx.append_message(conversation.id, role="user", text="hi", id=new_id("message"))
        assert (await tx.append_message(conversation.id, role="user", text="again", id=first.id)).text == "hi"
        turn = await tx.create_turn(conversation_id=conversation.id, agent_name="agent", id=new_id("turn"))
        assert (await tx.create_turn(conversation_id=conversation.id, agent_name="other", id=turn.id)) == turn
        claimed = await tx.claim_turn(turn.id, options={"state": {"iterations": 2}}, cost=0.5)
        assert claimed is not None and claimed.status == "running"
        assert await tx.claim_turn(turn.id) is None  # the compare-and-set sees its own write
        assert [t.status for t in await tx.list_turns(conversation_id=conversation.id)] == ["running"]
        execution, created = await tx.create_tool_execution(
            turn_id=turn.id, tool_call_id="call_1", tool_name="lookup", status="running"
        )
        assert (
            created and not (await tx.create_tool_execution(turn_id=turn.id, tool_call_id="call_1", tool_name="x"))[1]
        )
        await tx.claim_tool_execution(execution.id, to="failed", error={"message": "no"})
        assert [e.status for e in await tx.list_tool_executions(turn_id=turn.id)] == ["failed"]
        usage = await tx.tree_usage(turn.id)
        assert (usage.iterations, usage.cost) == (2, 0.5)
        tree = await tx.list_turns(root_turn_id=turn.id), await tx.list_tool_executions(root_turn_id=turn.id)
        assert usage == TreeUsage.from_records(*tree)
        delivery, _ = await tx.create_delivery(
            source_conversation_id=conversation.id,
            destination_conversation_id=conversation.id,
            key=_name("key"),
            payload={"text": "x"},
        )
        assert await tx.mark_delivered(delivery.id, message_id=first.id) is not None
        assert await tx.list_deliveries(destination_conversation_id=conversation.id, pending=True) == []
        assert (await tx.create_wait(turn_id=turn.id, target_turn_id=_name("turn")))[1]
        assert len(await tx.list_waits(turn_id=turn.id)) == 1
        await tx.put_media(b"bytes", mime_type="image/png")
        await tx.put_media(b"bytes", mime_type="image/png")
        assert [m.sequence for m in await tx.list_messages(conversation.id, through_sequence=0, turn_id=None)] == []


def _statements(store: Store) -> tuple[list[str], Callable[[], None]]:
    """Record the first word of each SQL statement the store sends (a BEGIN included), and how to stop."""
    sent: list[str] = []

    def on_statement(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement.split()[0].upper())

    def on_begin(conn: Any) -> None:
        options = conn.get_execution_options()
        # In autocommit no BEGIN is sent, but for the direct path's transactions, whose BEGIN goes to the driver.
        if options.get("isolation_level") != "AUTOCOMMIT" or options.get(DRIVER_TRANSACTION):
            sent.append("BEGIN")

    engines = store.sync_engines
    for engine in engines:
        event.listen(engine, "before_cursor_execute", on_statement)
        event.listen(engine, "begin", on_begin)

    def stop() -> None:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", on_statement)
            event.remove(engine, "begin", on_begin)

    return sent, stop


async def test_a_transaction_reads_a_turn_row_once_until_it_writes_it(store: Store) -> None:
    """Issue 9 (one round trip per reread fewer): a transaction that holds a turn's row (its lock on PostgreSQL, the
    writer lock on SQLite) reads it once; the lock itself reads it on PostgreSQL. Every write of the row (its own
    update, a tool execution or a child's cost counted on it as a root) is seen by the next read."""
    conversation = await _conversation(store)
    root = await _turn(store, conversation.id)
    child = await _turn(store, conversation.id, root_turn_id=root.id)
    sent, stop = _statements(store)
    try:
        async with store.atomic(turn_id=root.id) as tx:
            loaded = await tx.load_turn(root.id)
            assert loaded.id == root.id and (await tx.tree_usage(root.id)).tool_executions == 0
            assert sent == ["BEGIN", "SELECT"]  # one read: the lock's (PostgreSQL) or load_turn's (SQLite)
            await tx.create_tool_execution(turn_id=root.id, tool_call_id="a", tool_name="echo", status="running")
            assert (await tx.tree_usage(root.id)).tool_executions == 1  # the count's UPDATE is seen
            updated = await tx.update_turn(root.id, cost=0.25, options={"state": {"iterations": 3}})
            before = len(sent)
            assert await tx.load_turn(root.id) == updated  # the row as the UPDATE returned it
            assert (await tx.tree_usage(root.id)).cost == 0.25
            assert len(sent) == before  # no round trip for either
            await tx.update_turn(child.id, cost=0.5)  # counted on the root's row
            assert (await tx.tree_usage(root.id)).cost == 0.75
            assert (await tx.load_turn(child.id)).cost == 0.5
    finally:
        stop()
    async with store.atomic() as tx:
        assert (await tx.tree_usage(root.id)).cost == 0.75  # what the transaction read is what it committed
        assert (await tx.load_turn(root.id)).options.stored()["state"]["iterations"] == 3


async def test_a_conversation_and_a_turn_are_locked_in_one_statement_conversation_first(store: Store) -> None:
    """Issue 9: on PostgreSQL ``atomic(conversation_id=…, turn_id=…)`` locks both rows in one statement (the turn's
    row comes back for the transaction's reads), the conversation's first, as the two locks did: a transaction that
    waits there for the turn already holds its conversation. When either row is missing the two locks run as
    before, and the missing one raises RecordNotFound where it is read."""
    if store.dialect != "postgresql":
        pytest.skip("SQLite's BEGIN IMMEDIATE holds its one writer lock: no row locks to take")
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id)
    sent, stop = _statements(store)
    try:
        async with store.atomic(conversation_id=conversation.id, turn_id=turn.id) as tx:
            assert (await tx.load_turn(turn.id)).id == turn.id
            assert (await tx.load_conversation(conversation.id)).id == conversation.id
    finally:
        stop()
    assert sent == ["BEGIN", "SELECT"]  # the locks, the turn's read; the conversation's row was committed before

    holding, release = asyncio.Event(), asyncio.Event()

    async def hold_the_turn() -> None:
        async with store.atomic(turn_id=turn.id):
            holding.set()
            await release.wait()

    async def lock_both() -> str:
        await holding.wait()
        async with store.atomic(conversation_id=conversation.id, turn_id=turn.id) as tx:
            return (await tx.load_turn(turn.id)).id

    holder = asyncio.create_task(hold_the_turn(), context=contextvars.Context())
    both = asyncio.create_task(lock_both(), context=contextvars.Context())
    await holding.wait()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    probe = text("SELECT id FROM turnkit_conversations WHERE uid = :uid FOR UPDATE NOWAIT")
    while True:
        try:
            async with store.engine.connect() as connection, connection.begin():
                await connection.execute(probe, {"uid": conversation.id})
        except DBAPIError as error:  # lock_not_available: the transaction waiting for the turn holds it
            assert "lock" in str(error)
            break
        assert loop.time() < deadline, "the transaction waiting for the turn does not hold its conversation"
        await asyncio.sleep(0.02)
    assert not both.done()
    release.set()
    assert await both == turn.id
    await holder

    missing = new_id("conversation")
    with pytest.raises(RecordNotFound):
        async with store.atomic(conversation_id=missing, turn_id=turn.id) as tx:
            assert (await tx.load_turn(turn.id)).id == turn.id
            await tx.load_conversation(missing)


async def test_a_look_reads_the_response_or_the_execution_with_the_turn_lock_in_one_statement(store: Store) -> None:
    """Issue 9 (round trips per iteration): on PostgreSQL ``atomic(turn_id=…, look=Look.response(…))`` locks the
    turn's row and reads it with its response to a request in one statement (and which of a response's proposed call
    ids have an execution), and ``Look.execution`` the call's execution and the turn's latest response; the reads
    they answer send nothing, once. A write of a message or an
    execution in the transaction drops what the look read, and the next read goes to the database. SQLite reads them
    apart (no round trips to save): the answers are the same."""
    postgresql = store.dialect == "postgresql"
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id)
    request = str(uuid.uuid4())
    sent, stop = _statements(store)
    try:
        async with store.atomic(turn_id=turn.id, look=Look.response(turn.id, request)) as tx:
            assert (await tx.load_turn(turn.id)).id == turn.id
            assert await tx.find_response(turn.id, request) is None
            # PostgreSQL: the lock, the turn's row and the response in one statement.
            assert sent == (["BEGIN", "SELECT"] if postgresql else ["BEGIN", "SELECT", "SELECT"])
            response = await tx.append_message(
                conversation.id, role="assistant", text="hi", turn_id=turn.id, request_id=request
            )
            del sent[:]
            assert await tx.find_response(turn.id, request) == response  # the append dropped the look's "none"
            assert sent == ["SELECT"]
        del sent[:]
        async with store.atomic(turn_id=turn.id, look=Look.response(turn.id, request)) as tx:
            assert await tx.find_response(turn.id, request) == response
            assert sent == ["BEGIN", "SELECT"]
            assert await tx.find_response(turn.id, request) == response  # once: the second read is the database's
            assert sent == ["BEGIN", "SELECT", "SELECT"]
        del sent[:]
        async with store.atomic(turn_id=turn.id, look=Look.execution(turn.id, "call_1")) as tx:
            assert await tx.find_tool_execution(turn.id, "call_1") is None
            assert await tx.latest_response(turn.id) == response
            assert sent == (["BEGIN", "SELECT"] if postgresql else ["BEGIN", "SELECT", "SELECT"])
            created, _ = await tx.create_tool_execution(
                turn_id=turn.id, tool_call_id="call_1", tool_name="echo", status="running", found_absent=True
            )
        del sent[:]
        async with store.atomic(turn_id=turn.id, look=Look.execution(turn.id, "call_1")) as tx:
            found = await tx.find_tool_execution(turn.id, "call_1")
            assert found is not None and found.id == created.id
            # Read again on PostgreSQL: its status may have changed while the lock was awaited.
            assert sent == (["BEGIN", "SELECT", "SELECT"] if postgresql else ["BEGIN", "SELECT"])
        del sent[:]
        calls = Look.response(turn.id, str(uuid.uuid4()), ["call_2", "call_1", "call_1"])  # a response's proposed calls
        async with store.atomic(turn_id=turn.id, look=calls) as tx:
            assert await tx.existing_call_ids(turn.id, ["call_1", "call_2"]) == {"call_1"}
            assert sent == ["BEGIN", "SELECT"]  # PostgreSQL: the look's; SQLite (no lock): the read's
            assert await tx.existing_call_ids(turn.id, ["call_2"]) == set()  # other ids: the database's answer
            assert sent == ["BEGIN", "SELECT", "SELECT"]
    finally:
        stop()
    missing = new_id("turn")
    async with store.atomic(turn_id=missing, look=Look.response(missing, request)) as tx:
        assert await tx.find_turn(missing) is None  # a missing turn: nothing locked, nothing answered
        assert await tx.find_response(missing, request) is None


async def test_a_look_at_call_ids_needs_no_type_introspection_on_a_new_connection(store: Store) -> None:
    """Issue 37 (PostgreSQL's server CPU per turn): the look at which of a response's proposed call ids have an
    execution binds and returns them as TEXT[], which asyncpg decodes with its own codecs. As VARCHAR[] (the column's
    type) they made asyncpg run its type introspection query on every new connection: ~6-9 ms of the server's CPU
    and up to three more round trips, a turn's model reserve after its tools (``bench/pg_server_cost.py``)."""
    if store.dialect != "postgresql":
        pytest.skip("asyncpg's type introspection: PostgreSQL only")
    queries: list[str] = []

    def log(record: Any) -> None:
        queries.append(record.query)

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.driver_connection.add_query_logger(log)

    await store.engine.dispose()  # every statement below runs on a new connection, with the logger
    event.listen(store.engine.sync_engine, "connect", on_connect)
    try:
        conversation = await _conversation(store)
        turn = await _turn(store, conversation.id)
        async with store.atomic(turn_id=turn.id) as tx:
            await tx.create_tool_execution(
                turn_id=turn.id, tool_call_id="call_1", tool_name="echo", status="running", found_absent=True
            )
        await store.engine.dispose()
        look = Look.response(turn.id, str(uuid.uuid4()), ["call_1", "call_2"])
        async with store.atomic(turn_id=turn.id, look=look) as tx:
            assert await tx.existing_call_ids(turn.id, ["call_1", "call_2"]) == {"call_1"}
    finally:
        event.remove(store.engine.sync_engine, "connect", on_connect)
    assert queries  # the logger saw the connections' statements (its callbacks ran by the COMMIT's reply)
    # asyncpg's type lookup (its ``introspection`` module's queries, not a public name) reads each type's range
    # subtype: no statement of the store does.
    assert [query for query in queries if "range_subtype" in query] == []


async def test_a_tool_calls_paired_writes_are_one_statement_each_on_postgresql(store: Store) -> None:
    """Issue 9 (round trips per iteration): on PostgreSQL a new execution and its root's tool counts go in one
    statement (a tool call's reserve), and an open execution's completion and its tool-result message in another (its
    commit); SQLite writes them apart. The records are the same either way: an execution counted once; completed once,
    with one message, as ``result_message`` builds it for the execution as written; a create that finds the call's
    execution there counts nothing; a completion that lost its compare-and-set writes nothing; one whose execution
    has its message already returns that message."""
    postgresql = store.dialect == "postgresql"
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id, status="running")

    def result_message(execution: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return [{"type": "tool_result", "text": repr(execution.result), "status": execution.status}], {"n": 1}

    async def create(call_id: str) -> tuple[Any, bool]:
        async with store.atomic(turn_id=turn.id, look=Look.execution(turn.id, call_id)) as tx:
            absent = await tx.find_tool_execution(turn.id, call_id) is None
            del sent[:]
            return await tx.create_tool_execution(
                turn_id=turn.id, tool_call_id=call_id, tool_name="echo", status="running", found_absent=absent
            )

    async def complete(execution: Any, result: dict[str, Any]) -> Any:
        async with store.atomic(turn_id=turn.id, conversation_id=conversation.id) as tx:
            del sent[:]
            return await tx.complete_tool_execution(
                execution,
                conversation_id=conversation.id,
                result=result,
                completed_at=datetime.now(UTC),
                result_message=result_message,
            )

    async def tree_usage() -> tuple[int, dict[str, int]]:
        async with store.reads() as tx:
            usage = await tx.tree_usage(turn.id)
        return usage.tool_executions, usage.tool_executions_by_name

    sent, stop = _statements(store)
    try:
        execution, created = await create("call_1")
        assert created and execution.status == "running"
        assert sent == ["WITH"] if postgresql else "WITH" not in sent
        assert (await create("call_1")) == (execution, False)  # found: nothing written, nothing counted
        if postgresql:  # a creator that did not see it (it committed meanwhile): the conflict skips it, uncounted
            async with store.atomic(turn_id=turn.id) as tx:
                assert await tx.create_tool_execution(
                    turn_id=turn.id, tool_call_id="call_1", tool_name="echo", status="running", found_absent=True
                ) == (execution, False)
        assert await tree_usage() == (1, {"echo": 1})

        done = await complete(execution, {"answer": 42, "b": [1.5, None]})
        assert sent == ["WITH"] if postgresql else "WITH" not in sent
        assert done is not None
        settled, message, created = done
        assert (settled.status, settled.result, created) == ("completed", {"answer": 42, "b": [1.5, None]}, True)
        assert (message.content, message.metadata) == result_message(settled)
        assert message.sequence == 1 and message.tool_execution_id == execution.id and message.role == "tool"
        assert await store.list_messages(conversation.id) == [message]  # as stored
        async with store.reads() as tx:
            assert await tx.load_tool_execution(execution.id) == settled
        assert await complete(execution, {"answer": 43}) is None  # the compare-and-set lost: nothing written
        assert await store.list_messages(conversation.id) == [message]

        second, _ = await create("call_2")
        async with store.atomic(conversation_id=conversation.id) as tx:  # its message first (a repair's)
            first, _ = await tx.append_tool_result(
                conversation.id, turn_id=turn.id, tool_execution_id=second.id, content=[{"type": "x"}], metadata={}
            )
        done = await complete(second, {"answer": 1})
        assert done is not None and done[0].status == "completed" and done[1:] == (first, False)
        assert await store.list_messages(conversation.id) == [message, first]
    finally:
        stop()
    assert await tree_usage() == (2, {"echo": 2})


async def test_a_response_and_its_charge_are_one_statement_on_postgresql(store: Store) -> None:
    """Issue 9 (round trips per iteration): on PostgreSQL ``append_message_and_update_turn`` appends a model call's
    response and writes its turn's charge in one statement, with the conversation's lock and the turn's held (a model
    call's persist); SQLite writes them apart. The records are the same: the message with the next sequence, found
    as the request's response; the turn as written, its root's totals counted once; a message id that exists returns
    that message (the turn still written); a missing conversation raises RecordNotFound and nothing is written."""
    postgresql = store.dialect == "postgresql"
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id, status="running")
    message_id = new_id("message")

    async def respond(conversation_id: str, cost: float) -> tuple[Any, TurnRecord]:
        async with store.atomic(turn_id=turn.id, conversation_id=conversation_id) as tx:
            await tx.load_turn(turn.id)
            del sent[:]
            return await tx.append_message_and_update_turn(
                conversation_id,
                message={"id": message_id, "role": "assistant", "text": "hi", "turn_id": turn.id, "request_id": "r1"},
                turn_id=turn.id,
                turn_updates={"cost": cost, "usage": {"input_tokens": 3}},
            )

    async def recorded() -> tuple[list[Any], Any, TurnRecord, float]:
        async with store.reads() as tx:
            messages = await tx.list_messages(conversation.id)
            response = await tx.find_response(turn.id, "r1")
            return messages, response, await tx.load_turn(turn.id), (await tx.tree_usage(turn.id)).cost

    sent, stop = _statements(store)
    try:
        message, written = await respond(conversation.id, 0.5)
        assert sent == ["WITH"] if postgresql else "WITH" not in sent
        assert (message.id, message.sequence, message.role, message.turn_id) == (message_id, 1, "assistant", turn.id)
        assert (written.cost, written.usage) == (0.5, {"input_tokens": 3})
        assert await recorded() == ([message], message, written, 0.5)
        again, rewritten = await respond(conversation.id, 0.75)  # the id exists: that message, the turn written
        assert again == message and rewritten.cost == 0.75
        assert await recorded() == ([message], message, rewritten, 0.75)
    finally:
        stop()
    message_id = new_id("message")
    with pytest.raises(RecordNotFound, match="conversation not found"):
        await respond(new_id("conversation"), 2.0)
    assert await recorded() == ([message], message, rewritten, 0.75)


async def test_a_look_sees_what_a_writer_committed_while_it_waited_for_the_lock(store: Store) -> None:
    """Issue 9 (Look, PostgreSQL): a look's statement that waits for the turn's lock reads its parts from the snapshot
    it took before waiting. A response and an execution committed meanwhile, by the holder of the lock, are still
    found: the turn's row changed under the lock, so the look's "none" is not believed and the reads go to the
    database (a retried model call must find the response its lost attempt committed, never ask the model again)."""
    if store.dialect != "postgresql":
        pytest.skip("SQLite's BEGIN IMMEDIATE takes the writer lock before any read: no snapshot is older than it")
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id, status="running")
    request = str(uuid.uuid4())
    holding, release = asyncio.Event(), asyncio.Event()

    async def writer() -> None:  # a model call's persist and a tool call's reserve, as one holder of the lock
        async with store.atomic(turn_id=turn.id, conversation_id=conversation.id) as tx:
            await tx.append_message(conversation.id, role="assistant", text="hi", turn_id=turn.id, request_id=request)
            await tx.update_turn(turn.id, heartbeat_at=datetime.now(UTC))  # the response's charge
            await tx.create_tool_execution(turn_id=turn.id, tool_call_id="call_1", tool_name="echo", status="running")
            holding.set()
            await release.wait()

    async def look_response() -> Any:  # with the calls the response would propose (a model call's persist)
        async with store.atomic(turn_id=turn.id, look=Look.response(turn.id, request, ["call_1", "call_2"])) as tx:
            return await tx.find_response(turn.id, request), await tx.existing_call_ids(turn.id, ["call_2", "call_1"])

    async def look_execution() -> Any:
        async with store.atomic(turn_id=turn.id, look=Look.execution(turn.id, "call_1")) as tx:
            return await tx.find_tool_execution(turn.id, "call_1")

    holder = asyncio.create_task(writer(), context=contextvars.Context())
    await holding.wait()
    lookers = [asyncio.create_task(look(), context=contextvars.Context()) for look in (look_response, look_execution)]
    waiting = text(  # the statement's text is cut at 1 KB there: the turn's columns come first
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        " AND query LIKE 'SELECT turnkit_turns.id AS id, %'"
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        async with store.engine.connect() as connection:  # a new transaction: pg_stat_activity is read once in each
            if await connection.scalar(waiting) == 2:
                break
        assert loop.time() < deadline, "the looks' statements never waited for the turn's lock"
        await asyncio.sleep(0.02)
    release.set()
    await holder
    (response, call_ids), execution = await asyncio.gather(*lookers)
    assert response is not None and response.turn_id == turn.id
    assert execution is not None and execution.tool_call_id == "call_1"
    assert call_ids == {"call_1"}  # a proposed call whose id has an execution is renamed, never given that one


async def test_a_turn_read_in_a_savepoint_is_read_again_after_it(store: Store) -> None:
    """A savepoint may roll back what it wrote: a turn row read or written inside one is not reused after it."""
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id)
    async with store.atomic(turn_id=turn.id) as tx:
        await tx.load_turn(turn.id)
        with pytest.raises(_Boom):
            async with tx.connection.begin_nested():
                await tx.update_turn(turn.id, cost=9.0)
                assert (await tx.load_turn(turn.id)).cost == 9.0
                raise _Boom
        assert (await tx.load_turn(turn.id)).cost is None  # as before the savepoint


async def test_a_conversation_row_is_read_once_per_store(store: Store) -> None:
    """Issue 9: a conversation row never changes once committed, so the store reads it once: later transactions
    (a model call's prompt shows the conversation's subject) take it from memory. A conversation created by a
    transaction, or inside a savepoint, that rolls back is not kept: reading it again raises RecordNotFound."""
    conversation = await _conversation(store, subject={"type": "ticket", "id": "T-1"})
    sent, stop = _statements(store)
    try:
        async with store.atomic() as tx:
            assert (await tx.load_conversation(conversation.id)) == conversation
        async with store.atomic() as tx:
            assert (await tx.load_conversation(conversation.id)).subject == {"type": "ticket", "id": "T-1"}
        assert await store.load_conversation(conversation.id) == conversation
    finally:
        stop()
    assert sent.count("SELECT") == 1

    rolled_back = new_id("conversation")
    with pytest.raises(_Boom):
        async with store.atomic() as tx:
            await tx.create_conversation(agent_name="agent", id=rolled_back)
            await tx.lock(conversation_id=rolled_back)
            assert (await tx.load_conversation(rolled_back)).id == rolled_back
            raise _Boom
    in_savepoint = new_id("conversation")
    async with store.atomic() as tx:
        with pytest.raises(_Boom):
            async with tx.connection.begin_nested():
                await tx.create_conversation(agent_name="agent", id=in_savepoint)
                assert (await tx.load_conversation(in_savepoint)).id == in_savepoint
                raise _Boom
        with pytest.raises(RecordNotFound):
            await tx.load_conversation(in_savepoint)
    for absent in (rolled_back, in_savepoint):
        with pytest.raises(RecordNotFound):
            await store.load_conversation(absent)


def test_kept_rows_let_the_least_recently_read_go_past_their_limit() -> None:
    """``Store.conversation_rows`` is bounded: past its limit the row read least recently goes, a read counts."""
    kept = KeptRows(2)
    a, b, c = (SimpleNamespace(uid=uid) for uid in "abc")
    kept.keep(a)  # pyright: ignore[reportArgumentType]
    kept.keep(b)  # pyright: ignore[reportArgumentType]
    assert kept.get("a") is a  # read: b is now the least recently used
    kept.keep(c)  # pyright: ignore[reportArgumentType]
    assert (kept.get("a"), kept.get("b"), kept.get("c"), len(kept)) == (a, None, c, 2)


async def test_a_new_conversation_needs_no_transaction_on_postgresql(store: Store) -> None:
    """Issue 9: ``Store.create_conversation`` is one INSERT, alone in autocommit on PostgreSQL (no BEGIN, no COMMIT);
    a transaction on SQLite; inside a transaction of the task it joins it (and rolls back with it)."""
    sent, stop = _statements(store)
    try:
        created = await store.create_conversation(agent_name="agent", subject={"type": "ticket", "id": "T-2"})
    finally:
        stop()
    assert sent == (["INSERT"] if store.dialect == "postgresql" else ["BEGIN", "INSERT"])
    assert (await store.load_conversation(created.id)).subject == {"type": "ticket", "id": "T-2"}
    with pytest.raises(_Boom):
        async with store.atomic():
            joined = await store.create_conversation(agent_name="agent")
            raise _Boom
    with pytest.raises(RecordNotFound):
        await store.load_conversation(joined.id)


async def test_a_first_turn_asks_for_its_turn_and_any_other_in_one_read(store: Store) -> None:
    """Issue 9: ``find_turn_or_any`` answers a fresh conversation's first turn in one statement: the turn if it exists
    (a repeat after a lost commit reply), else whether the conversation has any other turn (its lane orders this
    one), else nothing."""
    conversation = await _conversation(store)
    other = await _conversation(store)
    turn_id = new_id("turn")
    async with store.atomic() as tx:
        assert await tx.find_turn_or_any(turn_id, conversation.id) == (None, False)
    await _turn(store, other.id)
    async with store.atomic() as tx:
        assert await tx.find_turn_or_any(turn_id, conversation.id) == (None, False)  # another conversation's turn
    first = await _turn(store, conversation.id)
    sent, stop = _statements(store)
    try:
        async with store.atomic() as tx:
            assert await tx.find_turn_or_any(turn_id, conversation.id) == (None, True)
            found, _ = await tx.find_turn_or_any(first.id, conversation.id)
            assert found is not None and found.id == first.id
    finally:
        stop()
    assert sent == ["BEGIN", "SELECT", "SELECT"]
    later = await _turn(store, conversation.id, id=turn_id)
    async with store.atomic() as tx:
        found, any_turn = await tx.find_turn_or_any(turn_id, conversation.id)
        assert found is not None and found.id == later.id and any_turn  # the turn itself first, not the older one


async def test_a_next_turn_finds_the_unfinished_turn_by_status_among_finished_ones(store: Store) -> None:
    """Issue 37 target 4: ``find_turn_or_any(unfinished=True)``, an idle conversation's next turn asking for an
    unfinished one, passes over the conversation's finished turns and finds a turn of every other status (``stale``
    too). On SQLite its read looks each of those statuses up in the (conversation, status) index: a conversation's
    thousandth turn reads no more than its second."""
    conversation = await _conversation(store)
    turn_id = new_id("turn")
    for status in TERMINAL_TURN_STATUSES:
        await _turn(store, conversation.id, status=status)
    async with store.atomic() as tx:
        assert await tx.find_turn_or_any(turn_id, conversation.id, unfinished=True) == (None, False)
    for status in CANCELLABLE_TURN_STATUSES:
        unfinished = await _turn(store, conversation.id, status=status)
        async with store.atomic() as tx:
            assert await tx.find_turn_or_any(turn_id, conversation.id, unfinished=True) == (None, True), status
            await tx.update_turn(unfinished.id, status="completed")
    if store.dialect == "postgresql":
        return  # PostgreSQL plans by the table's size: a small one is read whole, whatever the indexes
    statement = TURN_OR_UNFINISHED_OF_CONVERSATION.params(uid=turn_id, conversation_uid=conversation.id)
    query = str(statement.compile(dialect=sqlite_dialect(), compile_kwargs={"literal_binds": True}))
    async with store.atomic() as tx:
        plan = [str(row[-1]) for row in (await tx.connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {query}")).fetchall()]
    by_status = "USING INDEX ix_turnkit_turns_conversation_status (conversation_uid=? AND status=?)"
    assert f"SEARCH turnkit_turns {by_status}" in plan, plan


async def test_a_create_race_on_postgresql_costs_one_statement_and_keeps_the_transaction(store: Store) -> None:
    """Issue 9: on PostgreSQL a get-or-create inserts with ON CONFLICT DO NOTHING (no savepoint: one statement where
    three were). The loser of a race reads the winner's row and its transaction goes on; a conflict on another unique
    key than the natural one still raises IntegrityError."""
    if store.dialect != "postgresql":
        pytest.skip("SQLite's BEGIN IMMEDIATE leaves no race to lose: a plain INSERT")
    conversation = await _conversation(store)
    sent, stop = _statements(store)
    try:
        async with store.atomic() as tx:
            await tx.create_turn(conversation_id=conversation.id, agent_name="agent", id=new_id("turn"))
    finally:
        stop()
    assert sent == ["BEGIN", "SELECT", "INSERT"]  # the look, then the insert: no SAVEPOINT, no RELEASE

    turn_id = new_id("turn")
    winner_inserted, loser_may_insert = asyncio.Event(), asyncio.Event()

    async def winner() -> None:
        async with store.atomic() as tx:
            await tx.create_turn(conversation_id=conversation.id, agent_name="winner", id=turn_id)
            winner_inserted.set()
            await loser_may_insert.wait()  # commit once the loser has looked (its insert may wait on the index)

    async def loser() -> tuple[TurnRecord, str]:
        await winner_inserted.wait()
        async with store.atomic() as tx:
            assert await tx.find_turn(turn_id) is None  # the winner has not committed
            loser_may_insert.set()
            turn = await tx.create_turn(
                conversation_id=conversation.id, agent_name="loser", id=turn_id, found_absent=True
            )
            after = await tx.append_message(conversation.id, role="user", text="the transaction goes on")
            return turn, after.id

    _, (turn, message_id) = await asyncio.gather(
        asyncio.create_task(winner(), context=contextvars.Context()),
        asyncio.create_task(loser(), context=contextvars.Context()),
    )
    assert turn.agent_name == "winner"
    assert [m.id for m in await store.list_messages(conversation.id)] == [message_id]

    existing = await _turn(store, conversation.id)
    with pytest.raises(IntegrityError):
        async with store.atomic() as tx:
            # A row whose natural key is new but whose uid exists (a unique key that is not the one looked up).
            await tx._get_or_create(  # pyright: ignore[reportPrivateUsage]
                _none, lambda: NewRow(TurnRow, uid=existing.id, conversation_uid=conversation.id, agent_name="x")
            )


async def _none() -> None:
    return None


async def test_reads_need_no_transaction_on_postgresql(store: Store) -> None:
    """Issue 9: a read of the store's convenience wrappers, or ``Store.reads()``, sends no BEGIN and no COMMIT on
    PostgreSQL (autocommit; two round trips fewer); on SQLite it is a transaction. Inside a transaction it joins it
    and sees its writes."""
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id)
    sent, stop = _statements(store)
    try:
        assert (await store.load_turn(turn.id)).id == turn.id
        with pytest.raises(RecordNotFound):
            await store.load_turn(new_id("turn"))
        async with store.reads() as tx:
            assert await tx.list_messages(conversation.id) == []
            assert await tx.list_waits(target_turn_id=turn.id) == []
    finally:
        stop()
    if store.dialect == "postgresql":
        assert sent == ["SELECT"] * 4
    else:
        assert sent == ["BEGIN", "SELECT"] * 2 + ["BEGIN", "SELECT", "SELECT"]
    async with store.atomic() as tx:
        await tx.update_turn(turn.id, cost=1.5)
        async with store.reads() as joined:
            assert joined is tx
        assert (await store.load_turn(turn.id)).cost == 1.5  # the convenience read joins the transaction too
    assert (await store.load_turn(turn.id)).cost == 1.5


async def test_exception_in_nested_block_rolls_back_outer_writes_too(store: Store) -> None:
    conversation = await _conversation(store)
    with pytest.raises(_Boom):
        async with store.atomic(conversation_id=conversation.id) as outer:
            await outer.append_message(conversation.id, role="user", text="outer")
            async with store.atomic(conversation_id=conversation.id) as inner:
                await inner.append_message(conversation.id, role="user", text="inner")
                raise _Boom
    assert await store.list_messages(conversation.id) == []


# 12. Round-trips -----------------------------------------------------------------------------------------------------


def _assert_utc(value: datetime | None) -> None:
    assert value is not None
    assert value.tzinfo is not None and value.utcoffset() == timedelta(0), value


async def test_timestamps_json_and_cost_round_trip(store: Store) -> None:
    metadata = {"principal": {"user": "u1", "roles": ["a", "b"]}, "n": 1.5, "flag": False, "none": None}
    conversation = await _conversation(store, metadata=metadata, subject={"type": "Account", "id": 42})
    nested_options = {
        "budget_limits": {"max_iterations": 5, "max_tool_executions_by_name": {"echo": 2}},
        "state": {"phase": "tools", "parts": [{"type": "tool_call", "arguments": {"deep": [1, [2, {"x": "é"}]]}}]},
        "controls": {"pause_requested": False, "inputs": []},
    }
    turn = await _turn(store, conversation.id, options=nested_options)
    local = datetime(2026, 1, 2, 12, 30, 45, 123456, tzinfo=UTC).astimezone(timezone(timedelta(hours=5, minutes=30)))
    async with store.atomic() as tx:
        await tx.update_turn(
            turn.id,
            cost=0.123456,
            usage={"input_tokens": 10, "cost_details": {"total": 0.123456}},
            output_data={"list": [1, 2, {"k": None}]},
            submitted_at=local,
            heartbeat_at=local,
        )
    message = await store.append_message(
        conversation.id,
        role="assistant",
        kind="tool_call",
        content=[{"type": "tool_call", "id": "c1", "name": "echo", "arguments": {"a": [1, {"b": "c"}]}}],
        metadata={"output_data": {"x": [None, True, 3.25]}},
    )

    loaded_conversation = await store.load_conversation(conversation.id)
    loaded_turn = await store.load_turn(turn.id)
    messages = await store.list_messages(conversation.id)

    assert loaded_conversation.metadata == metadata
    assert loaded_conversation.subject == {"type": "Account", "id": "42"}
    assert loaded_turn.options.stored() == nested_options
    assert loaded_turn.usage == {"input_tokens": 10, "cost_details": {"total": 0.123456}}
    assert loaded_turn.output_data == {"list": [1, 2, {"k": None}]}
    assert isinstance(loaded_turn.cost, float) and loaded_turn.cost == pytest.approx(0.123456, abs=1e-9)
    assert messages[0].content == message.content
    assert messages[0].metadata == {"output_data": {"x": [None, True, 3.25]}}

    for value in (
        loaded_conversation.created_at,
        loaded_conversation.updated_at,
        loaded_turn.created_at,
        loaded_turn.updated_at,
        loaded_turn.submitted_at,
        loaded_turn.heartbeat_at,
        messages[0].created_at,
    ):
        _assert_utc(value)
    assert loaded_turn.submitted_at == local  # same instant, normalised to UTC
    assert loaded_turn.submitted_at.hour == 12  # type: ignore[union-attr]

    async with store.atomic() as tx:
        assert (await tx.update_turn(turn.id, cost=None)).cost is None
        # A naive timestamp is refused (SQLAlchemy wraps the ValueError from UTCDateTime), never stored as-is.
        with pytest.raises(StatementError, match="timestamps must be timezone-aware") as refused:
            await tx.update_turn(turn.id, heartbeat_at=datetime(2026, 1, 1))
        assert isinstance(refused.value.orig, ValueError)
    # Reads are copies: mutating one changes nothing stored, nor what the store keeps of a committed conversation.
    loaded_conversation.metadata["principal"]["roles"].append("c")
    assert (await store.load_conversation(conversation.id)).metadata == metadata
    loaded_turn.state.phase = "model"
    loaded_turn.options.state.phase = "model"
    assert (await store.load_turn(turn.id)).options.stored() == nested_options


async def test_json_the_store_counts_outside_records_is_read_back_sorted_too(store: Store) -> None:
    """A JSON value the store builds itself, not from a record's canonical copy (a root's executions counted by tool
    name, a new name added after the others), reads back with its keys sorted on both stores, as a record's do."""
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id)
    async with store.atomic() as tx:
        for call, name in (("call-1", "echo"), ("call-2", "alpha"), ("call-3", "echo")):
            await tx.create_tool_execution(turn_id=turn.id, tool_call_id=call, tool_name=name)
    async with store.atomic() as tx:
        counted = (await tx.tree_usage(turn.id)).tool_executions_by_name
    assert list(counted.items()) == [("alpha", 1), ("echo", 2)]


async def test_json_read_back_has_its_keys_sorted_at_every_depth(store: Store) -> None:
    """A JSON column is decoded once, by the store's engines, into the canonical form records carry (keys sorted at
    every depth, NaN null, NUL U+FFFD): PostgreSQL's jsonb gives keys shortest first ("b" before "aa"), and a row
    written by another hand on SQLite holds NaN and an escaped NUL. Records take those values as they are."""
    unsorted = {"b": 1, "aa": {"d": [{"z": 1, "yy": 2}], "cc": {}}}

    def in_order(value: Any) -> bool:
        return json.dumps(value) == json.dumps(value, sort_keys=True)

    conversation = await _conversation(store, metadata=unsorted)
    turn = await _turn(store, conversation.id, options={"context": unsorted})
    async with store.atomic() as tx:
        await tx.update_turn(turn.id, usage=unsorted, output_data=[unsorted], error=unsorted)
        execution, _ = await tx.create_tool_execution(
            turn_id=turn.id, tool_call_id="call-1", tool_name="echo", arguments=unsorted, result=unsorted
        )
    await store.append_message(conversation.id, role="user", content=[unsorted], metadata=unsorted)

    async with store.atomic() as tx:
        read = await tx.load_turn(turn.id)
        tool = await tx.load_tool_execution(execution.id)
    messages = await store.list_messages(conversation.id)
    for value in (
        read.options.context,
        read.usage,
        read.output_data,
        read.error,
        tool.arguments,
        tool.result,
        messages[-1].content,
        messages[-1].metadata,
    ):
        assert value is not None and in_order(value), value
    assert read.usage == unsorted and tool.result == unsorted and messages[-1].metadata == unsorted

    if store.dialect == "sqlite":  # jsonb refuses both: only SQLite can hold such a text
        async with store.atomic() as tx:
            await tx.connection.execute(
                text("UPDATE turnkit_turns SET usage = :usage WHERE uid = :uid"),
                {"usage": '{"s": "a\\u0000b", "n": NaN}', "uid": turn.id},
            )
        assert (await store.load_turn(turn.id)).usage == {"n": None, "s": "a\ufffdb"}


# 13. Schema ----------------------------------------------------------------------------------------------------------


def _unique_column_sets(conn: Connection) -> dict[str, set[tuple[str, ...]]]:
    inspector = inspect(conn)
    found: dict[str, set[tuple[str, ...]]] = {}
    for table in inspector.get_table_names():
        sets = {tuple(c["column_names"]) for c in inspector.get_unique_constraints(table)}
        sets |= {tuple(i["column_names"]) for i in inspector.get_indexes(table) if i.get("unique")}  # type: ignore[misc]
        found[table] = sets
    return found


async def test_schema_has_spec_tables_and_unique_indexes(tmp_path: Any) -> None:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'schema.db'}")
    try:
        async with store.engine.connect() as conn:
            uniques = await conn.run_sync(_unique_column_sets)
    finally:
        await store.close()
    tables = {
        "turnkit_conversations",
        "turnkit_messages",
        "turnkit_turns",
        "turnkit_tool_executions",
        "turnkit_deliveries",
        "turnkit_waits",
    }
    assert tables <= set(uniques)
    for table in tables - {"turnkit_waits"}:
        assert ("uid",) in uniques[table], table
    assert ("conversation_uid", "sequence") in uniques["turnkit_messages"]
    assert ("turn_uid", "tool_call_id") in uniques["turnkit_tool_executions"]
    assert ("key",) in uniques["turnkit_deliveries"]
    assert ("turn_uid", "target_turn_uid") in uniques["turnkit_waits"]


def _diff(conn: Connection) -> list[Any]:
    context = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": False})
    return compare_metadata(context, Base.metadata)


async def test_migrations_match_the_models(store: Store) -> None:
    async with store.engine.connect() as conn:
        diff = await conn.run_sync(_diff)
    assert diff == []


# -- issue 9: root-tree counters and response request ids, on a database upgraded from revision 0001 -----------------


@pytest.fixture(params=[pytest.param("sqlite", id="sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """A database with no tables yet (PostgreSQL: a fresh one of its own, dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'upgrade.db'}"
        return
    from tests.dbfixtures import create_postgres_database, drop_postgres_database

    admin = request.getfixturevalue("postgres_admin_url")
    url = create_postgres_database(admin)
    try:
        yield url
    finally:
        drop_postgres_database(admin, url)


async def _run_on(url: str, run: Callable[[Connection], Any]) -> Any:
    """``run(conn)`` in one transaction on an engine of its own (a database no store has opened yet)."""
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            return await conn.run_sync(run)
    finally:
        await engine.dispose()


def _rows_at_revision_0001(conn: Connection) -> None:
    """The records of a root turn and its child as revision 0001 stored them (no counters, no request_uid)."""
    from alembic import command
    from sqlalchemy import JSON, Numeric, String, column, insert, table

    from turnkit.store.migrate import alembic_config

    command.upgrade(alembic_config(conn), "0001")
    now = datetime.now(UTC)
    turns = table(
        "turnkit_turns",
        *(column(c, String) for c in ("uid", "conversation_uid", "agent_name", "root_turn_uid", "status")),
        column("context_message_sequence"),
        column("options", JSON),
        column("usage", JSON),
        column("cost", Numeric(14, 6)),
        column("created_at"),
        column("updated_at"),
    )
    common = {"conversation_uid": "conversation_0002", "agent_name": "a", "status": "running", "usage": {}}
    common |= {"context_message_sequence": 0, "created_at": now, "updated_at": now}
    conn.execute(
        insert(turns),
        [
            {"uid": "turn_root", "root_turn_uid": "turn_root", "options": {"state": {"iterations": 2}}, "cost": 0.05}
            | common,
            {"uid": "turn_child", "root_turn_uid": "turn_root", "options": {"state": {"iterations": 1}}, "cost": 0.025}
            | common,
        ],
    )
    executions = table(
        "turnkit_tool_executions",
        *(column(c, String) for c in ("uid", "turn_uid", "tool_call_id", "tool_name", "status")),
        column("arguments", JSON),
        column("error", JSON),
        column("created_at"),
        column("updated_at"),
    )
    denied = {"message": "maximum executions reached for tool a", "details": {"budget_denied": True}}
    conn.execute(
        insert(executions),
        [
            {"uid": f"te_{n}", "turn_uid": turn, "tool_call_id": f"c{n}", "tool_name": name, "status": status}
            | {"arguments": {}, "error": error, "created_at": now, "updated_at": now}
            for n, (turn, name, status, error) in enumerate(
                [
                    ("turn_root", "a", "completed", None),
                    ("turn_child", "b", "running", None),
                    ("turn_child", "a", "cancelled", None),  # skipped: no budget
                    ("turn_root", "a", "failed", denied),  # budget-denied: no budget
                    ("turn_root", "b", "interrupted", {"message": "unknown"}),
                ]
            )
        ],
    )
    messages = table(
        "turnkit_messages",
        *(column(c, String) for c in ("uid", "conversation_uid", "turn_uid", "role", "kind")),
        column("sequence"),
        column("content", JSON),
        column("metadata", JSON),
        column("created_at"),
        column("updated_at"),
    )
    summary = {"compaction": {"request_id": "req_2"}}
    conn.execute(
        insert(messages),
        [
            {"uid": uid, "conversation_uid": "conversation_0002", "turn_uid": "turn_root", "role": role, "kind": kind}
            | {"sequence": n + 1, "content": [], "metadata": metadata, "created_at": now, "updated_at": now}
            for n, (uid, role, kind, metadata) in enumerate(
                [
                    ("message_user", "user", "text", {}),
                    ("message_response", "assistant", "tool_call", {"request_id": "req_1"}),
                    ("message_summary", "assistant", "context_summary", summary),
                ]
            )
        ],
    )


async def test_upgrade_backfills_tree_counters_and_response_request_ids(empty_database_url: str) -> None:
    """issue 9: an existing database upgraded to the counters checks budgets as the sums over its records did."""

    from turnkit.kernel.records import TreeUsage

    await _run_on(empty_database_url, _rows_at_revision_0001)

    store = await Store.open(empty_database_url)  # upgrades to head
    try:
        async with store.atomic() as tx:
            tree = await tx.list_turns(root_turn_id="turn_root")
            executions = await tx.list_tool_executions(root_turn_id="turn_root")
            usage = await tx.tree_usage("turn_root")
            assert usage == TreeUsage.from_records(tree, executions)
            assert usage == TreeUsage(
                iterations=3, tool_executions=3, tool_executions_by_name={"a": 1, "b": 2}, cost=0.075
            )
            assert await tx.tree_usage("turn_child") == TreeUsage()  # only roots carry the totals
            response = await tx.find_response("turn_root", "req_1")
            assert response is not None and response.id == "message_response"
            assert await tx.find_response("turn_root", "req_2") is None  # a summary is not a response ...
            summary = await tx.find_response("turn_root", "req_2", kind="context_summary")
            assert summary is not None and summary.id == "message_summary"  # ... but is found as a summary
            latest = await tx.latest_response("turn_root")
            assert latest is not None and latest.id == "message_response"

            # Writes after the upgrade keep the totals equal to the sums over the records.
            child = await tx.load_turn("turn_child")
            await tx.update_turn(child.id, cost=0.125, options={"state": {"iterations": 4}})
            await tx.claim_tool_execution("te_1", from_="running", to="cancelled")
            await tx.claim_tool_execution("te_4", from_="interrupted", to="cancelled")
            await tx.create_tool_execution(turn_id="turn_child", tool_call_id="c9", tool_name="a", status="running")
            tree = await tx.list_turns(root_turn_id="turn_root")
            executions = await tx.list_tool_executions(root_turn_id="turn_root")
            usage = await tx.tree_usage("turn_root")
            assert usage == TreeUsage.from_records(tree, executions)
            assert usage == TreeUsage(iterations=6, tool_executions=2, tool_executions_by_name={"a": 2}, cost=0.175)
    finally:
        await store.close()


# -- issue 8 item 12: staged inputs -----------------------------------------------------------------------------------


async def test_staged_input_is_idempotent_by_id_and_deleted_once(store: Store) -> None:
    """Issue 8 item 12: staging again keeps the first content; a deleted input is not found; deleting again is fine."""
    content = {"text": "hi \x00", "context": None, "principal": {"user": "u"}, "metadata": {"k": 1}}
    async with store.atomic() as tx:
        assert await tx.stage_input("msg_staged", conversation_id="conv_a", content=content)
        assert not await tx.stage_input("msg_staged", conversation_id="conv_a", content={"text": "other"})
        assert await tx.load_staged_input("msg_staged") == content | {"text": "hi \ufffd"}  # made storable
    async with store.atomic() as tx:
        await tx.delete_staged_input("msg_staged")
        await tx.delete_staged_input("msg_staged")
        with pytest.raises(RecordNotFound, match="staged input not found: msg_staged"):
            await tx.load_staged_input("msg_staged")


async def test_upgrade_from_0002_adds_the_staged_inputs_table(empty_database_url: str) -> None:
    """Issue 8 item 12: a database at revision 0002 upgrades to the staged inputs table, and downgrades again."""
    from alembic import command

    from turnkit.store.migrate import alembic_config

    def tables_at(revision: str) -> Any:
        def run(conn: Connection) -> set[str]:
            command.upgrade(alembic_config(conn), revision)
            return set(inspect(conn).get_table_names())

        return run

    assert "turnkit_staged_inputs" not in await _run_on(empty_database_url, tables_at("0002"))
    store = await Store.open(empty_database_url)  # upgrades to head
    try:
        async with store.atomic() as tx:
            await tx.stage_input("msg_up", conversation_id="conv_up", content={"text": "upgraded"})
            assert await tx.load_staged_input("msg_up") == {"text": "upgraded"}
        async with store.engine.connect() as conn:
            assert await conn.run_sync(_diff) == []

        def downgrade(conn: Connection) -> set[str]:
            command.downgrade(alembic_config(conn), "0002")
            return set(inspect(conn).get_table_names())

        async with store.engine.begin() as conn:
            assert "turnkit_staged_inputs" not in await conn.run_sync(downgrade)
    finally:
        await store.close()


async def test_upgrade_from_0006_keeps_the_waits_and_takes_a_waiter_id_of_1000_characters(
    empty_database_url: str,
) -> None:
    """A database at revision 0006 keeps its wait rows through the upgrade; then a wait whose waiter is a workflow id
    of 1,000 characters (a team's workflow that asked) is stored whole, and the schema matches the models."""
    from alembic import command
    from sqlalchemy import String, column, insert, table

    from turnkit.store.migrate import alembic_config

    def wait_at_0006(conn: Connection) -> None:
        command.upgrade(alembic_config(conn), "0006")
        waits = table("turnkit_waits", column("turn_uid", String), column("target_turn_uid", String))
        waits.append_column(column("created_at"))
        waits.append_column(column("updated_at"))
        now = datetime.now(UTC)
        conn.execute(insert(waits).values(turn_uid="turn_a", target_turn_uid="turn_b", created_at=now, updated_at=now))

    await _run_on(empty_database_url, wait_at_0006)
    store = await Store.open(empty_database_url)  # upgrades to head
    try:
        caller = "approval-" + "k" * 991
        async with store.atomic() as tx:
            await tx.create_wait(turn_id=caller, target_turn_id="turn_b")
        async with store.atomic() as tx:
            assert [w.turn_id for w in await tx.list_waits(target_turn_id="turn_b")] == ["turn_a", caller]
        async with store.engine.connect() as conn:
            assert await conn.run_sync(_diff) == []
    finally:
        await store.close()


# 13. Trips to SQLite's thread ----------------------------------------------------------------------------------------


def _count_trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record what runs on a SQLite connection's thread (trips), by name."""
    trips: list[str] = []
    run = sqlite_trips.Trips.run

    async def counted_trip(self: sqlite_trips.Trips, fn: Any, *args: Any) -> Any:
        trips.append(getattr(fn, "__name__", repr(fn)))
        return await run(self, fn, *args)

    monkeypatch.setattr(sqlite_trips.Trips, "run", counted_trip)
    return trips


def _statement_threads(store: Store) -> tuple[list[tuple[str, str]], Callable[[], None]]:
    """Record each SQL statement that ``sqlite3`` runs on the store's inline connection, with the thread that runs it
    (SQLite's trace callback fires where the statement runs); and how to stop."""
    assert store.inline is not None
    raw = store.inline.dbapi_connection
    ran: list[tuple[str, str]] = []
    raw.set_trace_callback(lambda sql: ran.append((threading.current_thread().name, sql.split()[0].upper())))
    return ran, lambda: raw.set_trace_callback(None)


async def _write_rolled_back(store: Store, conversation: ConversationRecord) -> None:
    """A transaction that appends a message and then raises: the append must be undone."""
    with pytest.raises(_Boom):
        async with store.atomic() as tx:
            await tx.append_message(
                conversation.id, role="user", kind="text", content=[{"type": "text", "text": "undone"}]
            )
            raise _Boom
    assert await store.list_messages(conversation.id) == []


async def test_a_sqlite_transaction_sends_its_begin_with_its_first_statement(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With statements on the driver's thread (``sqlite_inline=False``), a transaction of one read is two trips
    (BEGIN IMMEDIATE with the read, then COMMIT; the pool's rollback of a connection with no transaction open makes
    none), an empty transaction none, and a rollback after a write still undoes it
    (``turnkit/store/sqlite_trips.py``)."""
    if not database_url.startswith("sqlite"):
        pytest.skip("SQLite's driver thread only")
    store = await Store.open(database_url, sqlite_inline=False)
    try:
        assert store.inline is None
        conversation = await _conversation(store)
        trips = _count_trips(monkeypatch)
        await store.load_conversation(conversation.id)
        assert trips == ["_run", "_commit"], trips
        trips.clear()
        async with store.atomic():
            pass
        assert trips == []
        await _write_rolled_back(store, conversation)
        assert (await store.load_conversation(conversation.id)).id == conversation.id
    finally:
        await store.close()


async def test_a_sqlite_transaction_runs_on_the_event_loop_when_it_need_not_wait(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By default (a file in WAL mode), a store transaction makes no trip to aiosqlite's thread: its statements run on
    SQLAlchemy's synchronous engine on the event loop's thread; a rollback after a write still undoes it, and the
    next transaction on the same connection sees nothing of it (``turnkit/store/sqlite_inline.py``)."""
    if store.dialect != "sqlite":
        pytest.skip("SQLite's driver only")
    assert store.inline is not None
    conversation = await _conversation(store)
    trips = _count_trips(monkeypatch)
    threads, stop = _statement_threads(store)
    try:
        await store.load_conversation(conversation.id)
        await _write_rolled_back(store, conversation)
        message = await store.append_message(conversation.id, role="user", text="kept")
        assert [m.id for m in await store.list_messages(conversation.id)] == [message.id]
    finally:
        stop()
    assert trips == []
    assert {thread for thread, _ in threads} == {threading.current_thread().name}, threads
    assert {"BEGIN", "SELECT", "INSERT", "ROLLBACK", "COMMIT"} <= {verb for _, verb in threads}, threads


async def test_sqlite_checkpoints_run_on_a_thread(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With transactions on the event loop's thread, SQLite's automatic checkpoint (an fsync inside a commit) is off,
    and every ``CHECKPOINT_EVERY`` commits one runs on a thread instead: the WAL stays bounded and no fsync blocks the
    event loop."""
    if not database_url.startswith("sqlite"):
        pytest.skip("SQLite's WAL only")
    monkeypatch.setattr(sqlite_inline, "CHECKPOINT_EVERY", 5)
    checkpoints: list[str] = []
    checkpoint = sqlite_inline._checkpoint  # pyright: ignore[reportPrivateUsage]

    def counted(path: str) -> None:
        checkpoints.append(threading.current_thread().name)
        checkpoint(path)

    monkeypatch.setattr(sqlite_inline, "_checkpoint", counted)
    store = await Store.open(database_url)
    try:
        conversation = await _conversation(store)
        async with store.atomic() as tx:
            [autocheckpoint] = (await tx.connection.execute(text("PRAGMA wal_autocheckpoint"))).one()
        assert autocheckpoint == 0
        assert store.inline is not None
        for n in range(10):  # ten commits after the two above: two of the twelve are a fifth commit
            await store.append_message(conversation.id, role="user", text=f"m{n}")
            await store.inline.checkpointed()
        assert len(await store.list_messages(conversation.id)) == 10
    finally:
        await store.close()
    assert len(checkpoints) == 2, checkpoints
    assert threading.current_thread().name not in checkpoints


async def test_a_sqlite_transaction_holds_the_writer_lock_from_its_first_statement(store: Store) -> None:
    """BEGIN IMMEDIATE still comes first: a second transaction's first statement waits until the first transaction
    commits (what keeps concurrent appends gap-free), then sees its write. It waits without blocking the event loop
    (which must go on for the first one to commit at all)."""
    if store.dialect != "sqlite":
        pytest.skip("SQLite's writer lock only")
    conversation = await _conversation(store)
    holding, release = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with store.atomic() as tx:
            await tx.append_message(
                conversation.id, role="user", kind="text", content=[{"type": "text", "text": "first"}]
            )
            holding.set()
            await release.wait()

    async def second() -> int:
        async with store.atomic() as tx:
            return len(await tx.list_messages(conversation.id))

    writer = asyncio.create_task(first())
    await asyncio.wait_for(holding.wait(), timeout=10)
    reader = asyncio.create_task(second())
    done, _ = await asyncio.wait({reader}, timeout=0.5)
    assert not done, "the second transaction ran while the first held the writer lock"
    release.set()
    await asyncio.wait_for(writer, timeout=10)
    assert await asyncio.wait_for(reader, timeout=10) == 1


async def test_a_sqlite_transaction_waits_for_this_processs_writer_as_long_as_the_busy_timeout(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction of the same process holds the store's SQLite connection past the busy timeout: the waiting
    transaction fails with "database is locked" (transient, as SQLite's own busy timeout answered), never hangs; and
    another event loop (another thread) that tries a transaction meanwhile is refused, not let onto the connection."""
    if store.dialect != "sqlite":
        pytest.skip("SQLite's writer lock only")
    monkeypatch.setattr(sqlite_inline, "BUSY_TIMEOUT", 0.2)
    conversation = await _conversation(store)
    holding, release = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with store.atomic():
            holding.set()
            await release.wait()

    held = asyncio.create_task(holder())
    try:
        await asyncio.wait_for(holding.wait(), timeout=10)
        with pytest.raises(OperationalError) as caught:
            await store.load_conversation(conversation.id)
        assert transient_store_error(caught.value) and "database is locked" in str(caught.value)

        def other_loop() -> BaseException | None:
            try:
                asyncio.run(store.load_conversation(conversation.id))
            except BaseException as err:  # returned to the test
                return err
            return None

        refused = await asyncio.to_thread(other_loop)
        assert isinstance(refused, RuntimeError) and "one event loop at a time" in str(refused), refused
    finally:
        release.set()
        await asyncio.wait_for(held, timeout=10)
    assert (await store.load_conversation(conversation.id)).id == conversation.id


async def test_a_sqlite_transaction_waits_for_another_processs_writer_off_the_event_loop(
    database_url: str, tmp_path: Any
) -> None:
    """Another connection to the file (another process's, as a CLI beside a worker) holds the writer lock: a store
    transaction waits for it without blocking the event loop, then runs; held past the busy timeout, the
    transaction fails with SQLite's "database is locked", which the store's callers retry."""
    if not database_url.startswith("sqlite"):
        pytest.skip("SQLite's writer lock only")
    path = tmp_path / "shared.db"
    store = await Store.open(f"sqlite+aiosqlite:///{path}")
    other = sqlite3.connect(path, isolation_level=None)
    try:
        conversation = await _conversation(store)
        other.execute("BEGIN IMMEDIATE")
        waiting = asyncio.create_task(store.append_message(conversation.id, role="user", text="after"))
        ticks = 0
        while ticks < 20:  # the event loop goes on while the append waits for the lock
            await asyncio.sleep(0.01)
            ticks += 1
        assert not waiting.done()
        other.execute("COMMIT")
        message = await asyncio.wait_for(waiting, timeout=10)
        assert [m.id for m in await store.list_messages(conversation.id)] == [message.id]

        other.execute("BEGIN IMMEDIATE")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sqlite_inline, "BUSY_TIMEOUT", 0.2)
            with pytest.raises(OperationalError) as caught:
                await store.append_message(conversation.id, role="user", text="never")
        assert transient_store_error(caught.value)
        other.execute("ROLLBACK")
        assert len(await store.list_messages(conversation.id)) == 1
    finally:
        other.close()
        await store.close()


async def test_a_sqlite_transaction_cancelled_mid_statement_releases_the_writer_lock(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task cancelled while its transaction's first statement runs on aiosqlite's thread (BEGIN IMMEDIATE went
    with it; ``sqlite_inline=False``, as for any trip) leaves no transaction open on the pooled connection: the next
    writer gets the lock at once and the cancelled transaction wrote nothing."""
    if not database_url.startswith("sqlite"):
        pytest.skip("SQLite's driver thread only")
    store = await Store.open(database_url, sqlite_inline=False)
    try:
        await _cancelled_mid_statement(store, monkeypatch)
    finally:
        await store.close()


async def _cancelled_mid_statement(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    conversation = await _conversation(store)
    slow = text(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000000) SELECT count(*) FROM c"
    )
    running = threading.Event()  # set on aiosqlite's thread when the slow statement starts there
    run = sqlite_trips._run  # pyright: ignore[reportPrivateUsage]

    def marked(connection: Any, begin: str | None, statement: str, *rest: Any) -> Any:
        if "WITH RECURSIVE" in statement:
            running.set()
        return run(connection, begin, statement, *rest)

    monkeypatch.setattr(sqlite_trips, "_run", marked)

    async def cancelled() -> None:
        async with store.atomic() as tx:
            await tx.connection.execute(slow)
            await tx.append_message(conversation.id, role="user", kind="text", content=[{"type": "text", "text": "x"}])

    task = asyncio.create_task(cancelled())
    assert await asyncio.to_thread(running.wait, 10), "the slow statement never started"
    task.cancel()  # while it runs on the driver's thread (~0.5 s of work), with the transaction's BEGIN before it
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(3):  # whichever pooled connection the next transactions get
        message = await asyncio.wait_for(
            store.append_message(conversation.id, role="user", kind="text", content=[{"type": "text", "text": "y"}]),
            timeout=20,
        )
        assert message.content == [{"type": "text", "text": "y"}]
    assert [m.content for m in await store.list_messages(conversation.id)] == [[{"type": "text", "text": "y"}]] * 3


# The store's prebuilt statements on the driver itself (turnkit/store/direct.py) ---------------------------------------


def _direct_statements(store: Store) -> tuple[list[bool], Callable[[], None]]:
    """Whether each statement the store sends ran on the driver itself (no SQLAlchemy execution context), and how to
    stop recording."""
    direct: list[bool] = []

    def on_statement(_conn: Any, cursor: Any, _statement: str, _parameters: Any, context: Any, _many: bool) -> None:
        direct.append(context is None)
        if store.dialect == "postgresql":
            assert (context is None) == isinstance(cursor, DirectCursor)

    engines = store.sync_engines
    for engine in engines:
        event.listen(engine, "before_cursor_execute", on_statement)

    def stop() -> None:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", on_statement)

    return direct, stop


async def test_prebuilt_statements_run_on_the_driver_and_read_what_sqlalchemy_reads(store: Store) -> None:
    """Issue 9 (turnkit/store/direct.py): from its second execution on, a prebuilt statement of the store runs on the
    driver itself (asyncpg, or sqlite3 on the inline path), and its rows make the same records as SQLAlchemy's path
    makes of the same rows: JSON, timestamps with their zone, NUMERIC, booleans, nulls."""
    url = store.engine.url.render_as_string(hide_password=False)
    plain = await Store.open(url, migrate=False, direct=False)
    try:
        conversation = await _conversation(store, subject={"type": "user", "id": "u-1"}, metadata={"k": [1, "é"]})
        turn = await _turn(store, conversation.id, status="running", submitted_at=datetime.now(UTC), direct=True)
        async with store.atomic(conversation_id=conversation.id, turn_id=turn.id) as tx:
            await tx.update_turn(turn.id, cost=Decimal("0.123456"), usage={"input_tokens": 7}, error=None)
            await tx.append_message(conversation.id, role="user", text="hello", turn_id=turn.id, metadata={"m": 1})
            await tx.create_tool_execution(turn_id=turn.id, tool_call_id="call-1", tool_name="lookup", arguments={})

        async def records(of: Store) -> list[Any]:
            of.conversation_rows = KeptRows(10)  # read the conversation from the database, not from memory
            async with of.atomic(conversation_id=conversation.id, turn_id=turn.id) as tx:
                return [
                    await tx.load_conversation(conversation.id),
                    await tx.load_turn(turn.id),
                    await tx.list_messages(conversation.id, turn_id=turn.id),
                    await tx.find_tool_execution(turn.id, "call-1"),
                    await tx.tree_usage(turn.id),
                ]

        sent, stop = _direct_statements(plain)
        try:
            expected = await records(plain)
        finally:
            stop()
        assert sent and not any(sent), sent
        await records(store)  # the first sight of each statement: SQLAlchemy's path
        sent, stop = _direct_statements(store)
        try:
            assert await records(store) == expected
        finally:
            stop()
        assert sent and all(sent), sent  # every statement of the second round ran on the driver
        assert expected[1].cost == pytest.approx(0.123456) and expected[1].submitted_at.tzinfo is not None
    finally:
        await plain.close()


async def test_a_statements_arguments_are_the_ones_sqlalchemy_builds(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prebuilt statement's positional arguments come from a plan made once per statement (and per IN-list shape),
    not from SQLAlchemy's ``construct_params`` at each execution: over a turn's writes, reads and compare-and-sets
    (IN lists of one, two and three statuses, a literal IN list, JSON, timestamps, NUMERIC), the SQL and arguments
    of every direct statement equal those SQLAlchemy's own construction gives for the same parameters."""
    checked: list[str] = []
    planned = CompiledStatement.arguments

    def compare(self: CompiledStatement, parameters: Any) -> tuple[str, list[Any]]:
        sql, arguments = planned(self, parameters)
        assert (sql, arguments) == self._constructed(parameters)  # pyright: ignore[reportPrivateUsage]
        shaped = self.list_keys is not None and self._expanded_plan(parameters, self.list_keys) is not None  # pyright: ignore[reportPrivateUsage]
        assert self.plan is not None or shaped, sql  # a plan made it, not SQLAlchemy's construction
        checked.append(sql)
        return sql, arguments

    monkeypatch.setattr(CompiledStatement, "arguments", compare)

    async def work(n: int) -> None:
        conversation = await _conversation(store, metadata={"n": n, "k": [1, "é"]})
        turn = await _turn(store, conversation.id, status="pending", submitted_at=datetime.now(UTC))
        async with store.atomic(conversation_id=conversation.id, turn_id=turn.id) as tx:
            assert await tx.claim_turn(turn.id, from_="pending", to="running") is not None
            assert await tx.claim_turn(turn.id, from_=("pending", "paused", "running"), to="running") is not None
            await tx.update_turn(turn.id, cost=Decimal("0.5"), usage={"input_tokens": n})
            await tx.append_message(conversation.id, role="user", text=f"hello {n}", turn_id=turn.id)
            execution, _ = await tx.create_tool_execution(
                turn_id=turn.id, tool_call_id=f"call-{n}", tool_name="lookup", arguments={"q": n}
            )
            assert await tx.claim_tool_execution(execution.id, from_=("pending", "running"), to="running")
            await tx.claim_tool_execution(execution.id, from_="running", to="completed", result={"ok": n})
            await tx.find_tool_execution(turn.id, f"call-{n}")
            await tx.list_messages(conversation.id, turn_id=turn.id)
            await tx.tree_usage(turn.id)

    for n in range(3):  # the first round goes SQLAlchemy's path; the next ones the plans
        await work(n)
    assert len(checked) >= 20 and any(" IN (" in sql for sql in checked), checked


async def test_a_new_conversations_generated_key_comes_back_on_the_driver(store: Store) -> None:
    """Issue 9: a fresh conversation per turn (the peers' workload) inserts a row whose integer key the database
    generates. From the second conversation on, that INSERT runs on the driver too (on PostgreSQL with an explicit
    RETURNING: SQLAlchemy's implicit one needs its execution context), and each conversation's messages go to its own
    row: a message appended in the creating transaction and one appended later read back under it."""

    async def create(n: int) -> str:
        async with store.atomic() as tx:
            conversation = await tx.create_conversation(agent_name=_name(), metadata={"n": n})
            await tx.append_message(conversation.id, role="user", text=f"first {n}")
            return conversation.id

    await create(-1)  # the first sight of the INSERT: SQLAlchemy's path
    sent, stop = _direct_statements(store)
    try:
        created = [await create(n) for n in range(3)]
    finally:
        stop()
    assert sent and all(sent), sent
    store.conversation_rows = KeptRows(10)  # read them back from the database, not from memory
    for n, conversation_id in enumerate(created):
        await store.append_message(conversation_id, role="user", text=f"second {n}")
        found = await store.load_conversation(conversation_id)
        assert found.metadata == {"n": n}
        texts = [m.content[0]["text"] for m in await store.list_messages(conversation_id)]
        assert texts == [f"first {n}", f"second {n}"]


async def test_a_postgresql_statement_cancelled_on_asyncpg_drops_its_connection(store: Store) -> None:
    """A direct statement cancelled while it waits (here on a row lock another transaction holds) leaves nothing
    behind: its connection is invalidated, as SQLAlchemy's path does (its protocol state is unknown), the holder
    commits, and the next transactions run on a sound connection."""
    if store.dialect != "postgresql":
        pytest.skip("PostgreSQL's asyncpg path only")
    conversation = await _conversation(store)
    turn = await _turn(store, conversation.id)
    for _ in range(2):  # seen twice: the lock goes straight to asyncpg from now on
        async with store.atomic(turn_id=turn.id):
            pass
    invalidated: list[BaseException | None] = []
    event.listen(store.engine.sync_engine, "invalidate", lambda _c, _r, error: invalidated.append(error))
    holding, release = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with store.atomic(turn_id=turn.id) as tx:
            await tx.update_turn(turn.id, status="running")
            holding.set()
            await release.wait()

    async def waiter() -> None:
        async with store.atomic(turn_id=turn.id):
            pytest.fail("the lock was taken while another transaction held it")

    held = asyncio.create_task(holder())
    await asyncio.wait_for(holding.wait(), 10)
    sent, stop = _direct_statements(store)
    waiting = asyncio.create_task(waiter())
    try:
        async with asyncio.timeout(10):
            while not sent:  # the waiter's lock is on its way
                await asyncio.sleep(0.01)
    finally:
        stop()
    assert sent == [True]
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert len(invalidated) == 1
    release.set()
    await asyncio.wait_for(held, 10)
    for _ in range(3):  # whichever pooled connection the next transactions get
        async with store.atomic(turn_id=turn.id) as tx:
            assert (await tx.load_turn(turn.id)).status == "running"


async def _pool_of(database_url: str) -> tuple[int, int]:
    """The pool size and overflow of a store opened on ``database_url``."""
    store = await Store.open(database_url, migrate=False)
    try:
        return store.engine.pool.size(), store.engine.pool._max_overflow  # pyright: ignore
    finally:
        await store.close()


async def test_the_postgresql_pool_is_sized_for_a_worker_and_set_from_the_environment(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PostgreSQL store keeps 20 connections open and may open 10 more (SQLAlchemy's 5 made a worker's bursts open
    and close a connection per turn); ``TURNKIT_DB_POOL_SIZE`` and ``TURNKIT_DB_MAX_OVERFLOW`` set them, and a value
    that is no number of connections is refused by name."""
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite's store has one connection (the inline path) or aiosqlite's own pool")
    assert await _pool_of(database_url) == (20, 10)
    monkeypatch.setenv("TURNKIT_DB_POOL_SIZE", "3")
    monkeypatch.setenv("TURNKIT_DB_MAX_OVERFLOW", "0")
    assert await _pool_of(database_url) == (3, 0)
    monkeypatch.setenv("TURNKIT_DB_MAX_OVERFLOW", "many")
    with pytest.raises(ValueError, match="TURNKIT_DB_MAX_OVERFLOW must be a whole number"):
        await Store.open(database_url, migrate=False)


async def _plan_cache_mode_of(database_url: str) -> str:
    """The ``plan_cache_mode`` a store's connection on ``database_url`` runs its statements with."""
    store = await Store.open(database_url, migrate=False)
    try:
        async with store.atomic() as tx:
            return str(await tx.connection.scalar(text("SHOW plan_cache_mode")))
    finally:
        await store.close()


async def test_postgresql_plans_the_stores_statements_once_per_connection(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PostgreSQL store's connections are set to ``plan_cache_mode = force_generic_plan`` when they connect, so a
    statement new on a connection is planned once instead of five times; ``TURNKIT_DB_PLAN_CACHE_MODE`` sets another
    mode, empty leaves the server's own, a mode PostgreSQL does not have is refused by name, and a URL with prepared
    statements turned off (``prepared_statement_cache_size=0``, as behind PgBouncer in transaction mode) sets none."""
    if not database_url.startswith("postgresql"):
        pytest.skip("a PostgreSQL setting")
    monkeypatch.delenv("TURNKIT_DB_PLAN_CACHE_MODE", raising=False)
    assert await _plan_cache_mode_of(database_url) == "force_generic_plan"
    monkeypatch.setenv("TURNKIT_DB_PLAN_CACHE_MODE", "force_custom_plan")
    assert await _plan_cache_mode_of(database_url) == "force_custom_plan"
    monkeypatch.setenv("TURNKIT_DB_PLAN_CACHE_MODE", "")
    assert await _plan_cache_mode_of(database_url) == "auto"  # the server's default
    unprepared = make_url(database_url).update_query_dict({"prepared_statement_cache_size": "0"})
    monkeypatch.delenv("TURNKIT_DB_PLAN_CACHE_MODE")
    assert await _plan_cache_mode_of(unprepared.render_as_string(hide_password=False)) == "auto"
    monkeypatch.setenv("TURNKIT_DB_PLAN_CACHE_MODE", "generic")
    with pytest.raises(ValueError, match="TURNKIT_DB_PLAN_CACHE_MODE must be one of auto, force_generic_plan"):
        await Store.open(database_url, migrate=False)
