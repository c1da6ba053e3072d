"""Record the replay-test histories: ``python -m tests.record_histories`` (``make histories``).

Runs every scenario of :mod:`tests.history_scenarios` on a fresh Temporal dev server with a scripted model and a
throw-away SQLite store, and writes ``tests/histories/<scenario>[-<label>]-<WorkflowType>-v<N>.json`` (a label when
a scenario keeps two histories of one workflow type). Re-record only on purpose (a deliberate change to workflow
code, guarded by a patch for old histories) and commit the result like a snapshot. Existing files of the same version
are overwritten; bump ``--version`` to keep the old ones. Name scenarios to record only those.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import uuid
from pathlib import Path

from temporalio.client import Client, WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from tests.history_scenarios import SCENARIOS, history_prefix, register_scenario_agents, workflow_id
from turnkit.kernel.search_attributes import ALL_SEARCH_ATTRIBUTES
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit, temporal_binary
from turnkit.store import Store

HISTORIES_DIR = Path(__file__).parent / "histories"


def workflow_type(history: WorkflowHistory) -> str:
    """The workflow type recorded in the history's first event."""
    return history.events[0].workflow_execution_started_event_attributes.workflow_type.name


async def record(names: list[str], *, version: int, out: Path) -> list[Path]:
    """Run the scenarios ``names`` and write their histories under ``out``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    register_scenario_agents()
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), plugins=[TurnKitPlugin()], search_attributes=ALL_SEARCH_ATTRIBUTES
    )
    try:
        with tempfile.TemporaryDirectory(prefix="turnkit-histories-") as tmp:
            store = await Store.open(f"sqlite+aiosqlite:///{Path(tmp) / 'store.db'}")
            try:
                address = env.client.service_client.config.target_host
                client = await Client.connect(address, plugins=[TurnKitPlugin(store)])
                tk = TurnKit(client, store, task_queue=f"histories-{uuid.uuid4().hex[:12]}")
                async with tk.worker():
                    for name in names:
                        for entry in await SCENARIOS[name](tk):
                            history = await client.get_workflow_handle(workflow_id(entry)).fetch_history()
                            path = out / f"{history_prefix(name, entry)}-{workflow_type(history)}-v{version}.json"
                            path.write_text(history.to_json() + "\n")
                            written.append(path)
                            print(f"{path} ({len(history.events)} events)")
            finally:
                await store.close()
    finally:
        await env.shutdown()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=f"default: all of {', '.join(SCENARIOS)}")
    parser.add_argument("--version", type=int, default=1, help="the -v<N> suffix of the files (default 1)")
    parser.add_argument("--out", type=Path, default=HISTORIES_DIR, help=f"default: {HISTORIES_DIR}")
    args = parser.parse_args(argv)
    unknown = [name for name in args.scenarios if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}")
    asyncio.run(record(list(args.scenarios) or list(SCENARIOS), version=args.version, out=args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
