"""Settings carried by a connection and by a worker's plugin, over the process's defaults (``turnkit.config``)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

import turnkit
from turnkit.config import configure, settings, using_settings
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit, connect
from turnkit.store import Store
from turnkit.testing import ScriptedClient


async def test_two_workers_in_one_process_run_turns_under_their_own_settings(
    temporal_address: str, database_url: str
) -> None:
    """Each worker's activities read the settings its plugin carries: two workers of one process, on two task
    queues, answer the same agent (which names no client) with their own default client, while the process's
    default client is never asked."""
    configure(client=ScriptedClient(["from the process default"]))
    turnkit.register(turnkit.Agent("tenant-agent", model="scripted"))
    store = await Store.open(database_url)
    try:
        answers: dict[str, str | None] = {}
        for tenant in ("a", "b"):
            plugin = TurnKitPlugin(store, settings={"client": ScriptedClient([f"from tenant {tenant}"])})
            client = await Client.connect(temporal_address, plugins=[plugin])
            tk = TurnKit(client, store, task_queue=f"tenant-{tenant}-{uuid.uuid4().hex[:8]}")
            async with tk.worker():
                run = await tk.run(turnkit.Agent("tenant-agent", model="scripted"), "hello")
            answers[tenant] = run.output_text
        assert answers == {"a": "from tenant a", "b": "from tenant b"}
    finally:
        await store.close()


async def test_a_connections_settings_apply_inside_its_block_only(temporal_address: str, database_url: str) -> None:
    """``connect(settings=…)`` layers its settings over the defaults for the code in its ``async with`` block; nested
    scopes layer too, and leaving restores what was there."""
    configure(max_spend=1.0)
    async with connect(temporal_address=temporal_address, database_url=database_url, settings={"max_spend": 2.0}):
        assert settings.max_spend == 2.0
        with using_settings({"max_iterations": 7}):
            assert (settings.max_spend, settings.max_iterations) == (2.0, 7)
        assert settings.max_iterations == 25
    assert settings.max_spend == 1.0


async def test_bad_settings_are_refused_before_anything_opens(temporal_address: str, tmp_path: Path) -> None:
    """An unknown setting or a budget no turn can run under fails ``connect`` and the plugin with ``ConfigError``,
    as ``configure`` does, and nothing is changed or opened (no store file is created)."""
    database = tmp_path / "never.db"
    with pytest.raises(turnkit.ConfigError, match="unknown setting: max_spent"):
        async with connect(
            temporal_address=temporal_address, database_url=f"sqlite+aiosqlite:///{database}", settings={"max_spent": 1}
        ):
            pass
    with pytest.raises(turnkit.ConfigError):
        TurnKitPlugin(settings={"max_iterations": 0})
    with pytest.raises(AttributeError, match="read-only"):
        settings.max_spend = 3.0  # pyright: ignore[reportAttributeAccessIssue]
    assert settings.max_spend is None
    assert not database.exists()
