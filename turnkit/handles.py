"""Application handles: :class:`Conversation` and :class:`Turn`.

Handles talk to Temporal for execution (submit, await) and read records from the store. They hold ids, and a
``record`` snapshot that :meth:`Turn.refresh` re-reads.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from temporalio.client import (
    WithStartWorkflowOperation,
    WorkflowFailureError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

import turnkit.kernel.errors as errors
from turnkit._engine.authorization import Action, authorize
from turnkit._engine.client_requests import request_cancel, request_compaction
from turnkit._engine.control_writes import write_control
from turnkit._engine.controls import apply_pause, apply_resume, apply_steer, controls_of
from turnkit._engine.deliveries import create_delivery, signal_delivery
from turnkit._engine.direct_turn import can_start_directly, write_direct_turn
from turnkit._engine.ids import new_id
from turnkit._engine.lane_submit import resubmit, until_started
from turnkit._engine.prepared import SUBMITTABLE, preview_request
from turnkit._engine.server_away import SERVER_AWAY, while_server_away
from turnkit._engine.standalone_requests import request_standalone
from turnkit._engine.turn_build import create_turn
from turnkit._engine.turn_end import fail_unfinished_turn
from turnkit._engine.turn_options import check_budget
from turnkit._engine.turn_start import start_turn_workflow
from turnkit._engine.turn_stream import POLL_INTERVAL, stream_conversation, stream_turn
from turnkit._engine.validation import check_id, check_json, check_key, check_name, check_size, check_text
from turnkit._engine.waits import add_waits, enter_waiting
from turnkit._temporal.search_attributes import registration_hint
from turnkit.agent import resolve_agent
from turnkit.config import settings
from turnkit.cost import Cost, total_usage
from turnkit.events import check_on_event, register_turn_callback, unregister_turn_callback
from turnkit.kernel.failures import ended_reason
from turnkit.kernel.names import LANE_WORKFLOW, SUBMIT_UPDATE
from turnkit.kernel.payloads import LaneInput, SubmitTurn, TurnInput, TurnTicket
from turnkit.kernel.records import ConversationRecord, DeliveryRecord, MessageRecord, ToolExecutionRecord, TurnRecord
from turnkit.kernel.search_attributes import lane_search_attributes
from turnkit.media import MediaInput, check_media, stored_media
from turnkit.model import ModelRequest, Usage
from turnkit.store.patience import patiently
from turnkit.store.store import Store, StoreTx
from turnkit.streaming import TurnStreamEvent

if TYPE_CHECKING:
    from turnkit.runtime import TurnKit

__all__ = ["Conversation", "Turn"]

#: The default of ``thinking`` options: the agent's thinking, where an explicit None turns thinking off.
UNSET: Any = object()

#: The server aborted an update because the workflow task that carried it failed (e.g. it completed with a command
#: that new events made stale): the update was never accepted, and repeating it is safe (same update id).
_UPDATE_ABORTED = "unexpected workflow task failure"
#: How long ``Turn.result()`` waits before asking a lane that is continuing as new again (its next run starts in
#: about one workflow task).
_ROLLOVER_PAUSE = 0.05
#: How long a submission (or a delivery's signal) is repeated while the server is away before the caller gets a
#: TurnKit error.
SUBMIT_RECONNECT_WINDOW = 60.0
#: How long ``ask`` keeps trying to stage its input while the store is away (the lane bounds its submit the same).
STAGE_RETRY_WINDOW = 60.0


async def joined_root(store: Store, root_turn_id: str | None) -> str | None:
    """``root_turn_id`` checked before anything is written: an existing root turn (behaviour §1.2 ``parent_run``).

    Raises:
        InputError: Not a turn id, or the turn is not a root.
        RecordNotFound: No such turn.
    """
    if root_turn_id is None:
        return None
    check_id("root_turn_id", root_turn_id, "turn")
    root = await store.load_turn(root_turn_id)
    if root.root_turn_id != root.id:
        raise errors.InputError(f"root_turn_id {root.id} is not a root turn (its root is {root.root_turn_id})")
    return root.id


class Conversation:
    """A durable thread bound to one agent (behaviour §1.3). Get one from :meth:`TurnKit.conversation`."""

    def __init__(self, tk: TurnKit, record: ConversationRecord) -> None:
        self._tk = tk
        self.record = record

    @property
    def id(self) -> str:
        """The conversation id (``conv_…``), also the workflow id of its lane."""
        return self.record.id

    @property
    def agent_name(self) -> str:
        """The name of the agent the conversation is bound to."""
        return self.record.agent_name

    @property
    def subject_prompt(self) -> str:
        """The subject's ``to_prompt()`` text, snapshotted when the conversation was created (``""`` when none)."""
        return str(self.record.metadata.get("turnkit_subject_prompt") or "")

    async def say(self, text: str, *, metadata: dict[str, Any] | None = None) -> MessageRecord:
        """Append a user message without starting a turn.

        Raises:
            InputError: ``text`` is empty or not storable, or ``metadata`` is not JSON (nothing is written).
        """
        check_text("text", text)
        check_json("metadata", metadata)
        return await self._tk.store.append_message(self.id, role="user", text=text, metadata=metadata)

    async def ask(
        self,
        text: str,
        *,
        wait: bool = True,
        agent: str | None = None,
        model: str | None = None,
        thinking: dict[str, Any] | None = UNSET,
        output_schema: dict[str, Any] | None = None,
        prompt_mode: str | None = None,
        context: dict[str, Any] | None = None,
        principal: Any = None,
        metadata: dict[str, Any] | None = None,
        callback: Conversation | str | None = None,
        wait_for: list[Turn | str] | None = None,
        paused: bool = False,
        compact: bool | None = None,
        budget: dict[str, Any] | None = None,
        root_turn_id: str | None = None,
        on_event: Any = None,
        media: Sequence[MediaInput] | None = None,
        turn_id: str | None = None,
        message_id: str | None = None,
    ) -> Turn:
        """Append ``text`` as a user message and submit a turn it triggers; FIFO behind this conversation's turns.

        Returns at once with ``wait=False`` (the turn is ``pending``); otherwise when the turn has finished.
        ``thinking=None`` disables the agent's thinking for this turn (behaviour §1.4). With ``callback``, the finished
        turn's result is delivered to that conversation (key ``completion:<turn_id>``). With ``wait_for``, the turn
        starts only once those turns finished, and their results are its input (behaviour §5.5 application joins).
        ``paused=True`` submits it paused: an approval gate that runs nothing (and blocks the conversation) until
        :meth:`Turn.resume`. ``compact=True`` compacts the history before the first model call, ``False`` never
        compacts this turn. ``budget`` sets limits for this turn's tree over the agent's (e.g. ``{"max_iterations":
        3}``). ``root_turn_id`` makes the turn join that root turn's tree (its budgets, usage and deadline) instead of
        starting its own. ``on_event`` (a callable or a list) receives this turn's events instead of its agent's or
        the global callback (behaviour §3.11), when a worker in this process runs the turn: callbacks cannot cross
        to a remote worker (register them there, on the agent or globally). Its sub-agents inherit the agent's.
        ``media`` (:class:`~turnkit.media.MediaInput` items) go with the message as image or document input: their
        bytes are stored first, the message holds references. ``turn_id`` and ``message_id`` name the new turn and its
        message (default: new ids); a caller that must find its turn again after a lost reply chooses them
        (:mod:`turnkit.workflow` does, in workflow code), and looks for the turn before it asks again.
        """
        # Every input is checked before anything is sent or written (issue 8 item 1): InputError names the field.
        self._check_turn_input(text, agent, model, thinking, output_schema, context, principal, metadata, compact)
        turn_id = new_id("turn") if turn_id is None else check_id("turn_id", turn_id, "turn")
        message_id = new_id("message") if message_id is None else check_id("message_id", message_id, "msg")
        check_media(media)
        check_budget(budget)
        callbacks = check_on_event(on_event)
        wait_ids = [t.id if isinstance(t, Turn) else t for t in wait_for or []]
        for wait_id in wait_ids:
            check_id("wait_for", wait_id, "turn")
        if wait_ids:
            waiter_principal = principal if principal is not None else self.record.metadata.get("principal")
            await authorize("wait", waiter_principal, turn=None, targets=wait_ids)
        callback_id = callback.id if isinstance(callback, Conversation) else callback
        if callback_id is not None:
            check_id("callback", callback_id, "conv")
            turn_principal = principal if principal is not None else self.record.metadata.get("principal")
            await authorize("callback", turn_principal, turn=None, destination_conversation=callback_id)
            await self._tk.store.load_conversation(callback_id)  # must exist: fail before anything is written
        request = SubmitTurn(
            conversation_id=self.id,
            turn_id=turn_id,
            message_id=message_id,
            text=text,
            agent_name=agent,
            model=model,
            message_metadata=dict(metadata or {}),
            thinking=None if thinking is UNSET else thinking,
            thinking_set=thinking is not UNSET,
            output_schema=output_schema,
            prompt_mode=prompt_mode,
            context=context,
            principal=principal,
            callback_conversation_id=callback_id,
            wait_for=wait_ids,
            paused=paused,
            compact=compact,
            budget=budget,
            root_turn_id=await self._joined_root(root_turn_id),
            media=await stored_media(self._tk.store, media),
        )
        # The whole submission must stay within the limit: a clear error instead of an RPC error.
        check_size("input", len(request.model_dump_json(fallback=str).encode("utf-8")))
        if callbacks is not None:
            register_turn_callback(request.turn_id, callbacks)  # before the turn exists: its first event is caught
        try:
            if not await self._start_direct_turn(request):
                await self._submit(await self._staged(request))
        except BaseException:
            unregister_turn_callback(request.turn_id)
            raise
        turn = Turn(self._tk, request.turn_id)
        if wait and not paused:
            return await turn.result()
        return await turn.refresh()

    async def _joined_root(self, root_turn_id: str | None) -> str | None:
        return await joined_root(self._tk.store, root_turn_id)

    async def build_turn(
        self,
        text: str,
        *,
        agent: str | None = None,
        model: str | None = None,
        thinking: dict[str, Any] | None = UNSET,
        output_schema: dict[str, Any] | None = None,
        prompt_mode: str | None = None,
        context: dict[str, Any] | None = None,
        principal: Any = None,
        metadata: dict[str, Any] | None = None,
        paused: bool = False,
        compact: bool | None = None,
        budget: dict[str, Any] | None = None,
        root_turn_id: str | None = None,
        on_event: Any = None,
        media: Sequence[MediaInput] | None = None,
    ) -> Turn:
        """Append ``text`` and build its turn without submitting it (behaviour §1.4 ``build_turn``; a *prepared* turn).

        The turn is ``pending`` (``paused`` with ``paused=True``) with no ``submitted_at``: its frozen context ends at
        ``text``, nothing runs it and no lane queues it. Inspect it with :meth:`Turn.preview`, attach waits with
        :meth:`Turn.wait_for`, then submit it with :meth:`Turn.perform_later` or :meth:`Turn.run`. The options are
        those of :meth:`ask`.
        """
        self._check_turn_input(text, agent, model, thinking, output_schema, context, principal, metadata, compact)
        check_budget(budget)
        callbacks = check_on_event(on_event)
        check_media(media)
        request = SubmitTurn(
            conversation_id=self.id,
            turn_id=new_id("turn"),
            message_id=new_id("message"),
            text=text,
            agent_name=agent,
            model=model,
            message_metadata=dict(metadata or {}),
            thinking=None if thinking is UNSET else thinking,
            thinking_set=thinking is not UNSET,
            output_schema=output_schema,
            prompt_mode=prompt_mode,
            context=context,
            principal=principal,
            paused=paused,
            compact=compact,
            budget=budget,
            root_turn_id=await self._joined_root(root_turn_id),
            media=await stored_media(self._tk.store, media),
        )
        agent_def = resolve_agent(agent or self.agent_name)
        async with self._tk.store.atomic(conversation_id=self.id) as tx:
            conversation = await tx.load_conversation(self.id)
            # Where it will be submitted: the workers there run it if its submission is lost (docs/design.md).
            record = await create_turn(
                tx, conversation, agent_def, request, submitted=False, task_queue=self._tk.task_queue
            )
        if callbacks is not None:
            register_turn_callback(record.id, callbacks)
        return Turn(self._tk, record.id, record)

    @staticmethod
    def _check_turn_input(
        text: str,
        agent: str | None,
        model: str | None,
        thinking: Any,
        output_schema: dict[str, Any] | None,
        context: dict[str, Any] | None,
        principal: Any,
        metadata: dict[str, Any] | None,
        compact: bool | None,
    ) -> None:
        """Check a new turn's input before anything is sent or written (issue 8 item 1)."""
        check_text("text", text)
        check_name("agent", agent)
        check_name("model", model)
        for field, value in (("metadata", metadata), ("context", context), ("output_schema", output_schema)):
            check_json(field, value)
        if thinking is not UNSET:
            check_json("thinking", thinking)
        check_json("principal", principal, lenient=True)
        if compact is not None and not isinstance(compact, bool):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise errors.InputError(f"compact must be True, False or None, not {compact!r}")

    async def _start_direct_turn(self, request: SubmitTurn) -> bool:
        """Run ``request`` without the conversation's lane when there is nothing to order (its first turn, or the
        next of an idle conversation: :mod:`turnkit._engine.direct_turn`); False, with nothing written, when a turn
        of it is unfinished (or it may not skip the lane): then the lane queues it."""
        if not can_start_directly(request):
            return False

        async def write() -> TurnInput | None:
            return await write_direct_turn(self._tk.store, request, self.agent_name, task_queue=self._tk.task_queue)

        # A database blink is waited out, as for a staged input (idempotent by the turn id).
        turn = await patiently(write, what="accept the turn's input", window=STAGE_RETRY_WINDOW)
        if turn is None:
            return False
        tk = self._tk

        async def start() -> None:  # started here, or already (an earlier attempt, a lane): either way it runs
            await start_turn_workflow(tk.client, tk.task_queue, turn, search_attributes=settings.search_attributes)

        try:
            await _while_server_away(start, f"starting turn {turn.turn_id} of conversation {self.id}")
        except errors.Error as err:
            # The caller gets an error: the committed turn must not run later (a lane would start it), so it is
            # recorded failed. Should that write fail too, `turnkit check` reports the turn (turn_without_workflow).
            await self._fail_unstarted(turn.turn_id, str(err))
            raise
        return True

    async def _fail_unstarted(self, turn_id: str, reason: str) -> None:
        """Record a direct turn whose workflow could not be started ``failed`` (a compare-and-set: a turn that a lane
        started meanwhile and that has ended is left as it is)."""
        with suppress(RPCError):  # its announcements (a callback's signal) are repaired by `turnkit reconcile`
            await fail_unfinished_turn(self._tk.store, self._tk.client, self._tk.task_queue, turn_id, reason)

    async def _staged(self, request: SubmitTurn) -> SubmitTurn:
        """Write what the user wrote to the store; the update carries its id instead (issue 8 item 12).

        Staged under the message id (one per ``ask``); a submission whose update fails leaves an orphan row that
        nothing reads. A store that refuses the write fails the ``ask`` at once, before anything is sent.
        """
        content = {
            "text": request.text,
            "context": request.context,
            "principal": request.principal,
            "metadata": request.message_metadata,
        }

        async def stage() -> None:
            async with self._tk.store.atomic() as tx:
                await tx.stage_input(request.message_id, conversation_id=self.id, content=content)

        # A database blink is waited out (idempotent by id), as the lane waits out its submit (issue 8).
        await patiently(stage, what="accept the turn's input", window=STAGE_RETRY_WINDOW)
        empty = {"text": "", "context": None, "principal": None, "message_metadata": {}}
        return request.model_copy(update={"staged_input_id": request.message_id, **empty})

    async def _submit(self, request: SubmitTurn) -> None:
        # Update-with-start: the lane is started if it is not running; the update returns once the turn exists.
        start = WithStartWorkflowOperation(
            LANE_WORKFLOW,
            LaneInput(conversation_id=self.id),
            id=self.id,
            task_queue=self._tk.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary=f"conversation · {self.agent_name}",
            search_attributes=lane_search_attributes(self.id, self.agent_name) if settings.search_attributes else None,
        )

        async def submit() -> None:
            try:
                await self._tk.client.execute_update_with_start_workflow(
                    SUBMIT_UPDATE, request, start_workflow_operation=start, id=request.turn_id, result_type=TurnTicket
                )
            except WorkflowUpdateFailedError as err:
                raise _turnkit_error(err.cause) from err
            except WorkflowUpdateRPCTimeoutOrCancelledError as err:
                raise errors.Error(f"submitting the turn to conversation {self.id} timed out") from err

        # Repeating is safe: the turn id is the update id and the submit activity is idempotent by it.
        await _while_server_away(submit, f"submitting the turn to conversation {self.id}")

    async def messages(self, *, principal: Any = None) -> list[MessageRecord]:
        """Every message of the conversation, in sequence order; asked as ``read_messages`` (behaviour §7.3)."""
        await authorize("read_messages", principal, destination_conversation=self.id)
        return await self._tk.store.list_messages(self.id)

    async def post(self, text: str, *, key: str, principal: Any = None) -> DeliveryRecord:
        """Durable next-turn input for this conversation (behaviour §1.3 ``post``), idempotent by ``key``.

        The sender's ``principal`` is recorded with the message; the turn it wakes acts for this conversation.
        Retrying with the same key and payload returns the same delivery; a different payload raises ``ToolError``.
        """
        await authorize("send_message", principal, source_conversation=self.id, destination_conversation=self.id)
        return await self._deliver(self.id, text, key=key, principal=principal, include_principal=True)

    async def send_message(
        self, destination: Conversation | str, text: str, *, key: str, principal: Any = None
    ) -> DeliveryRecord:
        """Send ``text`` to another conversation (behaviour §1.3); its payload carries no principal."""
        destination_id = destination.id if isinstance(destination, Conversation) else destination
        check_id("destination", destination_id, "conv")
        await authorize("send_message", principal, source_conversation=self.id, destination_conversation=destination_id)
        return await self._deliver(destination_id, text, key=key, principal=principal, include_principal=False)

    async def _deliver(
        self, destination_id: str, text: str, *, key: str, principal: Any, include_principal: bool
    ) -> DeliveryRecord:
        check_key("key", key)
        check_text("text", text)
        check_json("principal", principal, lenient=True)
        async with self._tk.store.atomic() as tx:
            delivery = await create_delivery(
                tx,
                source_conversation_id=self.id,
                destination_conversation_id=destination_id,
                key=key,
                text=text,
                principal=principal,
                include_principal=include_principal,
            )
        # After commit: the row is the truth, the signal only a wake-up (reconcile repairs a lost one).
        await _while_server_away(
            lambda: signal_delivery(self._tk.client, self._tk.task_queue, delivery),
            f"signalling the conversation of stored delivery {delivery.id} (`turnkit reconcile` retries it)",
        )
        return delivery

    async def inbox(self, *, principal: Any = None) -> list[DeliveryRecord]:
        """Deliveries addressed to this conversation, oldest first; asked as ``read_messages`` (behaviour §7.3)."""
        await authorize("read_messages", principal, destination_conversation=self.id)
        async with self._tk.store.atomic() as tx:
            return await tx.list_deliveries(destination_conversation_id=self.id)

    async def outbox(self, *, principal: Any = None) -> list[DeliveryRecord]:
        """Deliveries sent from this conversation, oldest first; asked as ``read_messages`` (behaviour §7.3)."""
        await authorize("read_messages", principal, destination_conversation=self.id)
        async with self._tk.store.atomic() as tx:
            return await tx.list_deliveries(source_conversation_id=self.id)

    async def messages_after(self, sequence: int, *, principal: Any = None) -> list[MessageRecord]:
        """Messages after ``sequence``, without thinking or provider parts (behaviour §1.3; the store is unchanged)."""
        await authorize("read_messages", principal, destination_conversation=self.id)
        async with self._tk.store.atomic() as tx:
            messages = await tx.list_messages(self.id, after_sequence=sequence)
        return [
            message.model_copy(
                update={"content": [p for p in message.content if p.get("type") not in ("thinking", "provider")]}
            )
            for message in messages
        ]

    async def input_status(self, delivery_id: str, *, principal: Any = None) -> dict[str, Any]:
        """Whether delivered input reached a model request: ``applied`` (with turn and request ids) or ``pending``."""
        await authorize("read_control", principal, destination_conversation=self.id)
        async with self._tk.store.atomic() as tx:
            delivery = await tx.load_delivery(delivery_id)
            if delivery.destination_conversation_id != self.id:
                raise ValueError("delivery belongs to another conversation")
            application = None
            for turn in await tx.list_turns(conversation_id=self.id):
                request_id = turn.options.state.delivery_requests.get(delivery_id)
                if request_id:
                    application = {"turn_id": turn.id, "request_id": request_id}
                    break
        return {
            **delivery.model_dump(mode="json"),
            "application": application,
            "status": "applied" if application else "pending",
        }

    async def compact(
        self, *, focus: str | None = None, model: str | None = None, key: str | None = None
    ) -> MessageRecord:
        """Summarise the middle of this conversation now (behaviour §3.10 manual compaction).

        The policy is ``settings.compaction`` merged with the agent's ``compaction``. The summary is appended as an
        assistant ``context_summary`` message without a turn; later turns see it in place of the messages it covers.
        Nothing is deleted. Its model call belongs to no turn, so it is not charged to one.

        It runs on a worker, as a workflow of its own whose summariser call is an activity (docs/design.md, "No side
        doors"): a caller that dies after asking leaves the summary to be written once, without it.

        Args:
            focus: A topic the summary should focus on.
            model: The compaction model; defaults to the policy's, then the conversation's, then the agent's.
            key: Makes the request idempotent: asked again with the same key (after the caller died, say), it returns
                the summary the first request appended, without another model call.

        Returns:
            The summary message.

        Raises:
            CompactionError: ``"compaction is disabled"``, ``"not enough messages to compact"``,
                ``"compaction model returned an empty summary"``, or ``"compaction failed: <cause>"``.
        """
        if key is not None:
            check_key("key", key)
        return await request_compaction(self._tk, self.id, focus=focus, model=model, key=key)

    async def usage(self) -> Usage:
        """Tokens used by every turn of this conversation (behaviour §1.3)."""
        return total_usage(await self._tk.store.list_turns(conversation_id=self.id))

    async def cost(self) -> Cost:
        """The USD cost of every turn of this conversation (:meth:`Cost.of_turns`; ``.total`` is None when none is
        known)."""
        return Cost.of_turns(await self._tk.store.list_turns(conversation_id=self.id))

    async def turns(self, *, principal: Any = None) -> list[Turn]:
        """Every turn of the conversation, oldest first (their records carry output text: asked as ``read_messages``,
        behaviour §7.3)."""
        await authorize("read_messages", principal, destination_conversation=self.id)
        records = await self._tk.store.list_turns(conversation_id=self.id)
        return [Turn(self._tk, record.id, record) for record in records]

    async def stream(self, *, principal: Any = None, poll: float = POLL_INTERVAL) -> AsyncIterator[TurnStreamEvent]:
        """The events of this conversation's turns as they run, one turn after the other: the unfinished turns, then
        every turn that starts later, each ending with its :class:`~turnkit.streaming.TurnEnded`. Runs until the
        caller stops iterating (``break``); asked as ``read_messages`` (behaviour §7.3).

        See :meth:`Turn.stream` for the events, and what reaches a process on each store.
        """
        await authorize("read_messages", principal, destination_conversation=self.id)
        async for event in stream_conversation(self._tk.store, self.id, poll=poll):
            yield event


