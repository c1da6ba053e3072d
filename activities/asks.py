"""Activities behind :mod:`turnkit.workflow`: a team's workflow asks an agent, follows the turn, controls it.

* ``turnkit.ask_from_workflow`` does what ``Conversation.ask`` does in a client (it calls it): checks, authorization,
  staging, update-with-start on the conversation's lane or a fresh conversation's direct first turn. The ids come
  from the workflow, so a retried attempt first looks for the turn: found, it is submitted again only if its lane
  may not know it yet (the repeat is the lane's own idempotent submit). Then the workflow becomes the turn's waiter
  (a wait row whose waiter is the workflow id, as a lane follows its turn), so the turn's end signals it
  ``target_finished``; the record is read again after the row committed, so an end in between is not missed.
* ``turnkit.follow_asked_turn`` returns the result of an ended turn, or keeps the workflow its waiter; a turn whose
  workflow closed without a terminal record (terminated, timed out) is recorded ``failed``, as ``Turn.result()`` does.
* ``turnkit.control_asked_turn`` runs ``Turn.pause`` … ``Turn.steer``, and a cancel's two steps (the cancel workflow's
  activities, :mod:`turnkit._engine.control_writes`) itself.

A TurnKit error that no retry can mend (bad input, a denial, an unknown agent or conversation) is raised as a
non-retryable failure whose type is the error's class name, and the workflow raises it as that error again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from turnkit._engine.control_writes import announce_cancel, cancel_turns
from turnkit._engine.jsonschema import schema_errors
from turnkit._engine.turn_end import fail_unfinished_turn
from turnkit._engine.validation import check_json
from turnkit._temporal.heartbeats import heartbeating
from turnkit.agent import resolve_agent
from turnkit.cost import total_cost, total_usage
from turnkit.handles import Conversation, Turn
from turnkit.kernel import errors
from turnkit.kernel.activities import AskCalls, implements
from turnkit.kernel.asks import (
    ERROR_MESSAGE_LIMIT,
    AskReceipt,
    AskTurn,
    ControlReceipt,
    ControlTurn,
    FollowAsk,
    TokenUsage,
    TurnResult,
)
from turnkit.kernel.records import ConversationRecord, TurnRecord
from turnkit.model import Usage
from turnkit.run import task_text
from turnkit.store.store import Store

if TYPE_CHECKING:
    from turnkit.runtime import TurnKit

__all__ = ["AskActivities", "turn_result"]

#: Errors of a submission that a retry cannot mend (``InputError`` is a ``ValueError``): the workflow gets them as they
#: are. (A plain ``Error`` there is the server or the lane away for longer than ``ask`` waits: retried.)
_FINAL = (ValueError, errors.AuthorizationError, errors.ConfigError, errors.RecordNotFound, errors.ToolError)

#: The message metadata key (and conversation metadata key) that names the workflow that asked.
CALLER_KEY = "turnkit_caller"


@dataclass(frozen=True)
class _Connection:
    """What the handles use of a :class:`~turnkit.runtime.TurnKit`: the worker's client, its store, the turn's queue.
    (The runtime itself imports the worker's plugin, which registers these activities: it cannot be imported here.)"""

    client: Client
    store: Store
    task_queue: str


class AskActivities(AskCalls):
    """The :mod:`turnkit.workflow` activities, bound to a store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _tk(self, task_queue: str) -> TurnKit:
        return cast("TurnKit", _Connection(activity.client(), self.store, task_queue))

    @implements(AskCalls.ask)
    async def ask(self, request: AskTurn) -> AskReceipt:
        """Submit the turn (once, whatever the attempt) and make the calling workflow its waiter."""
        async with heartbeating():
            try:
                turn = await self._find(request.turn_id)
                if turn is None:
                    await self._submit(request)
                elif _maybe_unknown_to_lane(turn):
                    await self._submit_again(request.task_queue, turn.id)
            except _FINAL as err:
                raise _final(err) from err
            follow = FollowAsk(
                turn_id=request.turn_id,
                waiter_id=request.caller_workflow_id,
                task_queue=request.task_queue,
                output_limit=request.output_limit,
            )
            result = await self._wait_row_then_read(follow)
        return AskReceipt(turn_id=request.turn_id, conversation_id=request.conversation_id, result=result)

    async def _submit_again(self, task_queue: str, turn_id: str) -> None:
        """Submit a turn an earlier attempt wrote to its lane again (the lane dedupes by id). The lane may start it
        between the read and the submit: a turn that has left ``pending`` meanwhile needs nothing more."""
        try:
            await Turn(self._tk(task_queue), turn_id).perform_later()
        except errors.Error as err:
            if type(err) is not errors.Error:
                raise
            current = await self.store.load_turn(turn_id)
            if _maybe_unknown_to_lane(current):
                raise

    @implements(AskCalls.follow)
    async def follow(self, follow: FollowAsk) -> TurnResult | None:
        """The turn's result if it has ended; else None, with the workflow still its waiter."""
        turn = await self.store.load_turn(follow.turn_id)
        if turn.terminal:
            return await turn_result(self.store, turn, follow.output_limit)
        result = await self._wait_row_then_read(follow)
        if result is not None:
            return result
        client = activity.client()
        try:
            status = (await client.get_workflow_handle(follow.turn_id).describe()).status
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise  # the server is away: retried
            return None  # queued behind its conversation's other turns: its lane starts it later
        if status in (None, WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW):
            return None
        reason = f"turn workflow ended ({status.name.lower()}) without a terminal status"
        turn, _ = await fail_unfinished_turn(self.store, client, follow.task_queue, follow.turn_id, reason)
        return await turn_result(self.store, turn, follow.output_limit)

    @implements(AskCalls.control)
    async def control(self, control: ControlTurn) -> ControlReceipt:
        """Pause, resume, steer or cancel the turn (and its descendants, per ``descendants``); idempotent."""
        turn = Turn(self._tk(control.task_queue), control.turn_id)
        receipts: list[dict[str, Any]] = []
        try:
            if control.action == "pause":
                await turn.pause(descendants=control.descendants, principal=control.principal)
            elif control.action == "resume":
                await turn.resume(descendants=control.descendants, principal=control.principal)
            elif control.action == "cancel":
                # This activity is the durable request already (retried until done): the cancel's two steps run here.
                cancelled = await cancel_turns(self.store, control.turn_id, control.descendants, control.principal)
                client, task_queue = activity.client(), control.task_queue
                await announce_cancel(self.store, client, task_queue, [each.id for each in cancelled])
            else:
                receipts = await turn.steer(
                    control.text, key=control.key, principal=control.principal, descendants=control.descendants
                )
        except (ValueError, errors.Error) as err:
            # A control refused (a finished turn cannot be steered, a denial, a bad argument) is refused again on
            # every retry; only a store that is away is worth waiting for.
            if isinstance(err, errors.StoreError) and not isinstance(err, errors.RecordNotFound):
                raise
            raise _final(err) from err
        record = await self.store.load_turn(control.turn_id)
        return ControlReceipt(turn_id=record.id, status=record.status, receipts=receipts)

    async def _find(self, turn_id: str) -> TurnRecord | None:
        async with self.store.reads() as tx:
            return await tx.find_turn(turn_id)

    async def _submit(self, request: AskTurn) -> None:
        """What ``Conversation.ask`` does, with the workflow's ids (``Agent.run``'s task message for a ``run``)."""
        conversation = Conversation(self._tk(request.task_queue), await self._conversation(request))
        caller = {"workflow_id": request.caller_workflow_id, "run_id": request.caller_run_id}
        text = request.text
        metadata: dict[str, Any] = dict(request.message_metadata or {})
        if request.task:  # Agent.run's task message
            agent = resolve_agent(request.agent_name or conversation.agent_name)
            if agent.input_schema is not None and (problems := schema_errors(request.task_input, agent.input_schema)):
                raise errors.InputError("; ".join(problems))
            text, metadata = task_text(request.text, request.task_input), {"source": "workflow", "task": True}
        metadata.setdefault(CALLER_KEY, caller)
        # ``thinking`` is passed only when the workflow gave it: None disables the agent's, absent keeps it.
        thinking: dict[str, Any] = {"thinking": request.thinking} if request.thinking_set else {}
        await conversation.ask(
            text,
            wait=False,
            agent=None if request.new_conversation else request.agent_name,
            model=request.model,
            **thinking,
            output_schema=request.output_schema,
            prompt_mode="task" if request.task else request.prompt_mode,
            context=request.context,
            principal=request.principal,
            metadata=metadata,
            callback=request.callback_conversation_id,
            wait_for=list(request.wait_for) or None,
            paused=request.paused,
            compact=request.compact,
            budget=request.budget,
            root_turn_id=request.root_turn_id,
            turn_id=request.turn_id,
            message_id=request.message_id,
        )

    async def _conversation(self, request: AskTurn) -> ConversationRecord:
        """The conversation to ask in; a new one (under the workflow's id) is created once, bound to the agent."""
        if not request.new_conversation:
            return await self.store.load_conversation(request.conversation_id)
        agent = resolve_agent(request.agent_name or "")
        check_json("metadata", request.conversation_metadata)
        check_json("context", request.context)
        check_json("principal", request.principal, lenient=True)
        metadata: dict[str, Any] = dict(request.conversation_metadata or {})
        metadata.setdefault(CALLER_KEY, {"workflow_id": request.caller_workflow_id, "run_id": request.caller_run_id})
        if request.context is not None:
            metadata["turnkit_context"] = request.context
        if request.principal is not None:
            metadata["principal"] = request.principal
        async with self.store.atomic() as tx:
            return await tx.create_conversation(
                agent_name=agent.name, model=agent.effective_model, metadata=metadata, id=request.conversation_id
            )

    async def _wait_row_then_read(self, follow: FollowAsk) -> TurnResult | None:
        """Register the workflow as the turn's waiter, then read the record: terminal now means no signal is needed
        (an end that listed the waiters before the row committed is seen here; see :mod:`turnkit._engine.waits`)."""
        async with self.store.atomic() as tx:
            await tx.create_wait(turn_id=follow.waiter_id, target_turn_id=follow.turn_id)
        turn = await self.store.load_turn(follow.turn_id)
        return await turn_result(self.store, turn, follow.output_limit) if turn.terminal else None


def _maybe_unknown_to_lane(turn: TurnRecord) -> bool:
    """A turn an earlier attempt wrote that has not started: its lane's submit may not have been accepted (the worker
    died in that workflow task), so it is submitted again. A started or ended turn needs nothing."""
    return turn.status in ("pending", "paused") and turn.started_at is None and turn.parent_turn_id is None


def _final(err: Exception) -> ApplicationError:
    name = errors.error_class_name(err) if isinstance(err, errors.Error) else "TurnKit::InputError"
    return ApplicationError(str(err), type=name, non_retryable=True)


async def turn_result(store: Store, turn: TurnRecord, output_limit: int) -> TurnResult:
    """The bounded result of the terminal ``turn`` (see :class:`~turnkit.kernel.asks.TurnResult`)."""
    tree = await store.list_turns(root_turn_id=turn.root_turn_id)
    text = turn.output_text or ""
    encoded = text.encode("utf-8")
    data, truncated = turn.output_data, len(encoded) > output_limit
    if data is not None and len(json.dumps(data, default=str).encode("utf-8")) > output_limit:
        data, truncated = None, True
    error = turn.error or {}
    message = error.get("message")
    return TurnResult(
        turn_id=turn.id,
        conversation_id=turn.conversation_id,
        agent_name=turn.agent_name,
        status=turn.status,  # type: ignore[arg-type]  # terminal: read after its terminal write
        output_text=encoded[:output_limit].decode("utf-8", errors="ignore"),
        output_data=data,
        output_truncated=truncated,
        output_bytes=len(encoded),
        error_class=error.get("class"),
        error_message=None if message is None else str(message)[:ERROR_MESSAGE_LIMIT],
        usage=_tokens(Usage.from_dict(turn.usage)),
        cost=turn.cost,
        tree_usage=_tokens(total_usage(tree)),
        tree_cost=total_cost(tree),
    )


def _tokens(usage: Usage) -> TokenUsage:
    return TokenUsage(**usage.model_dump(exclude={"cost"}))
