"""The program of tests/test_lost_submits.py: caller and worker in one process, as the README's default setup runs them.

``python -m tests.lost_submit_app --address A --database-url D --task-queue Q --conversation C TEXT...`` runs a worker
in-process and asks each ``TEXT`` in conversation ``C`` (``wait=False``), one after the other. Before the last one it
arms a hang point, so that the process blocks inside the window where a submission is written but not yet accepted:

``submit``  the lane's ``turnkit.submit_turn`` has committed the turn, in the workflow task that would accept the
            update (an activity interceptor blocks after the body)
``start``   ``ask`` has committed a fresh conversation's first turn, before it starts the turn's workflow

It writes ``$TURNKIT_LOST_SUBMIT_DIR/hung`` when it blocks; the test then kills it and the dev server together. As a
worker app (``worker.py --app tests.lost_submit_app``) the module registers the same agent; the workers search for
lost submissions every ``$TURNKIT_LOST_SUBMIT_GRACE`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

import turnkit
from turnkit import handles
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit
from turnkit.store import Store

#: Where the answer of a turn is: the model answers every user text with ``answer to <text>``.
ANSWER = "answer to {}"


class _Answers:
    """A model that takes a moment (so that earlier turns are still in flight when the process dies) and answers the
    last user message."""

    async def chat(self, request: turnkit.ModelRequest) -> turnkit.Result:
        await asyncio.sleep(0.1)
        last = [m for m in request.messages if m["role"] == "user"][-1]
        return turnkit.Result.build(text=ANSWER.format(last["content"]))


ordered = turnkit.register(turnkit.Agent("ordered", model="scripted", client=_Answers()))
# A model call lost with the killed process is noticed fast; workers search for lost submissions often.
turnkit.configure(
    model_heartbeat_timeout=1.0,
    lost_submit_grace=float(os.environ.get("TURNKIT_LOST_SUBMIT_GRACE", "1")),
)


def _dir() -> Path:
    return Path(os.environ["TURNKIT_LOST_SUBMIT_DIR"])


async def _hang_if_armed(point: str) -> None:
    """Block for good if the hang point ``point`` is armed, after saying so."""
    if (_dir() / f"hang-{point}").exists():
        (_dir() / "hung").write_text(point)
        await asyncio.Event().wait()


class HangAfterSubmit(Interceptor):
    """Blocks the lane's submit after its commit, inside the workflow task that would accept the update."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _AfterSubmit(next)


class _AfterSubmit(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        result = await self.next.execute_activity(input)
        if activity.info().activity_type == "turnkit.submit_turn":
            await _hang_if_armed("submit")
        return result


_start_turn_workflow = handles.start_turn_workflow


async def _start_after_hang(*args: Any, **kwargs: Any) -> bool:
    await _hang_if_armed("start")
    return await _start_turn_workflow(*args, **kwargs)


async def main(args: argparse.Namespace) -> None:
    handles.start_turn_workflow = _start_after_hang  # the caller's side of the direct first turn's window
    store = await Store.open(args.database_url)
    client = await Client.connect(args.address, plugins=[TurnKitPlugin(store)])
    tk = TurnKit(client, store, task_queue=args.task_queue)
    conversation = await tk.load_conversation(args.conversation)
    async with tk.worker(interceptors=[HangAfterSubmit()]):
        *before, last = args.texts
        for text in before:
            await conversation.ask(text, wait=False)
        (_dir() / f"hang-{args.point}").touch()
        await conversation.ask(last, wait=False)
        await asyncio.Event().wait()  # never reached when the hang point holds: the test kills the process


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for option in ("--address", "--database-url", "--task-queue", "--conversation", "--point"):
        parser.add_argument(option, required=True)
    parser.add_argument("texts", nargs="+")
    asyncio.run(main(parser.parse_args()))