class Turn:
    """A handle on one turn (behaviour §1.5): its record, and a way to wait for it."""

    def __init__(self, tk: TurnKit, turn_id: str, record: TurnRecord | None = None) -> None:
        self._tk = tk
        self.id = turn_id
        self._record = record

    @property
    def record(self) -> TurnRecord:
        """The last loaded record (``refresh()`` or ``result()`` loads it)."""
        if self._record is None:
            raise errors.Error("turn record not loaded yet: await turn.refresh() or turn.result()")
        return self._record

    @property
    def status(self) -> str:
        """``pending``, ``running``, ``completed``, ``failed``… (behaviour §1.6)."""
        return self.record.status

    @property
    def output_text(self) -> str:
        """The final output text, ``""`` when there is none."""
        return self.record.output_text or ""

    @property
    def output_data(self) -> Any:
        """Structured output, when the agent asked for an ``output_schema``."""
        return self.record.output_data

    @property
    def usage(self) -> Usage:
        """Tokens used by this turn (children excluded), summed over its model calls."""
        return Usage.from_dict(self.record.usage)

    @property
    def cost(self) -> Cost:
        """This turn's cost in USD by component (:meth:`Cost.from_record`; children excluded): ``cost.total`` is
        None when no cost is known."""
        return Cost.from_record(self.record)

    @property
    def error(self) -> dict[str, Any] | None:
        """``{class, message}`` of a failed or cancelled turn."""
        return self.record.error

    @property
    def context(self) -> dict[str, Any]:
        """The run's context the turn was built with (a deep copy: changing it changes nothing stored)."""
        return copy.deepcopy(self.record.options.context)

    @property
    def policy_audit(self) -> dict[str, Any] | None:
        """The output-policy audit (``options.state.policy_audit``, else the legacy ``options.policy_audit``); None
        when no output policy ran."""
        options = self.record.options
        return options.state.policy_audit if options.state.policy_audit is not None else options.policy_audit

    @property
    def policy_clean(self) -> bool | None:
        """Whether the output-policy audit found nothing (spec ``policy_clean?``); None when no policy ran."""
        audit = self.policy_audit
        return None if audit is None else bool(audit.get("clean"))

    @property
    def is_background(self) -> bool:
        """True once the turn is submitted (``submitted_at`` set); False for a prepared turn (spec ``background?``)."""
        return self.record.submitted_at is not None

    @property
    def is_pending(self) -> bool:
        """``status == "pending"`` (of the loaded record; ``refresh()`` re-reads it)."""
        return self.record.status == "pending"

    @property
    def is_waiting(self) -> bool:
        """``status == "waiting"``."""
        return self.record.status == "waiting"

    @property
    def is_paused(self) -> bool:
        """``status == "paused"``."""
        return self.record.status == "paused"

    @property
    def is_running(self) -> bool:
        """``status == "running"``."""
        return self.record.status == "running"

    @property
    def is_completed(self) -> bool:
        """``status == "completed"``."""
        return self.record.status == "completed"

    @property
    def is_failed(self) -> bool:
        """``status == "failed"``."""
        return self.record.status == "failed"

    @property
    def is_cancelled(self) -> bool:
        """``status == "cancelled"``."""
        return self.record.status == "cancelled"

    @property
    def is_stale(self) -> bool:
        """``status == "stale"``."""
        return self.record.status == "stale"

    async def preview(self, *, principal: Any = None) -> ModelRequest:
        """The request the turn's next model call would send, built by the model activity's own builder, without
        calling the model or writing anything (``preview``, behaviour §1.5; T05): model, messages, tools, system prompt
        (``instructions``, ``dynamic_instructions``), thinking, output schema, metadata and the prompt ``report``.
        Asked as ``read_messages`` (behaviour §7.3).

        Raises:
            ConfigError: The turn's agent is not registered in this process.
            AuthorizationError: ``"not authorized to read_messages"``.
        """
        record = await self._load()
        await authorize("read_messages", principal, destination_conversation=record.conversation_id, turn=record)
        return await preview_request(self._tk.store, record)

    async def perform_later(self, *, callback: Conversation | str | None = None) -> Turn:
        """Submit a prepared turn (:meth:`Conversation.build_turn`) to its conversation's lane; returns at once.

        It is queued behind the conversation's turns; a paused one stays paused until :meth:`resume`. Submitting a
        submitted turn again changes nothing. With ``callback``, its result is delivered to that conversation.

        Raises:
            Error: ``"only pending or paused turns can be submitted"``.
            AuthorizationError: The ``callback`` is denied for the turn's principal (nothing is written).
        """
        record = await self._load()
        callback_id = callback.id if isinstance(callback, Conversation) else callback
        if callback_id is not None:
            check_id("callback", callback_id, "conv")
            await authorize("callback", record.options.principal, turn=record.id, destination_conversation=callback_id)
            await self._tk.store.load_conversation(callback_id)  # must exist: fail before anything is written
        async with self._tk.store.atomic(turn_id=record.root_turn_id) as tx:
            record = await tx.load_turn(self.id)
            if record.status not in SUBMITTABLE:
                raise errors.Error("only pending or paused turns can be submitted")
            if callback_id is not None and record.options.callback_conversation_id != callback_id:
                options = record.options.model_copy(update={"callback_conversation_id": callback_id})
                record = await tx.update_turn(record.id, options=options)
        if record.parent_turn_id is None:  # a sub-agent's turn is run by its parent, never by the lane
            request = SubmitTurn(
                conversation_id=record.conversation_id,
                turn_id=record.id,
                message_id=record.options.trigger_message_id or "",
                agent_name=record.agent_name,
            )
            conversation = Conversation(self._tk, await self._tk.store.load_conversation(record.conversation_id))
            await conversation._submit(request)  # pyright: ignore[reportPrivateUsage]
        return await self.refresh()

    async def run(self, *, callback: Conversation | str | None = None, timeout: float | None = None) -> Turn:
        """Submit a prepared turn (:meth:`perform_later`) and wait until it has finished (spec ``run!``; T04)."""
        await self.perform_later(callback=callback)
        return await self.result(timeout=timeout)

    async def paint(self, prompt: str, *, model: str, **options: Any) -> Turn:
        """Generate an image as the whole work of this prepared turn (behaviour §3.12 standalone mode); see
        :func:`turnkit._engine.media_standalone.paint_turn` for ``options`` and errors. Returns the finished turn.

        The call runs on a worker, in the turn's own workflow (docs/design.md, "No side doors"); a ``client=`` object
        reaches only a worker in this process (:mod:`turnkit._engine.lent_clients`)."""
        self._record = await request_standalone(self._tk, self.id, "paint", prompt, model=model, options=options)
        return self

    async def view_media(self, media: MediaInput | str, *, objective: str, **options: Any) -> Turn:
        """Analyse media as the whole work of this prepared turn (behaviour §3.12 standalone mode); see
        :func:`turnkit._engine.media_standalone.view_media_turn` for ``options`` and errors. Returns the finished
        turn. It runs as :meth:`paint` does; a :class:`MediaInput`'s bytes are stored here first."""
        model = options.pop("model", None)
        self._record = await request_standalone(
            self._tk, self.id, "view_media", objective, model=model, media=media, options=options
        )
        return self

    async def refresh(self) -> Turn:
        """Re-read the record from the store (a database blink is waited out, up to ``BLINK_WINDOW`` s)."""
        self._record = await self._load()
        return self

    async def _load(self) -> TurnRecord:
        return await patiently(lambda: self._tk.store.load_turn(self.id), what=f"return turn {self.id}")

    async def result(self, *, timeout: float | None = None) -> Turn:
        """Wait until the turn is finished (completed, failed or cancelled), then return it refreshed.

        Works for any turn id, from any process. It waits on the turn's workflow; a queued turn has none yet (its
        lane starts it when the turns before it are done), so it first waits on the lane's ``turn_started`` update,
        which returns when the lane starts it: nothing polls. A submitted turn that its lane does not hold (its
        submission was lost) is submitted to the lane again, once. Only a turn no lane will start (prepared and not
        submitted, or a sub-agent's before its parent starts it) is looked for in the store with a backoff. A restart
        of the Temporal server is waited out (bounded by ``timeout``), and so is a database blink (up to
        ``BLINK_WINDOW`` s). The record returned is always terminal: a turn workflow that closed without a terminal
        record (terminated, timed out) is recorded ``failed`` here.
        """
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise errors.InputError(f"timeout must be a non-negative number of seconds, not {timeout!r}")
        handle = self._tk.client.get_workflow_handle(self.id)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        delay = 0.02
        resubmitted = False
        while True:
            closed: str | None = None  # how the workflow ended, once it has
            missing = False  # no workflow yet
            # Bounded by the caller's timeout while the turn runs too (issue 8 item 13), not only while queued.
            remaining = None if deadline is None else max(deadline - loop.time(), 0.0)
            try:
                try:
                    await asyncio.wait_for(handle.result(), remaining)
                except TimeoutError:
                    return await self._timed_out(timeout)
                closed = "turn workflow ended without a terminal status"
            except WorkflowFailureError as err:
                closed = ended_reason(err.cause)  # terminated, timed out...: the record tells what is known
            except RPCError as err:
                # Not found: still queued. Server away: the client reconnects; the store tells meanwhile.
                if err.status != RPCStatusCode.NOT_FOUND and err.status not in SERVER_AWAY:
                    raise errors.Error(f"waiting for turn {self.id} failed: {err.message}") from err
                missing = err.status == RPCStatusCode.NOT_FOUND
            record = await self._load()  # raises RecordNotFound for an unknown id
            if record.terminal:
                self._record = record  # the record just read is the answer: no second read
                return self
            if closed is not None:
                tk = self._tk
                await fail_unfinished_turn(tk.store, tk.client, tk.task_queue, self.id, closed)
                break
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(f"turn {self.id} did not finish within {timeout} s")
            if missing and record.parent_turn_id is None and record.submitted_at is not None:
                remaining = None if deadline is None else max(deadline - loop.time(), 0.0)
                try:
                    async with asyncio.timeout(remaining):
                        answer = await until_started(self._tk.client, record)
                        if answer == "unknown" and not resubmitted:
                            resubmitted = True  # its submission was lost: the lane queues it in its place
                            with suppress(WorkflowUpdateFailedError, RPCError):
                                await resubmit(self._tk.client, record, self._tk.task_queue)
                            continue
                except TimeoutError:
                    return await self._timed_out(timeout)
                if answer == "started":
                    continue
                if answer == "again":
                    # The lane is continuing as new: its next run answers once it has started, a moment later.
                    await asyncio.sleep(_ROLLOVER_PAUSE)
                    continue
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
        return await self.refresh()

    async def _timed_out(self, timeout: float | None) -> Turn:
        """The caller's ``timeout`` passed: the turn if it has finished meanwhile (``timeout=0`` on a finished turn),
        else ``TimeoutError``."""
        if (record := await self._load()).terminal:
            self._record = record
            return self
        raise TimeoutError(f"turn {self.id} did not finish within {timeout} s") from None

    # Human controls (behaviour §5.9, §5.10) ------------------------------------------------------------------------

    async def pause(self, *, descendants: str = "retain", principal: Any = None) -> Turn:
        """Pause at the next control boundary (at once when not running); progress is kept. Only resume unpauses."""
        await self._control("pause", descendants, principal, apply_pause)
        return await self.refresh()

    async def resume(self, *, descendants: str = "retain", principal: Any = None) -> Turn:
        """Withdraw a pause; a paused turn goes on from where it stopped. Safe to repeat."""
        selected = await self._control("resume", descendants, principal, apply_resume)
        for turn in selected:
            await _signal(self._tk, turn.id, "resume")
        return await self.refresh()

    async def steer(
        self, text: str, *, key: str, principal: Any = None, descendants: str = "retain"
    ) -> list[dict[str, Any]]:
        """Queue human input, applied at the next control boundary (stale proposals are superseded).

        Returns one receipt per steered turn: ``{id, key, text, principal, turn_id, sequence}``, later with
        ``message_id`` and then ``request_id`` (read them with :meth:`control_state`). Idempotent by ``key``.
        """
        check_key("key", key)
        check_text("text", text)
        check_json("principal", principal, lenient=True)
        receipts: list[dict[str, Any]] = []

        async def steer_one(tx: StoreTx, turn: TurnRecord) -> TurnRecord:
            receipt = await apply_steer(tx, turn, text=text, key=key, principal=principal, target=turn.id == self.id)
            if receipt is not None:
                receipts.append(receipt)
            return turn

        await self._control("steer", descendants, principal, steer_one, skip_finished=False)
        return receipts

    async def cancel(self, *, descendants: str = "retain", principal: Any = None) -> Turn:
        """End the turn ``cancelled`` (and its descendants, when cascading); running calls are cancelled.

        One durable request (docs/design.md, "No side doors"): a workflow on a worker authorises and writes the
        cancel, then cancels the turns' workflows and tells their callbacks, waiters and lanes. A caller that dies
        after asking leaves all of it done, one that dies before leaves none of it."""
        if descendants not in ("retain", "cascade"):
            raise ValueError(f"descendants must be 'retain' or 'cascade', not {descendants!r}")
        check_json("principal", principal, lenient=True)
        await self._tk.store.load_turn(self.id)  # RecordNotFound for an unknown id, before anything is started
        await request_cancel(self._tk, self.id, descendants, principal)
        return await self.refresh()

    async def wait_for(self, *targets: Turn | str) -> Turn:
        """Make this not-yet-started turn wait for other turns; their results become its input (behaviour §5.5).

        Only a turn that has not started can wait (submit it with ``paused=True`` to attach waits before it can
        run, or pass ``wait_for=`` to ``ask``). TurnKit's rules apply (no self, only submitted targets, no unfinished
        work in its own conversation, no cycles); a rejected call writes no edge. The hook is asked ``wait`` for the
        turn's own principal (the one it was asked with), as for ``ask(wait_for=…)`` and the ``wait_for`` tool.
        """
        target_ids = [check_id("targets", t.id if isinstance(t, Turn) else t, "turn") for t in targets]
        record = await self._tk.store.load_turn(self.id)
        await authorize("wait", record.options.principal, turn=self.id, targets=target_ids)
        async with self._tk.store.atomic(turn_id=record.root_turn_id, wait_graph=True) as tx:
            record = await tx.load_turn(self.id)
            if record.status not in ("pending", "paused") or record.options.state.phase is not None:
                raise errors.Error("only pending turns can wait")
            waited = await add_waits(tx, record, target_ids)
            await enter_waiting(tx, record.id, [t.id for t in waited if not t.terminal])
        return await self.refresh()

    async def control_state(self, *, principal: Any = None) -> dict[str, Any]:
        """``{"status", "controls"}``: the pause request and every steering receipt."""
        record = await self._tk.store.load_turn(self.id)
        await authorize("read_control", principal, turn=record)
        controls = controls_of(record)
        receipts = [steering.receipt() for steering in controls.inputs]
        return {"status": record.status, "controls": {"pause_requested": controls.pause_requested, "inputs": receipts}}

    async def _control(
        self,
        action: Action,
        descendants: str,
        principal: Any,
        apply: Callable[[StoreTx, TurnRecord], Awaitable[TurnRecord]],
        *,
        skip_finished: bool = True,
    ) -> list[TurnRecord]:
        return await write_control(
            self._tk.store, self.id, action, descendants, principal, apply, skip_finished=skip_finished
        )

    async def stream(self, *, principal: Any = None, poll: float = POLL_INTERVAL) -> AsyncIterator[TurnStreamEvent]:
        """The turn's events as it runs, until it ends (:mod:`turnkit.streaming`)::

            async for event in turn.stream():
                if isinstance(event, turnkit.TextDelta):
                    print(event.text, end="", flush=True)

        Live: the model's text and thinking deltas (:class:`~turnkit.streaming.TextDelta`,
        :class:`~turnkit.streaming.ThinkingDelta`) and :class:`~turnkit.streaming.Restart` when a model call is
        retried after streaming part of its answer (drop what that call streamed before). Committed, read from the
        store (every ``poll`` seconds, and at once when a model response was written): sub-agent turns as they start,
        tool calls as they start and finish (the sub-agents' too), and last :class:`~turnkit.streaming.TurnEnded` with
        the answer the store recorded. A turn that already ended gives its ``TurnEnded`` at once.

        Live deltas reach this process from a worker anywhere when the store is PostgreSQL (``LISTEN/NOTIFY``); on
        SQLite only from a worker in this process, and a turn run elsewhere streams its committed events only.
        Asked as ``read_messages`` (behaviour §7.3).
        """
        await self._authorize_read(principal)
        async for event in stream_turn(self._tk.store, self.id, poll=poll):
            yield event

    async def tool_executions(self, *, principal: Any = None) -> list[ToolExecutionRecord]:
        """This turn's tool executions, in creation order; asked as ``read_messages`` (behaviour §7.3)."""
        await self._authorize_read(principal)
        return await self._tk.store.list_tool_executions(turn_id=self.id)

    async def messages(self, *, principal: Any = None) -> list[MessageRecord]:
        """The messages this turn wrote (assistant, tool results), in sequence order; asked as ``read_messages``
        (behaviour §7.3)."""
        await self._authorize_read(principal)
        async with self._tk.store.atomic() as tx:
            return await tx.list_turn_messages(self.id)

    async def _authorize_read(self, principal: Any) -> None:
        """Ask ``read_messages`` for this turn's conversation (``turn``: the record)."""
        if settings.authorize is None:
            return  # nobody to ask: no store read for the question
        record = self._record or await self._load()  # a turn never changes conversation: a held record will do
        await authorize("read_messages", principal, destination_conversation=record.conversation_id, turn=record)

    def __repr__(self) -> str:
        status = self._record.status if self._record else "?"
        return f"<Turn {self.id} {status}>"


