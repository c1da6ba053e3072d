"""CPU of one turn's activities, without Temporal: ``python -m bench.turn_activities``.

A K-iteration turn of the :mod:`bench.peers` workload runs K + 1 ``turnkit.model`` activities and K tool activities.
This script runs those activities' own code as the turn workflow would call them, one after another, in
``temporalio.testing.ActivityEnvironment`` (the activity's context, no worker, no server): a fresh conversation and
its first turn written as ``ask`` writes a direct turn, then each model call with the step the last one returned,
and each tool call it proposed, until the model answers. It reports the process CPU per turn (the median of
``--rounds`` rounds), as :mod:`bench.store_cpu` does for the store's calls alone.

What it leaves out: the worker's interceptors (but the attempt's start is noted as its heartbeat clock notes it, so
no block beats before a beat is due), the SDK's activity handling and payload conversion around each call,
the turn workflow and the dev server. What it keeps: everything the activities do themselves, the store included
(the model's request, the scripted model, the charges, the budget and control checks, the tool's dispatch and
result). ``python -m bench.instructions --work activities`` counts it under callgrind, which this machine's speed
does not move.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

from temporalio.client import Client
from temporalio.common import RawValue, RetryPolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import ActivityEnvironment

import turnkit
from bench.peers import workload
from bench.peers.turnkit_app import AGENT
from turnkit._activities.model import ModelActivities
from turnkit._activities.tools import ToolActivities
from turnkit._engine.direct_turn import write_direct_turn
from turnkit._engine.ids import new_id
from turnkit._temporal.heartbeats import note_attempt_start
from turnkit.kernel.payloads import (
    ModelCall,
    ModelStep,
    SubmitTurn,
    ToolCallInput,
    ToolCallRef,
    ToolOutcome,
    TurnInput,
)
from turnkit.store import Store

TASK_QUEUE = "bench-turn-activities"


class TurnActivities:
    """The model and tool activities of one store, each run in an activity environment configured as the turn
    workflow schedules it (its timeouts and retry policy, so the activity sees what it expects)."""

    def __init__(self, store: Store, client: Client) -> None:
        turnkit.register(AGENT)  # registered when bench.peers.turnkit_app was imported, unless a test reset it since
        self.store = store
        #: What ``activity.client()`` answers: a tool call takes it for its context's deliveries; never used here.
        self.client = client
        self.model_activities = ModelActivities(store)
        self.tool_activities = ToolActivities(store)
        self.converter = pydantic_data_converter.payload_converter
        #: Heartbeats the activities sent: none in a block of milliseconds, as on a worker.
        self.heartbeats = 0

    def _environment(self, activity_type: str, timeout: float, heartbeat: float, attempts: int) -> ActivityEnvironment:
        environment = ActivityEnvironment(client=self.client)
        environment.payload_converter = self.converter
        environment.on_heartbeat = self._heartbeat
        environment.info = dataclasses.replace(
            environment.info,
            activity_type=activity_type,
            task_queue=TASK_QUEUE,
            start_to_close_timeout=timedelta(seconds=timeout),
            heartbeat_timeout=timedelta(seconds=heartbeat),
            retry_policy=RetryPolicy(maximum_attempts=attempts),
        )
        return environment

    def _heartbeat(self, *details: object) -> None:
        self.heartbeats += 1

    async def turn(self, k: int) -> str:
        """One K-iteration turn in a fresh conversation: its direct start's write, then its activities; its id."""
        conversation = await self.store.create_conversation(agent_name=AGENT.name)
        request = SubmitTurn(
            conversation_id=conversation.id,
            turn_id=new_id("turn"),
            message_id=new_id("message"),
            text=workload.prompt(k),
            agent_name=AGENT.name,
        )
        turn = await write_direct_turn(self.store, request, AGENT.name, task_queue=TASK_QUEUE)
        assert turn is not None, "the conversation is fresh: its first turn starts directly"
        for iteration in range(k + 2):
            step = await self._model(turn, iteration)
            if step.outcome != "tools":
                assert step.outcome == "completed", step
                return turn.turn_id
            for call in step.tool_calls:
                outcome = await self._tool(turn, call)
                assert outcome.status == "completed", outcome
        raise AssertionError(f"the turn did not end after {k + 1} model calls")

    async def _model(self, turn: TurnInput, iteration: int) -> ModelStep:
        policy = turn.model_policy
        call = ModelCall(
            turn_id=turn.turn_id,
            root_turn_id=turn.root_turn_id,
            request_id=str(uuid.uuid4()),
            iteration=iteration,
            audit_apart=True,
        )
        environment = self._environment("turnkit.model", policy.timeout, policy.heartbeat, policy.max_attempts)
        note_attempt_start()  # as the worker's HeartbeatClock does: no beat is due in a block of milliseconds
        return await environment.run(self.model_activities.model, call)

    async def _tool(self, turn: TurnInput, call: ToolCallRef) -> ToolOutcome:
        request = ToolCallInput(
            turn_id=turn.turn_id,
            conversation_id=turn.conversation_id,
            root_turn_id=turn.root_turn_id,
            agent_name=turn.agent_name,
            call=call,
        )
        policy = request.call.policy
        assert policy is not None
        environment = self._environment(
            f"tool:{request.call.name}", policy.timeout, policy.heartbeat, max(policy.max_attempts, 1)
        )
        raw = RawValue(self.converter.to_payload(request))
        note_attempt_start()
        return await environment.run(self.tool_activities.run_tool, [raw])


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="turnkit-turn-activities-") as tmp:
        url = args.database_url or f"sqlite+aiosqlite:///{Path(tmp) / 'store.db'}"
        store = await Store.open(url)
        try:
            # Lazy: never connected, for nothing here sends a signal (no delivery, no callback, no waiter).
            client = await Client.connect("127.0.0.1:1", lazy=True)
            activities = TurnActivities(store, client)
            for _ in range(args.warmup):
                await activities.turn(args.k)
            rounds: list[float] = []
            for _ in range(args.rounds):
                started = time.process_time()
                for _ in range(args.turns):
                    await activities.turn(args.k)
                rounds.append((time.process_time() - started) / args.turns * 1000)
        finally:
            await store.close()
    spread = ", ".join(f"{r:.2f}" for r in rounds)
    print(
        f"the activities of a K = {args.k} turn ({store.dialect}): {statistics.median(rounds):.2f} ms of CPU "
        f"(median of {args.rounds} rounds of {args.turns}; rounds {spread})"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--k", type=int, default=8, help="tool-calling iterations per turn (default 8)")
    parser.add_argument("--turns", type=int, default=50, help="turns per round (default 50)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=10, help="turns before the rounds (default 10)")
    parser.add_argument("--database-url", help="the store (default: a temporary SQLite file)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
