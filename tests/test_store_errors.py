"""Deterministic vs transient store failures (issue 8 items 1, 11), classified from real SQLite and PostgreSQL errors.

Each error is raised by the real driver through SQLAlchemy, the way a store activity meets it; none is constructed
by hand. Deterministic ones must not be retried and their message must hold no SQL and no value; transient ones
(a lock, a timeout, a refused connection) stay retryable.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import sqlite3
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.engine import eventually
from turnkit._activities.store_retry import retry_store
from turnkit.store import Store, idle_ping, kept_connections
from turnkit.store.errors import (
    deterministic_store_error,
    store_failure_message,
    transient_store_error,
    unavailable_message,
)
from turnkit.store.rows import NewRow, insert_columns, row_values
from turnkit.store.schema import ConversationRow
from turnkit.store.storable import UnstorableValue, storable, stored_json, written_json

SECRET = "secret-value-7f3a"


@dataclass
class Scratch:
    engine: AsyncEngine
    table: str

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name


@pytest_asyncio.fixture
async def db(database_url: str) -> AsyncIterator[Scratch]:
    """A raw engine on the test database with a scratch table of its own (a varchar(8), a JSON column)."""
    store = await Store.open(database_url)  # migrates; the scratch table lives beside the TurnKit tables
    await store.close()
    engine = create_async_engine(database_url, connect_args={"timeout": 5})
    table = f"scratch_{uuid.uuid4().hex[:10]}"
    json_type = "jsonb" if engine.dialect.name == "postgresql" else "json"
    async with engine.begin() as conn:
        await conn.execute(text(f"create table {table} (s varchar(8) not null, j {json_type})"))
    try:
        yield Scratch(engine, table)
    finally:
        async with engine.begin() as conn:
            await conn.execute(text(f"drop table {table}"))
        await engine.dispose()


async def _error(engine: AsyncEngine, sql: str, params: dict[str, Any], table: str = "") -> BaseException:
    try:
        async with engine.begin() as conn:
            await conn.execute(text(sql.format(t=table)), params)
    except Exception as err:
        return err
    raise AssertionError(f"no error from {sql!r}")


def _assert_clean(message: str) -> None:
    assert SECRET not in message and "insert" not in message.lower() and "[SQL" not in message, message


async def test_values_the_database_rejects_are_deterministic(db: Scratch) -> None:
    """Issue 8 item 1: NUL, a too-long string, NaN in JSON (PostgreSQL), NOT NULL and a lone surrogate (both)."""
    cases = [
        ("not null", "insert into {t} (s) values (:s)", {"s": None}),
        ("lone surrogate", "insert into {t} (s) values (:s)", {"s": SECRET[:4] + "\ud800"}),
    ]
    if db.dialect == "postgresql":
        cases += [
            ("NUL in text", "insert into {t} (s) values (:s)", {"s": "a\x00" + SECRET}),
            ("too long", "insert into {t} (s) values (:s)", {"s": SECRET * 3}),
            ("NaN in JSON", "insert into {t} (s, j) values ('a', cast(:j as jsonb))", {"j": '{"x": NaN}'}),
            ("NUL in JSON", "insert into {t} (s, j) values ('a', cast(:j as jsonb))", {"j": '{"x": "\\u0000"}'}),
        ]
    for label, sql, params in cases:
        err = await _error(db.engine, sql, params, db.table)
        assert deterministic_store_error(err), (label, type(err), err)
        _assert_clean(store_failure_message(err))


async def test_sqlite_lock_is_transient(database_url: str, tmp_path: Any) -> None:
    """A held SQLite write lock ("database is locked") is retried, not failed."""
    if not database_url.startswith("sqlite"):
        pytest.skip("SQLite only")
    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("create table t (x int)")
    holder.execute("begin immediate")
    engine = create_async_engine(f"sqlite+aiosqlite:///{path}", connect_args={"timeout": 0})
    try:
        err = await _error(engine, "insert into t values (1)", {})
        assert "locked" in str(err)
        assert not deterministic_store_error(err)
    finally:
        holder.rollback()
        holder.close()
        await engine.dispose()


async def test_postgres_timeouts_and_refused_connections_are_transient(db: Scratch) -> None:
    """A statement timeout, a lock timeout and a refused connection are retried, not failed."""
    if db.dialect != "postgresql":
        pytest.skip("PostgreSQL only")
    engine = db.engine
    try:
        async with engine.begin() as conn:
            await conn.execute(text("set local statement_timeout = 1"))
            await conn.execute(text(f"select pg_sleep(1), '{SECRET}'"))
    except Exception as err:
        assert not deterministic_store_error(err), err
        assert SECRET in str(err)  # SQLAlchemy's own text quotes the statement...
        message = unavailable_message(err)
        assert SECRET not in message and "select" not in message.lower(), message  # ...the short message does not
        assert "SQLSTATE 57014" in message, message
    else:
        raise AssertionError("statement timeout did not fire")
    async with engine.connect() as holder:
        await holder.execute(text(f"lock table {db.table} in access exclusive mode"))
        try:
            async with engine.begin() as conn:
                await conn.execute(text("set local lock_timeout = 50"))
                await conn.execute(text(f"select * from {db.table}"))
        except Exception as err:
            assert not deterministic_store_error(err), err
        else:
            raise AssertionError("lock timeout did not fire")
        await holder.rollback()
    url = make_url(str(engine.url)).set(port=1)
    refused = create_async_engine(url, connect_args={"timeout": 2})
    try:
        async with refused.connect() as conn:
            await conn.execute(text("select 1"))
    except Exception as err:
        assert not deterministic_store_error(err), err
    finally:
        await refused.dispose()


def test_unstorable_values() -> None:
    """Issue 8 item 11: storable() makes NaN null and NUL U+FFFD; a circular value is deterministic and named."""
    assert storable({"n": float("nan"), "i": float("inf"), "s": "a\x00b", "k\x00": ["\udc00"]}) == {
        "n": None,
        "i": None,
        "s": "a\ufffdb",
        "k\ufffd": ["\ufffd"],
    }
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(UnstorableValue, match="circular") as caught:
        storable(loop)
    assert deterministic_store_error(caught.value)
    assert not deterministic_store_error(RuntimeError("anything else"))
    assert not deterministic_store_error(ConnectionRefusedError())


def test_a_small_value_is_copied_as_the_json_round_trip_copies_it() -> None:
    """storable() copies a small plain value by walking it (no JSON text, a few µs less per JSON column read or
    written); the copy is the one the JSON round trip makes, to the key order and the type, for every shape: sorted
    and stringified keys, NUL and lone surrogates in keys and strings, NaN, tuples, subclasses of str and int, keys
    that cannot sort together, and values past the walk's budget."""

    class Text(str):
        pass

    def round_trip(value: Any) -> Any:  # the JSON path: keys stringified, then sorted; NaN and infinities null
        encoded = json.dumps(json.loads(json.dumps(value, default=str)), sort_keys=True)
        return _fffd(json.loads(encoded, parse_constant=lambda _: None))

    rng = random.Random(7)
    leaves = [
        "s",
        "t\x00",
        "é😀",
        "x\udc00",
        3,
        -0.0,
        2.5,
        10**30,
        None,
        True,
        False,
        Text("sub"),
        float("nan"),
        (1, 2),
    ]

    def tree(depth: int = 0) -> Any:
        roll = rng.random()
        if depth > 3 or roll < 0.4:
            return rng.choice(leaves)
        if roll < 0.75:
            return {rng.choice(["a", "b", "ä", "z\x00", "\ud800"]): tree(depth + 1) for _ in range(rng.randint(0, 4))}
        return [tree(depth + 1) for _ in range(rng.randint(0, 30 if depth == 0 else 4))]

    shapes = [
        {},
        [],
        {"b": 1, "a": {"d": [], "c": {}}},
        {1: "x", "1": "y"},
        {1: "x", "a": "y"},
        *[tree() for _ in range(3000)],
    ]
    for value in shapes:
        copied = storable(value)
        assert json.dumps(copied) == json.dumps(round_trip(value)), value
    shared = {"k": [1, {"n": 2}]}
    assert storable(shared) is not shared and storable(shared)["k"] is not shared["k"]  # a copy, to the leaves


