"""``bench.pg_client_cost`` times each operation it reports, against a real PostgreSQL."""

from __future__ import annotations

from bench.pg_client_cost import measure


async def test_every_operation_is_timed_once_per_round_on_the_stores_own_pool(postgres_url: str) -> None:
    """Each of the seven operations (the store's transactions, raw asyncpg pooled and held, the lock alone,
    SQLAlchemy's checkouts) runs against the store's schema and gets one positive figure per round; a store
    transaction that sends its three statements costs more than one that sends none (they differ by three round
    trips, ~100 µs and more), and raw asyncpg's three statements more than its lock alone (two round trips)."""
    figures = await measure(postgres_url, n=40, rounds=2)
    assert len(figures) == 7
    assert all(len(values) == 2 and all(value > 0 for value in values) for values in figures.values())
    locked = figures["store transaction (BEGIN, lock, COMMIT)"]
    empty = figures["store transaction with no statement"]
    assert min(locked) > max(empty)
    assert min(figures["raw asyncpg, one connection held"]) > max(
        figures["raw asyncpg, held, the lock alone (autocommit)"]
    )
