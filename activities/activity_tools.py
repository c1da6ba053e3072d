"""``turnkit.open_tool`` and ``turnkit.commit_tool``: the store's side of a tool call that runs as the application's
own activity (``turnkit.activity_tool``), before and after the turn's workflow runs that activity.

Both are store calls (a local attempt, then a regular activity with the store's retries: ``workflows/store_calls``),
made of the same phases as TurnKit's own tool activity (:mod:`.tool_phases`): the open asks the authorization hook,
passes the control boundary, reserves tool budget and claims the execution ``running``, then hands the workflow the
activity's arguments; the commit records what the activity returned as the execution's result, with its tool-result
message, once. A failed or lost activity is settled by ``turnkit.settle_tool``, as for any tool.
"""

from __future__ import annotations

from turnkit._activities.tool_phases import ask_tool, commit_result, fail_call, find_tool, open_call
from turnkit._engine.executions import with_arguments
from turnkit.activity_tools import ActivityTool
from turnkit.config import settings
from turnkit.kernel.activities import ToolCalls, implements
from turnkit.kernel.errors import ToolError, error_class_name
from turnkit.kernel.payloads import OpenedToolCall, ToolCallInput, ToolCallResult, ToolOutcome
from turnkit.store.storable import UnstorableValue
from turnkit.store.store import Store
from turnkit.tools import Tool, normalize_result

__all__ = ["ActivityToolActivities"]


class ActivityToolActivities(ToolCalls):
    """The open and the commit of calls that run as the application's own activities, bound to a store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @implements(ToolCalls.open_tool)
    async def open_tool(self, request: ToolCallInput) -> OpenedToolCall:
        """Open the call's execution and return the activity's arguments, or how the call ended before it ran."""
        tool = _activity_tool(request)
        if settings.authorize is not None:
            # The hook sees the arguments before the opening transaction (it never runs inside one).
            [call] = await with_arguments(self.store, request.turn_id, [request.call])
            request = request.model_copy(update={"call": call})
        verdict = await ask_tool(self.store, request, tool)
        # Opening again runs nothing: the workflow schedules the activity only once this call's result is recorded,
        # so an execution found running was opened by an attempt whose result was lost, and the activity never ran.
        opened = await open_call(self.store, request, tool, verdict, attempt_runs_it=False)
        if isinstance(opened, ToolOutcome):
            return OpenedToolCall(ended=opened)
        turn, execution, _, call = opened
        assert isinstance(tool, ActivityTool)  # open_call settles an unknown tool
        try:
            args = tool.activity_args(call.arguments)
        except ToolError as err:  # invalid arguments: the model sees why, and the activity never runs
            ended = await fail_call(self.store, turn, execution, str(err), {"class": error_class_name(err)})
            return OpenedToolCall(ended=ended)
        return OpenedToolCall(execution_id=execution.id, args=args)

    @implements(ToolCalls.commit_tool)
    async def commit_tool(self, result: ToolCallResult) -> ToolOutcome:
        """Record the activity's result as the execution's (a late one, after the call was settled, is dropped)."""
        request = result.request
        async with self.store.atomic() as tx:
            turn = await tx.load_turn(request.turn_id)
            execution = await tx.load_tool_execution(result.execution_id)
        tool = _activity_tool(request)
        try:
            payload = normalize_result(result.result)
        except UnstorableValue as err:  # it ran: never reported as not run, the model is told why there is no result
            payload = {"result_unstorable": f"the tool ran, but {err}"}
        # Settled first (interrupted, cancelled)? Then that stands, and this result is dropped.
        return await commit_result(self.store, turn, execution, payload, tool)


def _activity_tool(request: ToolCallInput) -> Tool | None:
    """The call's tool in this worker's agent definitions; None when it is not an activity tool here (the open then
    settles the call as an unknown tool's)."""
    tool = find_tool(request.agent_name, request.call.name, request.call.policy)
    return tool if isinstance(tool, ActivityTool) else None