def test_a_json_column_is_decoded_once_into_the_form_storable_gives() -> None:
    """The store's engines decode JSON columns with stored_json (SQLite's with written_json, which gives the same for
    the sorted texts the store writes), and records take the values as they are: the value is
    storable()'s of the decoded text, to the key order and the type, for the texts the store writes (the same random
    shapes as above) and for texts it does not (keys out of order, as PostgreSQL's jsonb gives them; NaN; NUL, lone
    surrogates and emoji escaped; a duplicate key)."""
    rng = random.Random(11)

    def tree(depth: int = 0) -> Any:
        roll = rng.random()
        if depth > 3 or roll < 0.4:
            return rng.choice(["s", "t\x00", "é😀", "x\udc00", 3, -0.0, 2.5, 10**30, None, True, False, float("nan")])
        if roll < 0.75:
            return {rng.choice(["b", "a", "ä", "z\x00", "\ud800", "10", "9"]): tree(depth + 1) for _ in range(4)}
        return [tree(depth + 1) for _ in range(rng.randint(0, 4))]

    texts = [json.dumps(storable(tree())) for _ in range(2000)]
    texts += [json.dumps(tree(), sort_keys=False) for _ in range(500)]  # written by another hand: unsorted, NaN
    texts += [
        '{"b": 1, "a": {"d": [{"z": 1, "y": 2}], "c": {}}}',
        '{"n": NaN, "i": -Infinity, "s": "a\\u0000b", "\\udc00": "\\ud83d\\ude00"}',
        '{"k": 1, "a": 0, "k": 2}',
        '"text"',
        "12",
        "null",
    ]
    for text_ in texts:
        assert json.dumps(stored_json(text_)) == json.dumps(storable(json.loads(text_))), text_
    # SQLite's engines decode without sorting: the text is as the store wrote it, keys sorted, and gives the same.
    for text_ in texts[:2000]:
        assert json.dumps(written_json(text_)) == json.dumps(stored_json(text_)), text_
    assert written_json(texts[-5]) == stored_json(texts[-5])  # NaN, infinities and escapes as stored_json takes them


