"""Sub-agents, launched agents and waits (behaviour §4.3, §5.5): the store side of child workflows.

* ``turnkit.delegate`` records each delegated call (an execution, a child conversation with lineage metadata, the
  task message and the child turn), idempotently by the call, and tells the workflow which child workflows to run.
  A denied budget, a denied ``launch_agent``, an unknown sub-agent or invalid arguments settle the call ``failed``.
* ``turnkit.join`` settles delegated executions from their finished children, appending results in call order.
* ``turnkit.wait`` / ``turnkit.finish_wait`` implement the ``wait_for`` tool on wait rows (see
  :mod:`turnkit._engine.waits`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from turnkit._activities.tools import budget_denial, outcome_of
from turnkit._engine.authorization import Verdict, check
from turnkit._engine.builtin_tools import LaunchAgentTool, WaitForTool, sub_agent_tool
from turnkit._engine.controls import control_boundary
from turnkit._engine.deliveries import turn_result
from turnkit._engine.dispatch import model_policy
from turnkit._engine.executions import open_tool_execution, with_arguments
from turnkit._engine.ids import new_id
from turnkit._engine.transcript import announce_settled, append_tool_result, fail_execution
from turnkit._engine.turn_options import turn_options
from turnkit._engine.waits import add_waits, enter_waiting, leave_waiting, unfinished_targets
from turnkit.agent import Agent, resolve_agent
from turnkit.config import settings
from turnkit.kernel.activities import ChildCalls, implements
from turnkit.kernel.errors import ConfigError, ToolError, ToolValidationError, error_class_name
from turnkit.kernel.payloads import (
    ChildPlan,
    DelegateCalls,
    DelegateResult,
    FinishWait,
    JoinChildren,
    ToolCallRef,
    ToolOutcome,
    TurnInput,
    WaitPlan,
    WaitRequest,
)
from turnkit.kernel.records import OPEN_EXECUTION_STATUSES, ToolExecutionRecord, TurnRecord
from turnkit.store.store import Store, StoreTx, utcnow

__all__ = ["ChildActivities"]


class ChildActivities(ChildCalls):
    """Delegation, join and wait activities bound to a store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @implements(ChildCalls.delegate)
    async def delegate(self, request: DelegateCalls) -> DelegateResult:
        """Record the delegated calls and their child turns (idempotent); see the module docstring."""
        request = request.model_copy(update={"calls": await with_arguments(self.store, request.turn_id, request.calls)})
        parent_agent = resolve_agent(request.agent_name)
        # The hook is asked about every call first, outside any transaction: a slow approval service holds no
        # lock, and the control boundary below is checked after it answered (spec T92).
        asked = [await self._ask(request, parent_agent, call) for call in request.calls]
        result = DelegateResult()
        for index, call in enumerate(request.calls):
            # A join's edges (parent → child) are waits: the wait-graph lock first (behaviour §5.5 ``atomic_graph``).
            async with self.store.atomic(turn_id=request.root_turn_id, wait_graph=not request.launch) as tx:
                if index == 0:
                    # The control boundary inside delegation, in the transaction that creates the first child, so
                    # no pause or steer can land between the check and the creation (behaviour §5.5, §5.10).
                    turn = await tx.load_turn(request.turn_id)
                    if await tx.find_tool_execution(turn.id, call.id) is None:
                        boundary, _ = await control_boundary(tx, turn)
                        if boundary is not None:
                            return DelegateResult(boundary=boundary)
                plan, budget_error = await self._delegate_one(tx, request, parent_agent, call, asked[index])
            result.plans.append(plan)
            if budget_error is not None:
                result.budget_error = budget_error  # the turn fails; later calls are repaired at its end
                break
        running = [p.child.turn_id for p in result.plans if p.child is not None]
        if running and not request.launch:
            async with self.store.atomic(turn_id=request.root_turn_id) as tx:
                await enter_waiting(tx, request.turn_id, running)  # joined children: the parent is `waiting`
        return result

    async def _ask(self, request: DelegateCalls, parent_agent: Agent, call: ToolCallRef) -> _Asked:
        """The hook's verdict on one delegated call, in TurnKit's order (``tool``, ``launch_agent``, ``callback``,
        the implicit join's ``wait``); the first denial is the verdict. Nothing is asked for a call already opened.
        """
        child_id = new_id("turn")  # the child's id, known before it is created, so ``wait`` can name it
        if settings.authorize is None or call.arguments_error:
            return _Asked(Verdict("tool", True), child_id)
        async with self.store.atomic() as tx:
            turn = await tx.load_turn(request.turn_id)
            if await tx.find_tool_execution(turn.id, call.id) is not None:
                return _Asked(Verdict("tool", True), child_id)
        principal = turn.options.principal
        tool = parent_agent.tool(call.name) if request.launch else sub_agent_tool(call.name)
        verdict = await check("tool", principal, turn=turn, tool=tool, arguments=call.arguments)
        if not verdict.allowed:
            return _Asked(verdict, child_id)
        try:
            agent_name, task, callback = _delegation_arguments(parent_agent, call, launch=request.launch)
            sub_agent = resolve_agent(agent_name)
        except (ToolError, ConfigError):
            return _Asked(verdict, child_id)  # the call fails on its arguments: nothing more to ask
        arguments = {"task": task, "callback": callback} if request.launch else {"task": task}
        verdict = await check("launch_agent", principal, turn=turn, agent=sub_agent, arguments=arguments)
        if verdict.allowed and callback:
            verdict = await check("callback", principal, turn=turn.id, destination_conversation=turn.conversation_id)
        if verdict.allowed and not request.launch:
            verdict = await check("wait", principal, turn=turn.id, targets=[child_id])
        return _Asked(verdict, child_id)

    async def _delegate_one(
        self, tx: StoreTx, request: DelegateCalls, parent_agent: Agent, call: ToolCallRef, asked: _Asked
    ) -> tuple[ChildPlan, str | None]:
        turn = await tx.load_turn(request.turn_id)
        execution = await tx.find_tool_execution(turn.id, call.id)
        if execution is not None:
            # Recorded before: a retry whose first attempt committed returns what that attempt returned (issue 8).
            child = await tx.find_child_turn(execution.id)
            if request.launch:
                # The workflow starts a launched child from this result, so one still pending was never started.
                run = child is not None and child.status == "pending"
            else:
                run = child is not None and not child.terminal and execution.status == "pending"
                if run and child is not None:
                    # A first attempt recorded before joins wrote their edges: write it now (idempotent).
                    await tx.create_wait(turn_id=turn.id, target_turn_id=child.id)
            plan = ChildPlan(
                call_id=call.id, execution_id=execution.id, child=_child_input(child, request) if run else None
            )
            return plan, budget_denial(execution)
        execution, denial = await open_tool_execution(
            tx, turn, tool_call_id=call.id, tool_name=call.name, arguments=call.arguments, status="pending"
        )
        plan = ChildPlan(call_id=call.id, execution_id=execution.id)
        if denial is not None:
            return plan, denial
        defer = not request.launch  # a delegation group appends its results at the join, in call order
        verdict = asked.verdict
        if verdict.action == "tool" and not verdict.allowed:  # behaviour §3.8 step 7: before the arguments are used
            await fail_execution(tx, turn, execution, verdict.message, details=verdict.details, append=not defer)
            return plan, None
        try:
            agent_name, task, callback = _delegation_arguments(parent_agent, call, launch=request.launch)
            sub_agent = resolve_agent(agent_name)
        except (ToolError, ConfigError) as err:
            await fail_execution(
                tx, turn, execution, str(err), details={"class": error_class_name(err)}, append=not defer
            )
            return plan, None
        if not verdict.allowed and verdict.action != "wait":  # launch_agent or callback: no child (behaviour §7.4)
            await fail_execution(tx, turn, execution, verdict.message, details=verdict.details, append=not defer)
            return plan, None
        savepoint = await tx.connection.begin_nested()
        child = await _create_child(
            tx, turn, execution, sub_agent, task, depth=request.depth + 1, callback=callback, turn_id=asked.child_id
        )
        if not verdict.allowed:
            # The implicit join is a wait: denied, the child's creation rolls back with it (behaviour §7.4).
            await savepoint.rollback()
            await fail_execution(tx, turn, execution, verdict.message, details=verdict.details, append=False)
            return plan, None
        if not request.launch:
            # The implicit join is a wait (behaviour §5.5): its edge parent → child is written with the child, so
            # ``list_waits`` and the cycle check see it; the edge stays, settled once the child is terminal.
            try:
                await add_waits(tx, turn, [child.id])
            except ToolError as err:
                await savepoint.rollback()
                await fail_execution(
                    tx, turn, execution, str(err), details={"class": error_class_name(err)}, append=False
                )
                return plan, None
        await savepoint.commit()
        if request.launch:
            # Launched: its ids are the result, at once; it is not waited on.
            settled = await tx.claim_tool_execution(
                execution.id, from_="pending", to="completed", result=turn_result(child), completed_at=utcnow()
            )
            if settled is not None:
                await append_tool_result(tx, turn, settled)
                announce_settled(tx, turn, settled)
        plan.child = _child_input(child, request)
        return plan, None

    @implements(ChildCalls.join)
    async def join(self, request: JoinChildren) -> list[ToolOutcome]:
        """Settle delegated executions from their children and append every result, in call order."""
        outcomes: list[ToolOutcome] = []
        async with self.store.atomic(turn_id=request.root_turn_id) as tx:
            turn = await leave_waiting(tx, request.turn_id)
            for execution_id in request.execution_ids:
                execution = await tx.load_tool_execution(execution_id)
                if execution.status in OPEN_EXECUTION_STATUSES:
                    child = await tx.find_child_turn(execution.id)
                    if child is not None and child.terminal:
                        # A failed or cancelled child is a structured result; it never fails the parent.
                        settled = await tx.claim_tool_execution(
                            execution.id,
                            from_=OPEN_EXECUTION_STATUSES,
                            to="completed",
                            result=turn_result(child),
                            completed_at=utcnow(),
                        )
                        if settled is not None:
                            announce_settled(tx, turn, settled)
                        execution = settled or await tx.load_tool_execution(execution.id)
                    else:
                        execution = await fail_execution(
                            tx, turn, execution, "the sub-agent's turn ended without a result", append=False
                        )
                await append_tool_result(tx, turn, execution)
                outcomes.append(outcome_of(execution, None))
        return outcomes

    @implements(ChildCalls.wait)
    async def wait(self, request: WaitRequest) -> WaitPlan:
        """The ``wait_for`` tool: validate and record the wait edges (all or none), report unfinished targets."""
        [call] = await with_arguments(self.store, request.turn_id, [request.call])
        async with self.store.atomic(turn_id=request.root_turn_id) as tx:
            turn = await tx.load_turn(request.turn_id)
            execution = await tx.find_tool_execution(turn.id, call.id)
            if execution is not None and execution.status not in OPEN_EXECUTION_STATUSES:
                await append_tool_result(tx, turn, execution)
                return WaitPlan(execution_id=execution.id, settled=True)
            if execution is None:
                execution, denial = await open_tool_execution(
                    tx, turn, tool_call_id=call.id, tool_name=call.name, arguments=call.arguments, status="pending"
                )
                if denial is not None:
                    return WaitPlan(execution_id=execution.id, settled=True)
        try:
            # Asked here, between transactions: ``tool`` like every tool call, then ``wait`` (behaviour §7.3).
            principal = turn.options.principal
            tool = resolve_agent(turn.agent_name).tool(call.name) or WaitForTool()
            verdict = await check("tool", principal, turn=turn, tool=tool, arguments=call.arguments)
            if not verdict.allowed:
                raise _Denied(verdict)
            targets = [str(t) for t in WaitForTool().validate_arguments(call.arguments)["turn_ids"]]
            verdict = await check("wait", principal, turn=turn.id, targets=targets)
            if not verdict.allowed:
                raise _Denied(verdict)
            async with self.store.atomic(turn_id=request.root_turn_id, wait_graph=True) as tx:
                records = await add_waits(tx, turn, targets)
                await enter_waiting(tx, turn.id, [t.id for t in records if not t.terminal])
        except (ToolError, _Denied) as err:
            details = err.verdict.details if isinstance(err, _Denied) else {"class": error_class_name(err)}
            async with self.store.atomic(turn_id=request.root_turn_id) as tx:
                await fail_execution(tx, turn, execution, str(err), details=details)
            return WaitPlan(execution_id=execution.id, settled=True)
        return WaitPlan(
            execution_id=execution.id,
            target_ids=[t.id for t in records],
            unfinished_ids=await unfinished_targets(self.store, [t.id for t in records if not t.terminal]),
        )

    @implements(ChildCalls.finish_wait)
    async def finish_wait(self, request: FinishWait) -> ToolOutcome:
        """Complete a ``wait_for`` call with ``{"results": [...]}`` of its targets, in the order asked."""
        async with self.store.atomic(turn_id=request.root_turn_id) as tx:
            turn = await leave_waiting(tx, request.turn_id)
            execution = await tx.load_tool_execution(request.execution_id)
            if execution.status in OPEN_EXECUTION_STATUSES:
                edges = await tx.list_waits(turn_id=turn.id)
                wanted = [str(t) for t in execution.arguments.get("turn_ids", [])]
                targets = {edge.target_turn_id for edge in edges}
                results: list[dict[str, Any]] = []
                for target_id in dict.fromkeys(wanted):
                    if target_id in targets:
                        results.append(turn_result(await tx.load_turn(target_id)))
                settled = await tx.claim_tool_execution(
                    execution.id,
                    from_=OPEN_EXECUTION_STATUSES,
                    to="completed",
                    result={"results": results},
                    completed_at=utcnow(),
                )
                if settled is not None:
                    announce_settled(tx, turn, settled)
                execution = settled or await tx.load_tool_execution(execution.id)
            await append_tool_result(tx, turn, execution)
        return outcome_of(execution, None)


