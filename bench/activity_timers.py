"""The dev server's activity timers for each set of activity options: ``python -m bench.activity_timers``.

Bare Temporal's workload (:mod:`bench.peers.bare_app`'s activities, K tool-loop iterations) runs with the activity
options of bare Temporal (start-to-close 60 s) and with those TurnKit gives its model and tool activities
(schedule-to-close = the time left before the turn's deadline, heartbeat timeout 30 s), and two sets in between. For
each set, a burst of turns, then a wait long enough for every timer of the burst to fire (the deadline is shortened
to 40 s for that); from the dev server's counters (:mod:`bench.server_work`): the activity and workflow-task timer
tasks fired per turn. Then, for TurnKit's set, the server's CPU in the seconds when the bursts' heartbeat timers fire
against a quiet window before it: what one firing costs the server.

What it showed (bench/README.md, "The dev server's counters per turn, and its timers"): every set fires one activity
timer per activity, so TurnKit's options cost the server no timer that bare Temporal's do not; TurnKit's fire 30 s
after the activity starts and bare Temporal's 60 s after, which decides in which of a benchmark's rounds they land.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from temporalio import workflow

with workflow.unsafe.imports_passed_through():  # the sandbox re-imports this module: the rest is not workflow code
    from temporalio.client import Client
    from temporalio.worker import Worker

    from bench import server_work
    from bench.action_counts import free_port
    from bench.peers import workload
    from bench.peers.bare_app import ModelCall, lookup, model
    from bench.peers.serve import server_cpu
    from turnkit._temporal.process import exit_process

#: Seconds after a burst by which every timer of its activities (60 s at most) and workflow tasks (10 s) has fired, so
#: that a burst's count holds its own timers and none of the burst's before it.
SETTLE: Final = 66.0


@dataclass
class Options:
    """One set of activity options, in seconds (None: not set)."""

    start_to_close: float | None = 60.0
    schedule_to_close: float | None = None
    heartbeat: float | None = None


#: The sets compared, by name. TurnKit's deadline (300 s by default) is 40 s here, so that its timers fire too.
OPTION_SETS: Final = {
    "bare Temporal's (start-to-close 60 s)": Options(),
    "start-to-close 40 s, heartbeat 30 s": Options(start_to_close=40, heartbeat=30),
    "schedule-to-close 40 s": Options(start_to_close=None, schedule_to_close=40),
    "TurnKit's (schedule-to-close 40 s, heartbeat 30 s)": Options(
        start_to_close=None, schedule_to_close=40, heartbeat=30
    ),
}


@dataclass
class TimedTurn:
    """The prompt and the activities' options."""

    prompt: str
    options: Options


def _seconds(value: float | None) -> timedelta | None:
    return None if value is None else timedelta(seconds=value)


@workflow.defn
class OptionsTurn:
    """Bare Temporal's turn (:class:`bench.peers.bare_app.BareTurn`) with the activity options of its input."""

    @workflow.run
    async def run(self, turn: TimedTurn) -> str:
        given = turn.options
        options: dict[str, Any] = {
            "start_to_close_timeout": _seconds(given.start_to_close),
            "schedule_to_close_timeout": _seconds(given.schedule_to_close),
            "heartbeat_timeout": _seconds(given.heartbeat),
        }
        results: list[str] = []
        while True:
            answer = await workflow.execute_activity(model, ModelCall(turn.prompt, results), **options)
            if answer.query is None:
                return answer.text or ""
            results.append(await workflow.execute_activity(lookup, answer.query, **options))


def _fired(before: dict[str, float], after: dict[str, float], task_type: str) -> float:
    return sum(
        value - before.get(key, 0.0)
        for key, value in after.items()
        if key.startswith("task_requests{") and f'task_type="{task_type}"' in key
    )


async def main(args: argparse.Namespace) -> None:
    port = free_port()
    env = await server_work.start_dev_server(port)
    try:
        client = await Client.connect(env.client.service_client.config.target_host)
        task_queue = f"bench-timers-{uuid.uuid4().hex[:8]}"
        async with Worker(client, task_queue=task_queue, workflows=[OptionsTurn], activities=[model, lookup]):

            async def burst(options: Options) -> None:
                prompt = workload.prompt(args.k)
                await asyncio.gather(
                    *(
                        client.execute_workflow(
                            OptionsTurn.run, TimedTurn(prompt, options), id=uuid.uuid4().hex, task_queue=task_queue
                        )
                        for _ in range(args.turns)
                    )
                )

            await burst(Options())  # warm-up, and its timers fired before the first count
            await asyncio.sleep(SETTLE)
            print(f"K = {args.k}, {args.turns} turns per burst; timers fired per turn, the burst's own, all of them:")
            for name, options in OPTION_SETS.items():
                before = server_work.read_counters(port)
                await burst(options)
                await asyncio.sleep(SETTLE)
                after = server_work.read_counters(port)
                activity = _fired(before, after, "TimerActiveTaskActivityTimeout") / args.turns
                task = _fired(before, after, "TimerActiveTaskWorkflowTaskTimeout") / args.turns
                print(f"  {name:<52} activity timers {activity:5.1f}, workflow-task timers {task:5.1f}")
            print("\nwhat a heartbeat timer's firing costs the dev server (TurnKit's options, 300 s deadline):")
            for _ in range(args.rounds):
                await burst(Options(start_to_close=None, schedule_to_close=300, heartbeat=30))
                await asyncio.sleep(15)  # past the workflow-task timers (10 s), before the heartbeat timers (30 s)
                quiet_counts, quiet_cpu = server_work.read_counters(port), server_cpu()
                await asyncio.sleep(10)
                firing_counts, firing_cpu = server_work.read_counters(port), server_cpu()
                quiet = (firing_cpu - quiet_cpu) / 10
                await asyncio.sleep(12)
                done_counts, done_cpu = server_work.read_counters(port), server_cpu()
                fired = _fired(firing_counts, done_counts, "TimerActiveTaskActivityTimeout")
                early = _fired(quiet_counts, firing_counts, "TimerActiveTaskActivityTimeout")
                extra = (done_cpu - firing_cpu) - quiet * 12
                print(
                    f"  {fired:.0f} fired in 12 s ({early:.0f} in the quiet 10 s before, {quiet:.3f} cores there): "
                    f"{1000 * extra / max(fired, 1):.3f} ms of server CPU each"
                )
                await asyncio.sleep(SETTLE - 37)  # the rest of this burst's timers; none waits for 300 s
    finally:
        await env.shutdown()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="The dev server's activity timers for each set of activity options")
    parser.add_argument("--k", type=int, default=8, help="tool-loop iterations per turn (default 8)")
    parser.add_argument("--turns", type=int, default=40, help="turns per burst (default 40)")
    parser.add_argument("--rounds", type=int, default=2, help="bursts for the cost of a firing (default 2)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
    exit_process()  # the Temporal client's native threads can abort a finalizing interpreter (_temporal/process.py)
