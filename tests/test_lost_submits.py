"""Lost submissions heal themselves, in order (issue 36 item 5): caller, worker and Temporal server killed together.

The README's default program embeds the caller, the worker and the dev server. A ``kill -9`` of it can fall in the
window where a submission is written to the store but not yet accepted by Temporal: the lane's submit has committed
the turn in the workflow task that would accept the update, or ``ask`` has committed a fresh conversation's first turn
and not started its workflow. Each attempt here runs that program (:mod:`tests.lost_submit_app`: caller and worker in
one process) against a private dev server on a database file, blocks it inside the window, SIGKILLs it and the server
together, restarts the server on its database file and starts a plain worker. No operator runs anything. Every turn
must complete, in submission order, and ``turnkit check`` (which verifies that order) must be clean.

The seeds pick the window (the lane's submit, or the direct first turn's start), how many turns were asked before it,
and whether another turn is asked after the restart (then its submission must queue the lost turn first, before the
workers' search would find it) or not (then the workers' search runs it). ``TURNKIT_LOST_SUBMIT_ATTEMPTS`` sets how
many seeds run (default 4: each combination once).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

import turnkit
from tests import lost_submit_app
from tests.engine import eventually
from tests.faults import DevServer, dev_server
from tests.lost_turns import write_lost_turn
from tests.workers import ROOT, WorkerProcess
from turnkit._ops.check import check
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit
from turnkit.store import Store
from turnkit.store.store import utcnow

ATTEMPTS = int(os.environ.get("TURNKIT_LOST_SUBMIT_ATTEMPTS", "4"))


@contextlib.asynccontextmanager
async def _connected(server: DevServer, database_url: str) -> AsyncIterator[TurnKit]:
    store = await Store.open(database_url)
    try:
        client = await Client.connect(server.address, plugins=[TurnKitPlugin(store)])
        yield TurnKit(client, store, task_queue=f"tq-{uuid.uuid4().hex[:12]}")
    finally:
        await store.close()


async def _program(
    tk: TurnKit, server: DevServer, database_url: str, conversation_id: str, point: str, texts: list[str], where: Path
) -> asyncio.subprocess.Process:
    """The caller-and-worker program, asking ``texts``; returns once it blocks in the window before the last one."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.lost_submit_app",
        *("--address", server.address, "--database-url", database_url, "--task-queue", tk.task_queue),
        *("--conversation", conversation_id, "--point", point, *texts),
        cwd=str(ROOT),
        env={**os.environ, "TURNKIT_LOST_SUBMIT_DIR": str(where), "TURNKIT_LOG_LEVEL": "WARNING"},
    )

    async def hung() -> bool:
        if process.returncode is not None:
            raise AssertionError(f"the program exited ({process.returncode}) before the window")
        return (where / "hung").exists()

    await eventually(hung, timeout=60, what=f"the program to block in the {point} window")
    return process


async def _no_workflow(tk: TurnKit, workflow_id: str) -> bool:
    try:
        await tk.client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return True
        raise
    return False


async def _accepted_updates(tk: TurnKit, conversation_id: str) -> list[str]:
    """The update ids the conversation's lane accepted (none when it has no lane)."""
    if await _no_workflow(tk, conversation_id):
        return []
    events = (await tk.client.get_workflow_handle(conversation_id).fetch_history()).events
    return [
        e.workflow_execution_update_accepted_event_attributes.accepted_request.meta.update_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    ]