async def _signal(tk: TurnKit, workflow_id: str, signal: str) -> None:
    with suppress(RPCError):  # no workflow yet (queued) or already closed: the store is what counts
        await tk.client.get_workflow_handle(workflow_id).signal(signal)


async def _while_server_away(call: Callable[[], Awaitable[None]], what: str) -> None:
    """Run ``call``, repeating it while the Temporal server is away (up to ``SUBMIT_RECONNECT_WINDOW`` seconds); any
    other RPC failure, or one that outlasts the window, is raised as a TurnKit error that names ``what``."""
    try:
        await while_server_away(
            call, window=SUBMIT_RECONNECT_WINDOW, retry_if=lambda err: _UPDATE_ABORTED in err.message
        )
    except RPCError as err:
        raise errors.Error(f"{what} failed: {err.message}{registration_hint(err.message)}") from err


def _turnkit_error(cause: BaseException | None) -> Exception:
    """Map a failure reported by the lane back to the TurnKit error it started as."""
    if isinstance(cause, ApplicationError):
        cls = getattr(errors, (cause.type or "").removeprefix("TurnKit::"), None)
        if isinstance(cls, type) and issubclass(cls, errors.Error):
            return cls(cause.message)
        return errors.Error(cause.message)
    return errors.Error(str(cause))
