"""What counts as a transient store error, and retrying a store phase inside an activity (issue 8 item 3)."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from turnkit._activities import store_retry
from turnkit._activities.store_retry import retry_store
from turnkit.store.errors import transient_store_error


def test_connection_failures_and_busy_databases_are_transient() -> None:
    assert transient_store_error(ConnectionRefusedError(111, "Connect call failed"))
    assert transient_store_error(ConnectionResetError())
    locked = OperationalError("BEGIN IMMEDIATE", {}, sqlite3.OperationalError("database is locked"))
    assert transient_store_error(locked)
    invalidated = DBAPIError("SELECT 1", {}, Exception("server closed"), connection_invalidated=True)
    assert transient_store_error(invalidated)
    try:
        try:
            raise ConnectionResetError("reset by peer")
        except ConnectionResetError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as wrapped:
        assert transient_store_error(wrapped)  # the cause counts


def test_data_and_constraint_errors_are_not_transient() -> None:
    assert not transient_store_error(IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE failed")))
    assert not transient_store_error(OperationalError("SELECT", {}, sqlite3.OperationalError("no such table")))
    assert not transient_store_error(ValueError("A string literal cannot contain NUL (0x00) characters."))


async def test_retry_store_waits_out_transient_errors_and_raises_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_retry, "INITIAL_DELAY", 0.001)
    attempts: list[int] = []

    async def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionRefusedError(111, "Connect call failed")
        return "committed"

    assert await retry_store(flaky, what="test") == "committed"
    assert len(attempts) == 3

    async def broken() -> str:
        attempts.append(1)
        raise IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE failed"))

    attempts.clear()
    with pytest.raises(IntegrityError):
        await retry_store(broken, what="test")
    assert len(attempts) == 1
