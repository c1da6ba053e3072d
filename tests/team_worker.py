"""A team's worker process for the crash test: ``python -m tests.team_worker ADDRESS TASK_QUEUE DATABASE_URL``.

One worker serves the team's workflow (``tests/team_app.py``) and, through ``TurnKitPlugin(store)``, TurnKit's workflows
and activities, on one task queue, as the README shows. Its agents answer from scripts and leave a line per model
call in ``$TURNKIT_CRASH_DIR/<agent>`` (the request id), so the test can tell what ran, and how often. The reviewers
(``legal``, ``finance``) hang in their first model call until the worker is killed: the parallel phase is in flight.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

import turnkit
from tests.team_app import ApprovalWorkflow, AskWorkflow
from turnkit.store import Store

# A model call lost with a killed worker is noticed after 2 s, not the default 30.
turnkit.configure(model_heartbeat_timeout=2.0)


def trace(agent: str, request: turnkit.ModelRequest) -> int:
    """Append the request's id to the agent's trace; how many model calls the agent has had."""
    path = Path(os.environ["TURNKIT_CRASH_DIR"]) / agent
    with path.open("a") as handle:
        handle.write(f"{request.metadata.get('request_id')}\n")
    return len(path.read_text().splitlines())


class Drafter:
    """Drafts, then combines the reviews it is given."""

    async def chat(self, request: turnkit.ModelRequest) -> turnkit.Result:
        trace("drafter", request)
        asked = str(request.messages[-1]["content"])
        if asked.startswith("Combine"):
            return turnkit.Result.build(text="APPROVED: " + " | ".join(asked.splitlines()[1:]))
        return turnkit.Result.build(text="DRAFT: " + asked.removeprefix("Draft an approval request: "))


class Reviewer:
    """Reviews the draft; its first call hangs until the worker running it is killed."""

    def __init__(self, name: str, verdict: str) -> None:
        self.name, self.verdict = name, verdict

    async def chat(self, request: turnkit.ModelRequest) -> turnkit.Result:
        if trace(self.name, request) == 1:
            await asyncio.sleep(3600)
        return turnkit.Result.build(text=self.verdict)


turnkit.register(turnkit.Agent("drafter", model="scripted", client=Drafter()))
turnkit.register(turnkit.Agent("legal", model="scripted", client=Reviewer("legal", "no legal risk")))
turnkit.register(turnkit.Agent("finance", model="scripted", client=Reviewer("finance", "within budget")))


async def main(address: str, task_queue: str, database_url: str) -> None:
    store = await Store.open(database_url)
    try:
        client = await Client.connect(address, plugins=[turnkit.TurnKitPlugin(store)])
        async with Worker(client, task_queue=task_queue, workflows=[ApprovalWorkflow, AskWorkflow]):
            print("worker ready", flush=True)
            await asyncio.Event().wait()
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
