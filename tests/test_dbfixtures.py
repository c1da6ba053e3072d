"""Smoke test for tests/dbfixtures.py: every backend URL opens and answers SELECT 1."""

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine


async def test_database_url_select_one(database_url: str) -> None:
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
    finally:
        await engine.dispose()


def test_postgres_url_is_a_fresh_test_database(postgres_url: str) -> None:
    assert postgres_url.rsplit("/", 1)[-1].startswith("turnkit_test_")
