"""Sub-agents, launched agents and waits (spec §4.3, §5.5): the store side of child workflows.

* ``turnkit.delegate`` records each delegated call (an execution, a child conversation with lineage metadata, the
  task message and the child turn), idempotently by the call, and tells the workflow which child workflows to run.
  A denied budget, a denied ``launch_agent``, an unknown sub-agent or invalid arguments settle the call ``failed``.
* ``turnkit.join`` settles delegated executions from their finished children, appending results in call order.
* ``turnkit.wait`` / ``turnkit.finish_wait`` implement the ``wait_for`` tool on wait rows (see :mod:`turnkit.waits`).
"""

from __future__ import annotations

from typing import Any

from temporalio import activity

from activities.tools import outcome_of
from turnkit.agent import Agent, resolve_agent
from turnkit.authorization import is_authorized
from turnkit.builtin_tools import WaitForTool
from turnkit.controls import control_boundary
from turnkit.deliveries import turn_result
from turnkit.errors import ConfigError, ToolError, ToolValidationError, error_class_name
from turnkit.executions import open_tool_execution, with_arguments
from turnkit.payloads import (
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
from turnkit.records import ToolExecutionRecord, TurnRecord
from turnkit.store.store import Store, StoreTx, utcnow
from turnkit.transcript import append_tool_result, fail_execution
from turnkit.turn_options import turn_options
from turnkit.waits import add_waits, enter_waiting, leave_waiting, unfinished_targets

__all__ = ["ChildActivities"]

_DENIED = {"class": "TurnKit::AuthorizationError", "authorization_denied": True}


class ChildActivities:
    """Delegation, join and wait activities bound to a store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @activity.defn(name="turnkit.delegate")
    async def delegate(self, request: DelegateCalls) -> DelegateResult:
        """Record the delegated calls and their child turns (idempotent); see the module docstring."""
        request = request.model_copy(update={"calls": await with_arguments(self.store, request.turn_id, request.calls)})
        parent_agent = resolve_agent(request.agent_name)
        result = DelegateResult()
        for index, call in enumerate(request.calls):
            async with self.store.atomic(turn_id=request.root_turn_id) as tx:
                if index == 0:
                    # The control boundary inside delegation, in the transaction that creates the first child, so
                    # no pause or steer can land between the check and the creation (spec §5.5, §5.10).
                    turn = await tx.load_turn(request.turn_id)
                    if await tx.find_tool_execution(turn.id, call.id) is None:
                        boundary, _ = await control_boundary(tx, turn)
                        if boundary is not None:
                            return DelegateResult(paused=boundary == "paused", steered=boundary == "steered")
                plan, budget_error = await self._delegate_one(tx, request, parent_agent, call)
            result.plans.append(plan)
            if budget_error is not None:
                result.budget_error = budget_error  # the turn fails; later calls are repaired at its end
                break
        running = [p.child.turn_id for p in result.plans if p.child is not None]
        if running and not request.launch:
            async with self.store.atomic(turn_id=request.root_turn_id) as tx:
                await enter_waiting(tx, request.turn_id, running)  # joined children: the parent is `waiting`
        return result

    async def _delegate_one(
        self, tx: StoreTx, request: DelegateCalls, parent_agent: Agent, call: ToolCallRef
    ) -> tuple[ChildPlan, str | None]:
        turn = await tx.load_turn(request.turn_id)
        execution = await tx.find_tool_execution(turn.id, call.id)
        if execution is not None:
            child = await tx.find_child_turn(execution.id)
            run = child is not None and not child.terminal and execution.status == "pending" and not request.launch
            return ChildPlan(
                call_id=call.id, execution_id=execution.id, child=_child_input(child, request) if run else None
            ), None
        execution, denial = await open_tool_execution(
            tx, turn, tool_call_id=call.id, tool_name=call.name, arguments=call.arguments, status="pending"
        )
        plan = ChildPlan(call_id=call.id, execution_id=execution.id)
        if denial is not None:
            return plan, denial
        defer = not request.launch  # a delegation group appends its results at the join, in call order
        try:
            agent_name, task, callback = _delegation_arguments(parent_agent, call, launch=request.launch)
            sub_agent = resolve_agent(agent_name)
        except (ToolError, ConfigError) as err:
            await fail_execution(
                tx, turn, execution, str(err), details={"class": error_class_name(err)}, append=not defer
            )
            return plan, None
        principal = turn.options.get("principal")
        arguments = {"task": task, "callback": callback} if request.launch else {"task": task}
        if not is_authorized("launch_agent", principal, turn=turn, agent=sub_agent, arguments=arguments) or (
            callback
            and not is_authorized("callback", principal, turn=turn.id, destination_conversation=turn.conversation_id)
        ):
            action = "launch_agent" if not callback else "launch_agent or callback"
            await fail_execution(tx, turn, execution, f"not authorized to {action}", details=_DENIED, append=not defer)
            return plan, None
        savepoint = await tx.session.begin_nested()
        child = await _create_child(tx, turn, execution, sub_agent, task, depth=request.depth + 1, callback=callback)
        if not request.launch and not is_authorized("wait", principal, turn=turn.id, targets=[child.id]):
            # The implicit join is a wait: denied, the child's creation rolls back with it (spec §7.4).
            await savepoint.rollback()
            await fail_execution(tx, turn, execution, "not authorized to wait", details=_DENIED, append=False)
            return plan, None
        await savepoint.commit()
        if request.launch:
            # Launched: its ids are the result, at once; it is not waited on.
            settled = await tx.claim_tool_execution(
                execution.id, from_="pending", to="completed", result=turn_result(child), completed_at=utcnow()
            )
            if settled is not None:
                await append_tool_result(tx, turn, settled)
        plan.child = _child_input(child, request)
        return plan, None

    @activity.defn(name="turnkit.join")
    async def join(self, request: JoinChildren) -> list[ToolOutcome]:
        """Settle delegated executions from their children and append every result, in call order."""
        outcomes: list[ToolOutcome] = []
        async with self.store.atomic(turn_id=request.root_turn_id) as tx:
            turn = await leave_waiting(tx, request.turn_id)
            for execution_id in request.execution_ids:
                execution = await tx.load_tool_execution(execution_id)
                if execution.status in ("pending", "running"):
                    child = await tx.find_child_turn(execution.id)
                    if child is not None and child.terminal:
                        # A failed or cancelled child is a structured result; it never fails the parent.
                        settled = await tx.claim_tool_execution(
                            execution.id,
                            from_=("pending", "running"),
                            to="completed",
                            result=turn_result(child),
                            completed_at=utcnow(),
                        )
                        execution = settled or await tx.load_tool_execution(execution.id)
                    else:
                        execution = await fail_execution(
                            tx, turn, execution, "the sub-agent's turn ended without a result", append=False
                        )
                await append_tool_result(tx, turn, execution)
                outcomes.append(outcome_of(execution, None))
        return outcomes

    @activity.defn(name="turnkit.wait")
    async def wait(self, request: WaitRequest) -> WaitPlan:
        """The ``wait_for`` tool: validate and record the wait edges (all or none), report unfinished targets."""
        [call] = await with_arguments(self.store, request.turn_id, [request.call])
        async with self.store.atomic(turn_id=request.root_turn_id) as tx:
            turn = await tx.load_turn(request.turn_id)
            execution = await tx.find_tool_execution(turn.id, call.id)
            if execution is not None and execution.status not in ("pending", "running"):
                await append_tool_result(tx, turn, execution)
                return WaitPlan(execution_id=execution.id, settled=True)
            if execution is None:
                execution, denial = await open_tool_execution(
                    tx, turn, tool_call_id=call.id, tool_name=call.name, arguments=call.arguments, status="pending"
                )
                if denial is not None:
                    return WaitPlan(execution_id=execution.id, settled=True)
        try:
            targets = [str(t) for t in WaitForTool().validate_arguments(call.arguments)["turn_ids"]]
            if not is_authorized("wait", turn.options.get("principal"), turn=turn.id, targets=targets):
                raise _Denied("not authorized to wait")
            async with self.store.atomic(turn_id=request.root_turn_id, wait_graph=True) as tx:
                records = await add_waits(tx, turn, targets)
                await enter_waiting(tx, turn.id, [t.id for t in records if not t.terminal])
        except (ToolError, _Denied) as err:
            details = _DENIED if isinstance(err, _Denied) else {"class": error_class_name(err)}
            async with self.store.atomic(turn_id=request.root_turn_id) as tx:
                await fail_execution(tx, turn, execution, str(err), details=details)
            return WaitPlan(execution_id=execution.id, settled=True)
        return WaitPlan(
            execution_id=execution.id,
            target_ids=[t.id for t in records],
            unfinished_ids=await unfinished_targets(self.store, [t.id for t in records if not t.terminal]),
        )

    @activity.defn(name="turnkit.finish_wait")
    async def finish_wait(self, request: FinishWait) -> ToolOutcome:
        """Complete a ``wait_for`` call with ``{"results": [...]}`` of its targets, in the order asked."""
        async with self.store.atomic(turn_id=request.root_turn_id) as tx:
            turn = await leave_waiting(tx, request.turn_id)
            execution = await tx.load_tool_execution(request.execution_id)
            if execution.status in ("pending", "running"):
                edges = await tx.list_waits(turn_id=turn.id)
                wanted = [str(t) for t in execution.arguments.get("turn_ids", [])]
                targets = {edge.target_turn_id for edge in edges}
                results: list[dict[str, Any]] = []
                for target_id in dict.fromkeys(wanted):
                    if target_id in targets:
                        results.append(turn_result(await tx.load_turn(target_id)))
                settled = await tx.claim_tool_execution(
                    execution.id,
                    from_=("pending", "running"),
                    to="completed",
                    result={"results": results},
                    completed_at=utcnow(),
                )
                execution = settled or await tx.load_tool_execution(execution.id)
            await append_tool_result(tx, turn, execution)
        return outcome_of(execution, None)


class _Denied(Exception):
    pass


def _delegation_arguments(parent: Agent, call: ToolCallRef, *, launch: bool) -> tuple[str, str, bool]:
    """``(agent name, task, callback)`` of a sub-agent call or a ``launch_agent`` call; ToolError when invalid."""
    if call.arguments_error:
        raise ToolValidationError(call.arguments_error)
    if launch:
        from turnkit.builtin_tools import LaunchAgentTool

        args = LaunchAgentTool().validate_arguments(call.arguments)
        name = str(args["agent_name"])
        if parent.sub_agent(name) is None:
            raise ToolError(f"unknown sub-agent: {name}")
        return name, str(args["task"]), bool(args.get("callback"))
    from turnkit.builtin_tools import sub_agent_tool

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
) -> TurnRecord:
    """A child conversation with lineage metadata, its task message, and the child turn (spec §4.3 build_child)."""
    principal = parent.options.get("principal")
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
        context={},  # children get the task only, not the parent's context (spec §4.3)
        principal=principal,
        depth=depth,
        callback_conversation_id=parent.conversation_id if callback else None,
    )
    return await tx.create_turn(
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
        depth=int(child.options.get("depth", request.depth + 1)),
    )
