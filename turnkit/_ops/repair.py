"""``turnkit repair``: fix what :mod:`turnkit._ops.check` finds and can be fixed safely, and say what was done.

* A root turn ``pending`` (or submitted paused) that no workflow runs and no lane holds is re-queued in its lane
  (update-with-start ``submit`` with its own turn id: the store already has it, so nothing is written twice).
* A launched child turn whose workflow was never started (its ``launch_agent`` activity committed, its completion
  was lost) gets its ``TurnWorkflow`` started with the same id; the input is rebuilt from the store.
* Any other unfinished turn without a live workflow (its workflow closed, or it cannot be driven) is failed: its
  transcript is repaired (open calls become ``interrupted``), the status is compare-and-set to ``failed`` with an
  error saying why, and its completion callback, waiters and lane are told, as a turn's own terminal write does.
* A ``running`` tool execution whose turn's workflow is closed becomes ``interrupted`` with its result message.
* A finished turn with an unanswered tool call gets the missing results (behaviour §5.8 repair).
* A pending delivery no lane holds is signalled again; a waiter whose targets all ended is signalled again.
* A staged input older than ``STALE_STAGED_INPUT`` is dropped: its ``ask`` failed before the lane took it (a
  submission that reaches its lane consumes it within ``SUBMIT_TIMEOUT``, 60 s), so nothing will ever read it.

Multiple active turns, sequence gaps, deliveries appended twice and trees over budget are reported, never
"fixed": the record of what happened is not rewritten. Every fix is a compare-and-set on what was seen, so repair
is idempotent and safe beside running workers: a second run finds nothing to do.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from turnkit._engine.deliveries import signal_delivery
from turnkit._engine.dispatch import model_policy
from turnkit._engine.lane_submit import resubmit
from turnkit._engine.transcript import fail_execution, repair_transcript
from turnkit._engine.turn_end import fail_unfinished_turn
from turnkit._engine.waits import notify_waiters
from turnkit._ops.check import (
    DELIVERY_NOT_CONSUMED,
    EXECUTION_WITHOUT_ATTEMPT,
    TOOL_CALL_RESULTS,
    TURN_WITHOUT_WORKFLOW,
    UNANSWERED,
    WAIT_WITHOUT_END,
    WORKFLOW_CLOSED,
    Finding,
    check,
    held_by_lane,
    lane_statuses,
    workflow_states,
)
from turnkit.config import settings
from turnkit.kernel.names import TURN_WORKFLOW
from turnkit.kernel.payloads import TurnInput
from turnkit.kernel.records import INTERRUPTED_MESSAGE, TurnRecord
from turnkit.kernel.search_attributes import turn_search_attributes
from turnkit.store.store import Store, utcnow

__all__ = ["LOST_WORKFLOW", "STALE_STAGED_INPUT", "Repair", "repair"]

#: Error class of a turn failed by repair.
LOST_WORKFLOW: Final = "TurnKit::LostWorkflow"
_SUBMIT_TIMEOUT: Final = 15.0
#: Age after which a staged input that no submission consumed is dropped (far past the lane's 60 s submit bound).
STALE_STAGED_INPUT: Final = timedelta(hours=1)


@dataclass(frozen=True)
class Repair:
    """One thing repair did (``action``: requeued, started, failed, interrupted, answered, resignalled, woken,
    dropped)."""

    action: str
    ids: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return f"{self.action} [{', '.join(self.ids)}]: {self.message}"


async def repair(
    store: Store,
    client: Client,
    task_queue: str,
    *,
    since: datetime | None = None,
    grace: float = 10.0,
    findings: list[Finding] | None = None,
    limit: int | None = None,
) -> list[Repair]:
    """Run :func:`~turnkit._ops.check.check` (unless ``findings`` are given) and fix what can be fixed safely.

    ``limit`` bounds the findings acted on in one pass (``reconcile`` uses ``settings.maintenance_batch_size``);
    the next pass picks up the rest. It counts only findings repair fixes: those it only reports (a sequence gap, a
    tree over budget…) stay where they are, and counting them would let a batch's worth of them keep every fix
    behind them from ever being reached.
    """
    if findings is None:
        findings = await check(store, client, since=since, grace=grace)
    findings = [finding for finding in findings if _fixable(finding)]
    if limit is not None:
        findings = findings[:limit]
    fixer = _Fixer(store, client, task_queue)
    for finding in findings:
        if finding.kind in _TURN_FIXES:
            await fixer.turn(finding.ids[0])
    for finding in findings:
        if finding.kind == EXECUTION_WITHOUT_ATTEMPT:
            await fixer.execution(finding.ids[0], finding.ids[1])
        elif finding.kind == TOOL_CALL_RESULTS:
            await fixer.answer(finding.ids[0])
        elif finding.kind == DELIVERY_NOT_CONSUMED:
            await fixer.delivery(finding.ids[0])
        elif finding.kind == WAIT_WITHOUT_END:
            await fixer.wake(finding.ids[0], finding.ids[1:])
    await fixer.stale_staged_inputs()
    return fixer.done


#: The findings about a turn that repair fixes (first: failing a turn settles its executions and calls too).
_TURN_FIXES: Final = frozenset({TURN_WITHOUT_WORKFLOW, WORKFLOW_CLOSED})
#: What repair fixes; everything else check finds is reported only (module docstring).
_FIXED: Final = _TURN_FIXES | {EXECUTION_WITHOUT_ATTEMPT, DELIVERY_NOT_CONSUMED, WAIT_WITHOUT_END}


def _fixable(finding: Finding) -> bool:
    """Whether repair acts on ``finding``: a kind in :data:`_FIXED`, or a call with no result (a call answered twice
    is reported only)."""
    if finding.kind == TOOL_CALL_RESULTS:
        return "no result" in finding.message
    return finding.kind in _FIXED


class _Fixer:
    def __init__(self, store: Store, client: Client, task_queue: str) -> None:
        self.store, self.client, self.task_queue = store, client, task_queue
        self.done: list[Repair] = []
        self._seen: set[tuple[str, str]] = set()

    def _did(self, action: str, ids: list[str], message: str) -> None:
        self.done.append(Repair(action, tuple(ids), message))

    async def stale_staged_inputs(self) -> None:
        async with self.store.atomic() as tx:
            dropped = await tx.drop_staged_inputs(older_than=utcnow() - STALE_STAGED_INPUT)
        if dropped:
            self._did("dropped", dropped, "staged input of an ask that never reached its lane")

    async def turn(self, turn_id: str) -> None:
        """Drive or fail an unfinished turn without a live workflow (re-read first: it may have moved on)."""
        if ("turn", turn_id) in self._seen:
            return
        self._seen.add(("turn", turn_id))
        turn = await self.store.load_turn(turn_id)
        if turn.terminal:
            return
        state = (await workflow_states(self.client, [turn.id]))[turn.id]
        if state == "running":
            return
        lanes = await lane_statuses(self.client, [turn.conversation_id]) if turn.parent_turn_id is None else {}
        if held_by_lane(turn, lanes) or lanes.get(turn.conversation_id) == UNANSWERED:
            return  # queued; or its lane cannot tell now (no worker serves it): nothing safe to do yet
        if await self._moved(turn):
            return
        if turn.parent_turn_id is None:
            if state == "missing" and turn.started_at is None and turn.status in ("pending", "paused"):
                if await self._requeue(turn):
                    return
                await self._fail(turn, "the turn's lane could not queue it again")
                return
        elif state == "missing" and turn.status == "pending" and await self._launched(turn):
            await self._start(turn)
            return
        why = "its workflow never started" if state == "missing" else f"its workflow ended ({state})"
        await self._fail(turn, f"turn lost its workflow: {why}")

    async def _moved(self, turn: TurnRecord) -> bool:
        """Whether ``turn`` changed after it was read, read again after Temporal's answer: a turn that ended (or a
        lane started) between the two reads is live, not lost (see ``turnkit._ops.check._moved_since``)."""
        current = await self.store.load_turn(turn.id)
        return current.terminal or current.updated_at != turn.updated_at

    async def _launched(self, turn: TurnRecord) -> bool:
        """Whether ``turn`` is a ``launch_agent`` child (it outlives its parent, so it can still be run)."""
        if turn.parent_tool_execution_id is None:
            return False
        async with self.store.atomic() as tx:
            execution = await tx.load_tool_execution(turn.parent_tool_execution_id)
        return execution.tool_name == "launch_agent"

    async def _requeue(self, turn: TurnRecord) -> bool:
        """Submit the stored turn to its lane again (the submit activity finds it by id and writes nothing)."""
        try:
            async with asyncio.timeout(_SUBMIT_TIMEOUT):  # a lane no worker serves cannot take it now
                await resubmit(self.client, turn, self.task_queue)
        except (WorkflowUpdateFailedError, RPCError, TimeoutError):
            return False
        lanes = await lane_statuses(self.client, [turn.conversation_id])
        if not held_by_lane(turn, lanes) and (await workflow_states(self.client, [turn.id]))[turn.id] == "missing":
            return False
        self._did("requeued", [turn.id, turn.conversation_id], "pending root turn queued in its lane again")
        return True

    async def _start(self, turn: TurnRecord) -> None:
        """Start a launched child's ``TurnWorkflow`` (id = turn id) with the input its parent would have used."""
        root = await self.store.load_turn(turn.root_turn_id)
        deadline = root.deadline
        turn_input = TurnInput(
            turn_id=turn.id,
            conversation_id=turn.conversation_id,
            agent_name=turn.agent_name,
            root_turn_id=turn.root_turn_id,
            deadline=deadline,
            depth=1 if turn.options.depth is None else turn.options.depth,
            model_policy=model_policy(),
            deadline_without_timer=True,
        )
        try:
            await self.client.start_workflow(
                TURN_WORKFLOW,
                turn_input,
                id=turn.id,
                task_queue=self.task_queue,
                static_summary=f"launched · {turn.agent_name} (repaired)",
                search_attributes=(
                    turn_search_attributes(
                        conversation_id=turn.conversation_id,
                        agent_name=turn.agent_name,
                        root_turn_id=turn.root_turn_id,
                        parent_turn_id=turn.parent_turn_id,
                    )
                    if settings.search_attributes
                    else None
                ),
            )
        except WorkflowAlreadyStartedError:
            return  # someone else started it meanwhile: nothing to repair
        self._did("started", [turn.id], "launched child turn started (its launch committed but never started it)")

    async def _fail(self, turn: TurnRecord, message: str) -> None:
        """Fail ``turn`` as ``turnkit.finish_turn`` would: repair, CAS, completion delivery; then tell others."""
        _, failed = await fail_unfinished_turn(
            self.store, self.client, self.task_queue, turn.id, message, error_class=LOST_WORKFLOW
        )
        if failed:
            self._did("failed", [turn.id], message)

    async def execution(self, execution_id: str, turn_id: str) -> None:
        """A ``running`` execution whose turn's workflow is gone: ``interrupted`` (outcome unknown) + its result."""
        if (await workflow_states(self.client, [turn_id]))[turn_id] == "running":
            return
        turn = await self.store.load_turn(turn_id)
        async with self.store.atomic(turn_id=turn.root_turn_id) as tx:
            execution = await tx.load_tool_execution(execution_id)
            if execution.status != "running":
                return
            settled = await fail_execution(
                tx, turn, execution, INTERRUPTED_MESSAGE, status="interrupted", from_=("running",)
            )
        if settled.status == "interrupted":
            self._did("interrupted", [execution_id, turn_id], f"{execution.tool_name}: its attempt is gone")

    async def answer(self, turn_id: str) -> None:
        """A finished turn with unanswered tool calls: give each its result (behaviour §5.8)."""
        if ("answer", turn_id) in self._seen:
            return
        self._seen.add(("answer", turn_id))
        async with self.store.atomic() as tx:
            turn = await tx.load_turn(turn_id)
            if not turn.terminal:
                return
            before = len(await tx.list_turn_messages(turn.id))
            await repair_transcript(tx, turn)
            added = len(await tx.list_turn_messages(turn.id)) - before
        if added:
            self._did("answered", [turn_id], f"{added} missing tool results appended")

    async def delivery(self, delivery_id: str) -> None:
        """Signal a pending delivery's lane again (the store's compare-and-set applies it once)."""
        async with self.store.atomic() as tx:
            delivery = await tx.load_delivery(delivery_id)
        if delivery.delivered_at is None:
            await signal_delivery(self.client, self.task_queue, delivery)
            self._did("resignalled", [delivery_id], "pending delivery signalled to its lane again")

    async def wake(self, waiter_id: str, target_ids: tuple[str, ...]) -> None:
        """Signal a waiter's ended targets again (the waiter dedupes them). Only targets with wait rows are signalled;
        a parent's join rows to its children only add a signal it ignores (it awaits their workflows)."""
        async with self.store.atomic() as tx:
            edges = {edge.target_turn_id for edge in await tx.list_waits(turn_id=waiter_id)}
        signalled = [target_id for target_id in target_ids if target_id in edges]
        for target_id in signalled:
            await notify_waiters(self.store, self.client, target_id)
        if signalled:
            self._did("woken", [waiter_id], "ended targets signalled to the waiting turn again")
