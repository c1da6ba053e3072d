"""Database fixtures for the TurnKit tests (a pytest plugin).

Enable with ``pytest_plugins = ["tests.dbfixtures"]`` in ``tests/conftest.py``.

Fixtures:

- ``postgres_admin_url`` (session): the admin URL from ``TURNKIT_TEST_POSTGRES_URL``
  (default ``postgresql+asyncpg://postgres@127.0.0.1:5432/postgres``), checked
  for connectivity. If the server is unreachable, tests that need it are
  skipped, or fail when ``TURNKIT_REQUIRE_POSTGRES=1`` (as in CI).
- ``postgres_url`` (session): a fresh ``turnkit_test_<hex>`` database, dropped
  at session end. Use it directly when a test module is happy to share one
  PostgreSQL database for the whole session.
- ``database_url`` (function, parametrized ``sqlite`` / ``postgres``): a
  SQLAlchemy async URL. SQLite gets a new file per use; PostgreSQL shares the
  session database from ``postgres_url``.

All fixtures are synchronous. The asyncpg admin calls run under ``asyncio.run``
in a helper thread, so they never touch pytest-asyncio's session event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy.engine import URL, make_url

DEFAULT_POSTGRES_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
"""Admin URL used when ``TURNKIT_TEST_POSTGRES_URL`` is not set."""

CONNECT_TIMEOUT_SECONDS = 3
"""How long the connectivity check waits for PostgreSQL."""

_T = TypeVar("_T")
_sqlite_counter = itertools.count(1)


def _run_async(factory: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run a coroutine to completion on a private event loop in a helper thread."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="turnkit-dbfixtures") as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


def _asyncpg_dsn(url: URL) -> str:
    """Turn a SQLAlchemy ``postgresql+asyncpg://`` URL into a plain asyncpg DSN."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def _display(url: URL) -> str:
    return url.render_as_string(hide_password=True)


async def _execute_admin(admin_url: URL, *statements: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(_asyncpg_dsn(admin_url), timeout=CONNECT_TIMEOUT_SECONDS)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def _check_postgres(admin_url: URL) -> str | None:
    """Return None if PostgreSQL answers ``SELECT 1``, else a description of the failure."""
    try:
        import asyncpg
    except ImportError:
        return "asyncpg is not installed (pip install -e '.[postgres]')"

    async def probe() -> None:
        conn = await asyncpg.connect(_asyncpg_dsn(admin_url), timeout=CONNECT_TIMEOUT_SECONDS)
        try:
            await conn.fetchval("SELECT 1")
        finally:
            await conn.close()

    try:
        _run_async(lambda: asyncio.wait_for(probe(), CONNECT_TIMEOUT_SECONDS + 1))
    except Exception as exc:  # any failure means "not usable": refused, timeout, auth, ...
        return f"{type(exc).__name__}: {exc}"
    return None


def _postgres_required() -> bool:
    return os.environ.get("TURNKIT_REQUIRE_POSTGRES", "").strip().lower() in {"1", "true", "yes"}


def create_postgres_database(admin_url: str) -> str:
    """Create a fresh ``turnkit_test_<hex>`` database and return its SQLAlchemy URL."""
    admin = make_url(admin_url)
    name = f"turnkit_test_{secrets.token_hex(4)}"
    _run_async(lambda: _execute_admin(admin, f'CREATE DATABASE "{name}"'))
    return admin.set(database=name).render_as_string(hide_password=False)


def drop_postgres_database(admin_url: str, database_url: str) -> None:
    """Drop a database made by `create_postgres_database`, closing any open sessions."""
    name = make_url(database_url).database
    _run_async(lambda: _execute_admin(make_url(admin_url), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    """Admin URL of a reachable PostgreSQL server; skips (or fails in CI) otherwise."""
    url = os.environ.get("TURNKIT_TEST_POSTGRES_URL") or DEFAULT_POSTGRES_URL
    problem = _check_postgres(make_url(url))
    if problem is not None:
        where = _display(make_url(url))
        if _postgres_required():
            pytest.fail(f"PostgreSQL not reachable at {where} and TURNKIT_REQUIRE_POSTGRES=1 ({problem})")
        pytest.skip(
            f"PostgreSQL not reachable at {where}: set TURNKIT_TEST_POSTGRES_URL to run the PostgreSQL tests"
            f" ({problem})"
        )
    return url


@pytest.fixture(scope="session")
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, dropped at session end."""
    url = create_postgres_database(postgres_admin_url)
    try:
        yield url
    finally:
        drop_postgres_database(postgres_admin_url, url)


@pytest.fixture(scope="session")
def _sqlite_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sqlite")


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def database_url(request: pytest.FixtureRequest, _sqlite_dir: Path) -> str:
    """SQLAlchemy async URL, once per backend.

    ``sqlite`` is a new, empty file for every test. ``postgres`` is the session
    database from `postgres_url` (shared, so tests must not assume it is empty);
    it skips when PostgreSQL is unreachable.
    """
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{_sqlite_dir / f'turnkit-{next(_sqlite_counter)}.db'}"
    return request.getfixturevalue("postgres_url")
