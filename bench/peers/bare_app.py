"""The workload on bare Temporal: the floor under every agent runtime, not a peer.

A workflow per turn runs the same activities as the agent runtimes do, one after another, with nothing around
them: K + 1 ``model`` activities (the scripted model of :mod:`bench.peers.workload`, which takes the prompt and the
tool results so far and answers a tool call or the final answer) and K ``lookup`` activities, on the SDK's default
data converter, in the default sandbox, started and awaited by ``execute_workflow``. No framework, no store, no
record of the conversation.

What it costs per turn is what the Temporal SDK and the dev server cost for this workload's activities and workflow
tasks, which every system here pays as well: about the least CPU per turn any of them can spend on the workload, and
so about the most throughput any of them can reach (see bench/README.md, "The floor"). It bounds throughput, not
latency: a system may still start its turns faster than ``execute_workflow`` does (TurnKit's eager start).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

from bench.peers import workload

ACTIVITY_TIMEOUT = timedelta(seconds=60)


@dataclass
class ModelCall:
    """What the scripted model sees: the prompt and the tool results of this turn so far."""

    prompt: str
    results: list[str]


@dataclass
class ModelAnswer:
    """A tool call (its query) or the final answer."""

    query: str | None = None
    text: str | None = None


@activity.defn(name="model")
async def model(call: ModelCall) -> ModelAnswer:
    """The scripted model: another lookup until K results, then the answer."""
    k = workload.parse_k(call.prompt)
    done = len(call.results)
    if done < k:
        return ModelAnswer(query=workload.tool_query(done))
    return ModelAnswer(text=workload.final_answer(k))


@activity.defn(name=workload.TOOL_NAME)
async def lookup(q: str) -> str:
    """Look something up."""
    return workload.lookup_result(q)


@workflow.defn
class BareTurn:
    """One turn: model, tool, model... until the model answers."""

    @workflow.run
    async def run(self, prompt: str) -> str:
        results: list[str] = []
        while True:
            answer = await workflow.execute_activity(
                model, ModelCall(prompt, results), start_to_close_timeout=ACTIVITY_TIMEOUT
            )
            if answer.query is None:
                return answer.text or ""
            results.append(
                await workflow.execute_activity(lookup, answer.query, start_to_close_timeout=ACTIVITY_TIMEOUT)
            )


class System:
    """Bare Temporal, for :mod:`bench.peers.serve`."""

    client: Client

    #: Prefix of the task queue and of the turn workflows' ids.
    name = "bare"

    def __init__(self) -> None:
        self.task_queue = f"bench-{self.name}-{uuid.uuid4().hex[:8]}"
        self._worker: Worker | None = None

    def activities(self) -> list[Callable[..., Any]]:
        """The worker's ``model`` and ``lookup`` activities: :class:`BareTurn` schedules them by name, so a system
        built on this one (``bare_pg_app.py``) may run its own under the same names."""
        return [model, lookup]

    async def open(self, address: str) -> None:
        self.client = await Client.connect(address)
        self._worker = Worker(
            self.client, task_queue=self.task_queue, workflows=[BareTurn], activities=self.activities()
        )
        await self._worker.__aenter__()

    async def turn(self, k: int) -> list[str]:
        workflow_id = f"{self.name}-{uuid.uuid4().hex}"
        await self._before_start(workflow_id, workload.prompt(k))
        output = await self.client.execute_workflow(
            BareTurn.run, workload.prompt(k), id=workflow_id, task_queue=self.task_queue
        )
        workload.check(k, output)
        return [workflow_id]

    async def _before_start(self, workflow_id: str, prompt: str) -> None:
        """What a system built on this one does before it starts a turn's workflow (nothing here)."""

    async def close(self) -> None:
        if self._worker is not None:
            await self._worker.__aexit__(None, None, None)