@dataclass(frozen=True)
class _Asked:
    """The hook's verdict on one delegated call (asked before its transaction) and the id its child will have."""

    verdict: Verdict
    child_id: str


class _Denied(Exception):
    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.message)
        self.verdict = verdict


def _delegation_arguments(parent: Agent, call: ToolCallRef, *, launch: bool) -> tuple[str, str, bool]:
    """``(agent name, task, callback)`` of a sub-agent call or a ``launch_agent`` call; ToolError when invalid."""
    if call.arguments_error:
        raise ToolValidationError(call.arguments_error)
    if launch:
        args = LaunchAgentTool().validate_arguments(call.arguments)
        name = str(args["agent_name"])
        if parent.sub_agent(name) is None:
            raise ToolError(f"unknown sub-agent: {name}")
        return name, str(args["task"]), bool(args.get("callback"))
    args = sub_agent_tool(call.name).validate_arguments(call.arguments)
    return call.name, str(args["task"]), False


async def _create_child(
    tx: StoreTx,
    parent: TurnRecord,
    execution: ToolExecutionRecord,
    agent: Agent,
    task: str,
    *,
    depth: int,
    callback: bool,
    turn_id: str,
) -> TurnRecord:
    """A child conversation with lineage metadata, its task message, and the child turn (behaviour §4.3 build_child)."""
    principal = parent.options.principal
    lineage: dict[str, Any] = {
        "parent_conversation_id": parent.conversation_id,
        "parent_turn_id": parent.id,
        "parent_tool_execution_id": execution.id,
        "principal": principal,
    }
    conversation = await tx.create_conversation(agent_name=agent.name, model=agent.effective_model, metadata=lineage)
    message = await tx.append_message(conversation.id, role="user", text=task, metadata=lineage)
    options = turn_options(
        agent,
        trigger_message_id=message.id,
        context={},  # children get the task only, not the parent's context (behaviour §4.3)
        principal=principal,
        depth=depth,
        callback_conversation_id=parent.conversation_id if callback else None,
    )
    return await tx.create_turn(
        id=turn_id,
        conversation_id=conversation.id,
        agent_name=agent.name,
        parent_turn_id=parent.id,
        parent_tool_execution_id=execution.id,
        root_turn_id=parent.root_turn_id,
        context_message_sequence=message.sequence,
        model=agent.effective_model,
        options=options,
        submitted_at=utcnow(),
    )


def _child_input(child: TurnRecord | None, request: DelegateCalls) -> TurnInput | None:
    if child is None:
        return None
    return TurnInput(
        turn_id=child.id,
        conversation_id=child.conversation_id,
        agent_name=child.agent_name,
        root_turn_id=child.root_turn_id,
        deadline=request.deadline,
        depth=request.depth + 1 if child.options.depth is None else child.options.depth,
        model_policy=model_policy(),
        deadline_without_timer=True,
    )