async def _attempt(seed: int, server: DevServer, tk: TurnKit, database_url: str, where: Path) -> None:
    rng = random.Random(seed)
    point = ("submit", "start")[seed % 2]  # the lane's submit, or the direct first turn's start
    follow = (seed // 2) % 2 == 0  # another ask after the restart, before the workers' search would run
    before = rng.randint(1, 3) if point == "submit" else 0  # the first ask of a conversation is direct
    texts = [f"s{seed}-t{i}" for i in range(before + 1)]
    since = utcnow()
    conversation = await tk.conversation(lost_submit_app.ordered)
    for stale in where.iterdir():
        stale.unlink()
    program = await _program(tk, server, database_url, conversation.id, point, texts, where)
    # One crash: the caller and the worker (one process) and the Temporal server, at once.
    program.send_signal(signal.SIGKILL)
    server.stop()
    await program.wait()
    (where / f"hang-{point}").unlink()
    await server.start()

    lost = [t for t in await tk.store.list_turns(conversation_id=conversation.id) if t.status == "pending"]
    by_text = {m.id: m.text for m in await conversation.messages()}
    [lost_turn] = [t for t in lost if by_text.get(t.options.trigger_message_id or "") == texts[-1]]
    assert await _no_workflow(tk, lost_turn.id), "the crash fell outside the window: the turn has a workflow"
    assert lost_turn.id not in await _accepted_updates(tk, conversation.id), "the lane accepted the submission"

    # A later turn must not run ahead of the lost one: the search's grace is long here, so its submission is what
    # queues the lost turn. Without one, the workers' search runs it (grace 1 s).
    grace = "60" if follow else "1"
    worker = await WorkerProcess.start(
        app="tests.lost_submit_app",
        address=server.address,
        task_queue=tk.task_queue,
        database_url=database_url,
        env={"TURNKIT_LOST_SUBMIT_DIR": str(where), "TURNKIT_LOST_SUBMIT_GRACE": grace},
    )
    try:
        if follow:
            texts.append(f"s{seed}-after")
            await conversation.ask(texts[-1], wait=False)

        async def all_ended() -> bool:
            turns = await tk.store.list_turns(conversation_id=conversation.id)
            return len(turns) == len(texts) and all(t.terminal for t in turns)

        await eventually(all_ended, timeout=90, what=f"seed {seed}: every turn to end")
        turns = await tk.store.list_turns(conversation_id=conversation.id)
        assert [t.status for t in turns] == ["completed"] * len(texts), [(t.id, t.status, t.error) for t in turns]
        answers = [m.text for m in await conversation.messages() if m.role == "assistant"]
        assert answers == [lost_submit_app.ANSWER.format(text) for text in texts], f"seed {seed}: {answers}"
        assert await check(tk.store, tk.client, since=since, grace=0) == []
    finally:
        await worker.stop()


@pytest.mark.crash
async def test_lost_submissions_run_in_order_without_an_operator(database_url: str, tmp_path: Path) -> None:
    """Issue 36 item 5: in every seeded attempt, the program (caller and worker) and the dev server die together
    inside a submission's window; after the server restarts on its database file and a plain worker starts, every
    turn completes and the answers come in submission order, with no operator action; ``turnkit check`` is clean."""
    async with dev_server() as server, _connected(server, database_url) as tk:
        for seed in range(ATTEMPTS):
            await _attempt(seed, server, tk, database_url, tmp_path)


async def test_a_worker_runs_the_lost_submissions_of_its_own_task_queue(tk: TurnKit) -> None:
    """Issue 36 item 5: a worker's search for lost submissions runs a lost turn of its task queue (queued in its lane,
    no operator step) and leaves one of another task queue, which that queue's workers run."""
    turnkit.configure(lost_submit_grace=0.5)
    mine = await tk.conversation(lost_submit_app.ordered)
    theirs = await tk.conversation(lost_submit_app.ordered)
    lost = await write_lost_turn(tk.store, mine.id, lost_submit_app.ordered, "mine", tk.task_queue)
    other = await write_lost_turn(
        tk.store, theirs.id, lost_submit_app.ordered, "theirs", f"elsewhere-{uuid.uuid4().hex[:8]}"
    )

    async def ran() -> bool:
        return (await tk.store.load_turn(lost.id)).status == "completed"

    await eventually(ran, what="the worker to run its queue's lost turn")
    assert [m.text for m in await mine.messages()] == ["mine", lost_submit_app.ANSWER.format("mine")]
    try:
        assert (await tk.store.load_turn(other.id)).status == "pending" and await _no_workflow(tk, other.id)
    finally:
        async with tk.store.atomic() as tx:  # nothing of this test is left for a worker of that queue
            await tx.claim_turn(other.id, from_=("pending",), to="failed", completed_at=utcnow(), claim_token=None)