def _fffd(value: Any) -> Any:
    """NUL and lone surrogates as U+FFFD, in keys and strings (what storable() stores)."""
    if isinstance(value, str):
        return re.sub("[\x00\ud800-\udfff]", "\ufffd", value)
    if isinstance(value, dict):
        return {_fffd(k): _fffd(v) for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    if isinstance(value, list):
        return [_fffd(v) for v in value]  # pyright: ignore[reportUnknownVariableType]
    return value


async def _backend_pid(store: Store) -> int:
    async with store.atomic() as tx:
        return int((await tx.connection.execute(text("SELECT pg_backend_pid()"))).scalar_one())


@pytest.mark.parametrize("idle", [True, False], ids=["idle", "just-used"])
async def test_a_pooled_connection_killed_in_the_pool(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, idle: bool
) -> None:
    """A pooled PostgreSQL connection whose backend was terminated while it sat in the pool: after an idle spell it is
    pinged at checkout and replaced, so the next transaction runs; right after its last use it is not pinged (a ping
    on every checkout was three round trips), and the transaction fails with an error TurnKit retries as transient,
    after which the pool has replaced it (``turnkit/store/idle_ping.py``)."""
    monkeypatch.setattr(idle_ping, "IDLE_BEFORE_PING", 0.0 if idle else 3600.0)
    store = await Store.open(postgres_url)
    admin = create_async_engine(postgres_url)
    try:
        killed = await _backend_pid(store)
        async with admin.connect() as conn:
            await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": killed})
        if idle:
            assert await _backend_pid(store) != killed
        else:
            with pytest.raises(Exception) as failure:
                await _backend_pid(store)
            assert transient_store_error(failure.value), failure.value
            assert await _backend_pid(store) != killed
    finally:
        await admin.dispose()
        await store.close()


def _checkouts(store: Store) -> list[int]:
    """A list that grows by one at each checkout from ``store``'s pool (its ``checkout`` event)."""
    seen: list[int] = []
    event.listen(store.engine.sync_engine, "checkout", lambda *_: seen.append(1))
    return seen


async def test_consecutive_transactions_run_on_one_kept_connection(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction that committed keeps its connection for the next one instead of giving it back to the pool
    (``turnkit/store/kept_connections.py``): twenty transactions in a row check out once and run on one backend."""
    monkeypatch.setattr(kept_connections, "LEASE", 3600.0)
    store = await Store.open(postgres_url)
    try:
        await _backend_pid(store)
        checkouts = _checkouts(store)
        pids = {await _backend_pid(store) for _ in range(20)}
        assert len(pids) == 1 and checkouts == [], (pids, checkouts)
    finally:
        await store.close()


async def test_a_kept_connection_goes_back_to_the_pool_when_its_lease_ends(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection out of the pool longer than ``LEASE`` goes back to it, and the next transaction checks one out:
    the pool's recycle and invalidation checks still run at least once a lease."""
    monkeypatch.setattr(kept_connections, "LEASE", 0.0)
    store = await Store.open(postgres_url)
    try:
        await _backend_pid(store)
        checkouts = _checkouts(store)
        for _ in range(5):
            await _backend_pid(store)
        assert len(checkouts) == 5
    finally:
        await store.close()


async def test_a_transaction_that_fails_gives_its_connection_back_to_the_pool(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rolled-back transaction's connection is not kept: the pool's checkin resets it, and the next transaction
    checks one out."""
    monkeypatch.setattr(kept_connections, "LEASE", 3600.0)
    store = await Store.open(postgres_url)
    try:
        await _backend_pid(store)
        checkouts = _checkouts(store)
        with pytest.raises(RuntimeError, match="rolled back"):
            async with store.atomic() as tx:
                await tx.connection.execute(text("SELECT 1"))
                raise RuntimeError("rolled back")
        assert checkouts == []  # it ran on the kept connection
        await _backend_pid(store)
        assert len(checkouts) == 1
    finally:
        await store.close()


async def test_a_kept_connection_idle_too_long_is_pinged_before_use(postgres_url: str) -> None:
    """A kept connection idle for longer than ``IDLE_BEFORE_PING`` goes back to the pool with the time it was last
    used, so the pool's checkout pings it as it pings one idle in the pool: its backend, terminated meanwhile, is
    replaced and the transaction runs (without that time the pool would count its idleness from the checkin and let
    the dead connection through)."""
    store = await Store.open(postgres_url)
    admin = create_async_engine(postgres_url)
    try:
        killed = await _backend_pid(store)
        assert store._kept is not None  # pyright: ignore[reportPrivateUsage]
        [lease] = store._kept._kept[asyncio.get_running_loop()]  # pyright: ignore[reportPrivateUsage]
        lease.idle_since -= idle_ping.IDLE_BEFORE_PING + 1  # idle that long, without waiting for it
        async with admin.connect() as conn:
            await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": killed})
        assert await _backend_pid(store) != killed
    finally:
        await admin.dispose()
        await store.close()


async def test_a_kept_connection_no_transaction_takes_goes_back_to_the_pool(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection kept after a burst and not taken again for a ``LEASE`` goes back to the pool on a timer, with no
    transaction to take it there: a quiet process holds open what its pool keeps, not those as well."""
    monkeypatch.setattr(kept_connections, "LEASE", 0.05)
    store = await Store.open(postgres_url)
    try:
        await _pids_in_use(store, 3)  # three at once: three kept after them
        pool: Any = store.engine.pool

        async def none_checked_out() -> bool:
            return pool.checkedout() == 0

        await eventually(none_checked_out, timeout=10, what="the kept connections back in the pool")
        assert pool.checkedin() >= 3
    finally:
        await store.close()


async def test_kept_connections_are_closed_with_the_store(postgres_url: str) -> None:
    """``Store.close()`` gives the kept connections back to the pool before disposing of it: no backend of the store
    outlives it."""
    store = await Store.open(postgres_url)
    admin = create_async_engine(postgres_url)
    try:
        pids = await _pids_in_use(store, 3)  # three transactions at once: three connections kept after them
        await store.close()

        async def gone() -> bool:  # a backend ends a moment after its client closed the connection
            async with admin.connect() as conn:
                alive = (await conn.execute(text("SELECT pid FROM pg_stat_activity"))).scalars().all()
            return not pids & set(alive)

        await eventually(gone, timeout=10, what="the store's backends to end")
    finally:
        await admin.dispose()


async def _direct_store(postgres_url: str) -> tuple[Store, str]:
    """A store whose turn writes and reads go straight to asyncpg (each seen twice), and a turn of it."""
    store = await Store.open(postgres_url)
    async with store.atomic() as tx:
        conversation = await tx.create_conversation(agent_name="agent")
        turn = await tx.create_turn(conversation_id=conversation.id, agent_name="agent")
    for _ in range(2):
        async with store.atomic(turn_id=turn.id) as tx:
            await tx.update_turn(turn.id, claim_token=None)
    return store, turn.id


async def test_a_value_postgresql_rejects_on_the_direct_path_is_deterministic_and_unquoted(postgres_url: str) -> None:
    """Issue 8 item 11 on the asyncpg path (turnkit/store/postgres_direct.py): a string longer than its column fails
    with SQLAlchemy's error, which TurnKit reads as deterministic and describes without the value; the transaction
    rolls back and its connection stays in the pool, sound."""
    store, turn_id = await _direct_store(postgres_url)
    try:
        pid = await _backend_pid(store)
        with pytest.raises(DBAPIError) as failure:
            async with store.atomic(turn_id=turn_id) as tx:
                await tx.update_turn(turn_id, claim_token=SECRET * 10)  # 170 characters into a String(64)
        assert deterministic_store_error(failure.value) and not failure.value.connection_invalidated
        message = store_failure_message(failure.value)
        assert "SQLSTATE 22001" in message and SECRET not in message, message
        assert (await store.load_turn(turn_id)).claim_token is None
        assert await _backend_pid(store) == pid  # the same pooled connection, reused
    finally:
        await store.close()


async def test_a_connection_killed_under_a_direct_statement_is_transient_and_replaced(postgres_url: str) -> None:
    """Issue 8 on the asyncpg path: a backend terminated inside a transaction makes its next direct statement fail
    with SQLAlchemy's invalidated-connection error, which TurnKit retries as transient; nothing of the transaction is
    written, and the next transaction runs on a new connection."""
    store, turn_id = await _direct_store(postgres_url)
    admin = create_async_engine(postgres_url)
    try:
        with pytest.raises(DBAPIError) as failure:
            async with store.atomic(turn_id=turn_id) as tx:
                await tx.update_turn(turn_id, claim_token="written-then-lost")
                killed = int(await tx.connection.scalar(text("SELECT pg_backend_pid()")))
                async with admin.connect() as conn:
                    await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": killed})
                await tx.update_turn(turn_id, claim_token=None)
        assert failure.value.connection_invalidated and transient_store_error(failure.value), failure.value
        assert (await store.load_turn(turn_id)).claim_token is None
        assert await _backend_pid(store) != killed
    finally:
        await admin.dispose()
        await store.close()


async def _pids_in_use(store: Store, count: int) -> set[int]:
    """The backends of ``count`` transactions open at once: ``count`` of the pool's connections."""
    gate = asyncio.Barrier(count)

    async def one() -> int:
        async with store.atomic() as tx:
            pid = int((await tx.connection.execute(text("SELECT pg_backend_pid()"))).scalar_one())
            await gate.wait()
            return pid

    return set(await asyncio.gather(*(one() for _ in range(count))))


async def test_a_lost_connection_on_the_direct_path_drops_the_pools_older_connections(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37 (turnkit/store/postgres_direct.py): a connection lost under a direct statement is handed to
    SQLAlchemy's own handling, as on its path: the error says the connection was invalidated, and every connection
    pooled before the failure is replaced at its next checkout (the database restarted: they are gone too), not
    found dead one transaction at a time."""
    monkeypatch.setattr(idle_ping, "IDLE_BEFORE_PING", 3600.0)  # no ping at checkout: the pool itself must know
    store, turn_id = await _direct_store(postgres_url)
    admin = create_async_engine(postgres_url)
    try:
        before = await _pids_in_use(store, 3)
        with pytest.raises(DBAPIError) as failure:
            async with store.atomic(turn_id=turn_id) as tx:
                killed = int(await tx.connection.scalar(text("SELECT pg_backend_pid()")))
                async with admin.connect() as conn:
                    await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": killed})
                await tx.update_turn(turn_id, claim_token=None)  # a direct statement on the lost connection
        assert killed in before
        assert failure.value.connection_invalidated and transient_store_error(failure.value), failure.value
        assert not (await _pids_in_use(store, 3)) & before  # none of the older connections is used again
    finally:
        await admin.dispose()
        await store.close()


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "sqlalchemy"])
async def test_a_deadlock_is_transient_and_raised_as_on_sqlalchemys_path(postgres_url: str, direct: bool) -> None:
    """Issue 37: a deadlock between two transactions' row locks (SQLSTATE 40P01) raises the same exception on the
    direct path as on SQLAlchemy's (``DBAPIError`` whose ``orig`` is the dialect's DBAPI ``Error``), which TurnKit
    retries as transient; the loser's connection is not invalidated, and the winner commits."""
    store = await Store.open(postgres_url, direct=direct)
    try:
        async with store.atomic() as tx:
            conversation = await tx.create_conversation(agent_name="agent")
            first = await tx.create_turn(conversation_id=conversation.id, agent_name="agent")
            second = await tx.create_turn(conversation_id=conversation.id, agent_name="agent")
        for _ in range(2):  # seen twice: the locks go straight to asyncpg on the direct path
            async with store.atomic(turn_id=first.id):
                pass
        both_hold = asyncio.Barrier(2)

        async def cross(mine: str, theirs: str) -> None:
            async with store.atomic(turn_id=mine) as tx:
                await both_hold.wait()
                await tx.lock(turn_id=theirs)

        outcomes = await asyncio.gather(cross(first.id, second.id), cross(second.id, first.id), return_exceptions=True)
        errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        assert len(errors) == 1, outcomes
        error = errors[0]
        assert type(error) is DBAPIError and type(error.orig) is store.engine.dialect.loaded_dbapi.Error, repr(error)
        assert not error.connection_invalidated and transient_store_error(error)
        assert not deterministic_store_error(error)
        assert "SQLSTATE 40P01" in unavailable_message(error), unavailable_message(error)
    finally:
        await store.close()


async def test_a_connection_back_in_the_pool_inside_a_transaction_is_replaced(postgres_url: str) -> None:
    """The pool's rollback at check-in cannot see a transaction that the direct path began on asyncpg (SQLAlchemy's
    adapter is in autocommit for it). The direct path always ends its transactions; should one ever come back open,
    the next checkout replaces that connection rather than run a transaction inside it
    (``turnkit/store/idle_ping.py``)."""
    store = await Store.open(postgres_url)
    try:
        async with store.engine.connect() as conn:
            pooled = await conn.get_raw_connection()
            await pooled.driver_connection.execute("BEGIN")  # asyncpg's own: SQLAlchemy never knows of it
            leaked = int(await pooled.driver_connection.fetchval("SELECT pg_backend_pid()"))
        assert await _backend_pid(store) != leaked
    finally:
        await store.close()


async def test_a_constraint_sqlite_enforces_on_the_direct_path_is_deterministic(store: Store) -> None:
    """Issue 8 item 11 on the inline SQLite path (turnkit/store/direct.py): a prebuilt INSERT that breaks a unique
    index fails with SQLAlchemy's IntegrityError whether it ran through SQLAlchemy (its first execution) or on sqlite3
    itself (its second); TurnKit reads both as deterministic, and the store goes on."""
    if store.dialect != "sqlite":
        pytest.skip("SQLite's inline path; PostgreSQL: test_a_value_postgresql_rejects_on_the_direct_path_…")
    conversation = await store.create_conversation(agent_name="agent")
    now = datetime.now(UTC)
    duplicate = row_values(
        NewRow(ConversationRow, uid=conversation.id, agent_name="agent", metadata_={}, created_at=now, updated_at=now)
    )
    ran_on_sqlite3: list[bool] = []
    assert store.inline is not None

    def on_statement(_conn: Any, _cursor: Any, _statement: str, _parameters: Any, context: Any, _many: bool) -> None:
        ran_on_sqlite3.append(context is None)

    event.listen(store.inline.engine, "before_cursor_execute", on_statement)
    try:
        for _ in range(2):
            with pytest.raises(IntegrityError) as failure:
                async with store.atomic() as tx:
                    await tx.connection.execute(insert_columns(ConversationRow)[0], duplicate)
            assert deterministic_store_error(failure.value), failure.value
            assert "UNIQUE constraint failed" in store_failure_message(failure.value)
    finally:
        event.remove(store.inline.engine, "before_cursor_execute", on_statement)
    assert ran_on_sqlite3 == [False, True]
    assert (await store.load_conversation(conversation.id)).id == conversation.id


async def test_a_server_out_of_connections_is_transient_and_waited_out(postgres_url: str) -> None:
    """A PostgreSQL server that refuses a connection because it has too many (SQLSTATE 53300, what several worker
    processes with TurnKit's default pools meet at ``max_connections``) is away, not wrong: ``retry_store`` waits it
    out, so a model answer in hand is written once the server has a connection free instead of being asked again.
    Here the store's role may hold one connection, and a holder takes it for a moment."""
    role = f"turnkit_limited_{uuid.uuid4().hex[:8]}"
    admin = create_async_engine(postgres_url)
    async with admin.connect() as conn:
        await conn.execute(text(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 1"))
        await conn.commit()
    limited = make_url(postgres_url).set(username=role).render_as_string(hide_password=False)
    holder = create_async_engine(limited)
    store = await Store.open(limited, migrate=False)
    try:
        async with holder.connect() as held:
            await held.execute(text("SELECT 1"))
            with pytest.raises(DBAPIError) as refused:
                await _one_read(store)
            assert transient_store_error(refused.value), refused.value
            assert "53300" in unavailable_message(refused.value), unavailable_message(refused.value)

            waiting = asyncio.create_task(retry_store(lambda: _one_read(store), what="test"))
            await asyncio.sleep(0.3)  # the fault lasts this long: the retry must still be waiting, not failed
            assert not waiting.done()
        await holder.dispose()
        await asyncio.wait_for(waiting, 30)
    finally:
        await store.close()
        await holder.dispose()
        async with admin.connect() as conn:
            await conn.execute(text(f"DROP ROLE IF EXISTS {role}"))
            await conn.commit()
        await admin.dispose()


async def _one_read(store: Store) -> None:
    async with store.reads() as tx:
        await tx.connection.execute(text("SELECT 1"))
