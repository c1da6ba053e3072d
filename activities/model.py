"""The ``turnkit.model`` activity: one model request of a turn, reserved, called and persisted.

Three steps (plus an optional compaction), short transactions and no lock held across a remote call:

1. **Reserve** (under the root turn's lock): if this ``request_id`` already has a persisted response, return it
   (a retry after commit never calls the model again); otherwise count the iteration against the root tree's
   ``max_iterations`` and record ``state.request_id``. Read the turn's frozen context and, when the prompt shows it
   (subject, live context), the conversation: the request is built from what the store held at reserve time.
2. **Call** the agent's client, heartbeating. First, when the history is long, **compact** it (behaviour §3.10): one
   summariser call, then in its own transaction a ``context_summary`` message keyed on the ``request_id`` (so a
   retry never writes a second one); the request is built from the compacted projection.
3. **Persist** (under the root turn's lock): usage, cost, the assistant message and the new phase, and, when the
   response has no tool calls, the turn's completion, all in one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any

from temporalio import activity

from turnkit._activities.failures import non_retryable as _non_retryable
from turnkit._activities.failures import provider_failure as _provider_failure
from turnkit._activities.notify import announce_terminal
from turnkit._activities.output_audit import (
    AnswerAudit,
    announce_step_end,
    audit_answer,
    publication,
    publish_answer,
)
from turnkit._activities.store_retry import retry_store
from turnkit._engine.authorization import Verdict
from turnkit._engine.budget import depth_denial, iteration_denial, spend_denial
from turnkit._engine.call_boundary import boundary_before_call
from turnkit._engine.call_ids import unique_call_ids
from turnkit._engine.charges import append_charged, charge_turn, spend_before_call, tree_spend_denial
from turnkit._engine.compaction import (
    EmptySummary,
    active_messages,
    compaction_policy,
    message_tokens,
    reaches_threshold,
    should_compact,
    summarise,
)
from turnkit._engine.compaction import logger as compaction_logger
from turnkit._engine.controls import control_boundary, stamp_request
from turnkit._engine.deliveries import callback_verdict, completion_delivery, turn_result
from turnkit._engine.dispatch import call_policy, warn_if_model_policy_differs
from turnkit._engine.ids import new_id
from turnkit._engine.live_publish import CallPublisher
from turnkit._engine.mcp_tools import record_mcp_tools
from turnkit._engine.request import build_model_request, needs_conversation
from turnkit._engine.transcripts import Transcript, Transcripts
from turnkit._engine.validation import storable_result
from turnkit._engine.waits import enter_waiting
from turnkit._temporal.heartbeats import heartbeating
from turnkit._temporal.tracing import model_call_span
from turnkit.agent import Agent, resolve_agent
from turnkit.config import settings
from turnkit.cost import Cost, cost_from_usage
from turnkit.events import announce, announce_message, client_events_for, emit, listening
from turnkit.kernel.activities import ModelCalls, implements
from turnkit.kernel.errors import (
    BudgetError,
    ConfigError,
    ModelError,
    OutputAudit,
    TransientModelError,
)
from turnkit.kernel.metrics import TOKEN_KINDS, activity_meter, model_call_committed
from turnkit.kernel.payloads import ModelCall, ModelStep, ToolCallRef, output_preview
from turnkit.kernel.records import (
    ACTIVE_TURN_STATUSES,
    UNPAUSED_TURN_STATUSES,
    WORKING_TURN_STATUSES,
    ConversationRecord,
    MessageRecord,
    TurnRecord,
)
from turnkit.kernel.turn_state import TurnState
from turnkit.media import with_media_data
from turnkit.model import ModelRequest, Result
from turnkit.store.live import transport_for
from turnkit.store.store import Look, Store, StoreTx, utcnow
from turnkit.streaming import streaming_to

__all__ = ["ModelActivities"]


class ModelActivities(ModelCalls):
    """Model activities bound to a store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        #: The conversations' transcripts this worker has read: a model call reads only what was appended since.
        self.transcripts = Transcripts()

    @implements(ModelCalls.model)
    async def model(self, call: ModelCall) -> ModelStep:
        """Reserve, call and persist one model request of ``call.turn_id`` (see the module docstring)."""
        info = activity.info()
        policy = info.retry_policy
        if not info.is_local:  # a local first attempt has one attempt and no heartbeat by design
            warn_if_model_policy_differs(
                _unless_capped(info.start_to_close_timeout, info.schedule_to_close_timeout),
                _unless_capped(info.heartbeat_timeout, info.schedule_to_close_timeout),
                policy.maximum_attempts + call.attempts_before if policy and policy.maximum_attempts else None,
            )
        # Store phases ride out a database outage inside the attempt: a retry would spend a model attempt (issue 8).
        reserved = await retry_store(lambda: self._reserve(call), what="model reserve")
        if isinstance(reserved, ModelStep):
            if reserved.outcome in (
                "completed",
                "failed",
            ):  # the attempt that committed this response may have died before signalling
                await self._announce(await retry_store(lambda: self.store.load_turn(call.turn_id), what="model"))
            return reserved
        turn, transcript, conversation, first_start = reserved
        messages = transcript.messages
        if first_start:
            await emit(
                "turn.started", turn.id, turn.conversation_id, store=self.store, status=turn.status, model=turn.model
            )
        try:
            agent = resolve_agent(turn.agent_name)
            client = agent.effective_client
        except ConfigError as err:
            raise _non_retryable(err) from err
        if agent.mcp_servers:  # the tools of its MCP servers, listed once per turn and recorded (turnkit.mcp)
            async with heartbeating():  # a server started per listing may take longer than a heartbeat
                turn = await record_mcp_tools(self.store, turn, agent)
        messages, denial, summarised = await self._auto_compact(
            call, turn, agent, messages, transcript.tokens, transcript=transcript
        )
        if denial is not None:
            return ModelStep(outcome="budget_exceeded", budget_error=denial)
        # The request's messages, made of what the transcript keeps (a pass over the turn's own messages only).
        replay = transcript.replay(messages)
        # The same builder as Turn.preview (turnkit._engine.request): a preview cannot drift from what is sent.
        request = await retry_store(
            lambda: build_model_request(
                self.store,
                turn,
                agent,
                messages,
                request_id=call.request_id,
                conversation=conversation,
                replayed=replay.messages,
            ),
            what="model request",
        )
        await emit(
            "model.requested",
            turn.id,
            turn.conversation_id,
            store=self.store,
            model=request.model,
            tool_names=request.tool_names,
            message_count=len(request.messages),
            prompt=_prompt_report(request, message_chars=replay.chars),
        )
        # Media bytes are read here, for the provider call only: they never enter a payload (turnkit.media).
        sent = await retry_store(
            lambda: with_media_data(self.store, request, has_media=replay.media), what="model media"
        )
        # A pause, steering or cancel that landed while the request was built (the history compacted, MCP tools
        # listed, media read, application callbacks run) stops it here, before the model is paid (behaviour §5.10).
        # Without any of those, the reservation's own boundary ran a moment ago and one more read would find the
        # same: a turn's common call skips it.
        slow = summarised or bool(agent.mcp_servers) or sent is not request or listening(turn.id)
        late = None
        if slow:
            late = await retry_store(
                lambda: boundary_before_call(self.store, call.turn_id, call.root_turn_id), what="model boundary"
            )
        if late is not None:
            return ModelStep(outcome=late)
        asked = utcnow()  # when the provider was asked: the call's bar on `turnkit show --html`
        # The call streams its deltas to the turn's watchers (turnkit.streaming); its response is persisted below as
        # it always was, whatever was streamed.
        publisher = _publisher(self.store, turn, call, info.attempt)
        with model_call_span(turn, request.model) as traced:  # the span `chat {model}` when tracing is on
            try:
                async with heartbeating(), publisher or nullcontext():
                    with streaming_to(publisher), client_events_for(turn.id, turn.conversation_id, self.store):
                        result = await client.chat(sent)
            except (ModelError, ConfigError, TransientModelError) as err:
                raise _provider_failure(err) from err
            traced(result)
        result = storable_result(result)  # NUL, lone surrogates, NaN: made storable, never a failed write
        audit = None
        if not result.has_tool_calls and not call.audit_apart:
            # A final answer of an older workflow, audited here before it is published (behaviour §3.9); a workflow
            # that audits apart gets the answer committed first, then its audit (turnkit.audit).
            try:
                audit = await audit_answer(turn, agent, result, call.request_id, messages, store=self.store)
            except (ModelError, ConfigError, TransientModelError) as err:
                raise _provider_failure(err) from err
        ended: list[TurnRecord] = []  # the terminal record, when this attempt's write ended the turn
        step = await self._persist(call, turn, request.model, result, audit, ended, asked)
        if publisher is not None and publisher.published:  # watchers read the response now, not at their next poll
            publisher.committed()
            await publisher.flush()
        if step.outcome in ("completed", "failed"):
            await self._announce(ended[-1] if ended else turn)  # terminal: its waiters are listed without a re-read
        return step

    async def _announce(self, turn: TurnRecord) -> None:
        """Signal the completed turn's callback, waiters and lane (reads the store, so it rides out an outage)."""
        await retry_store(lambda: announce_terminal(self.store, turn), what="model announce")

    async def _auto_compact(
        self,
        call: ModelCall,
        turn: TurnRecord,
        agent: Agent,
        messages: list[MessageRecord],
        tokens: Callable[[MessageRecord], int] = message_tokens,
        *,
        transcript: Transcript | None = None,
    ) -> tuple[list[MessageRecord], str | None, bool]:
        """Automatic compaction as a model phase starts (behaviour §3.10); returns the messages, a budget denial
        and whether the summariser was asked (that call takes time: the control boundary runs again after it).

        At most one summary per ``request_id``: a retried attempt finds the summary it already wrote among the
        turn's messages and does not call the compaction model again; an attempt that read the history before a
        concurrent attempt committed its summary finds it in the write transaction and uses it instead of writing a
        second one. Failures other than budget errors are logged and swallowed: the turn goes on uncompacted.
        """
        force = turn.options.compact
        policy = compaction_policy(settings.compaction, agent.compaction)
        # Without any summary among the messages (``transcript``'s, as read), there is none for this request, and
        # the projection is the messages themselves: their estimate is the transcript's running sum, not a pass over
        # every message again (a long conversation's calls would grow by it).
        plain = transcript is not None and messages is transcript.messages and not transcript.has_summary()
        if policy is None or force is False or (not plain and _summary_for(messages, call.request_id) is not None):
            return messages, None, False
        if call.request_id in turn.state.empty_summaries:
            return messages, None, False  # asked once for this request, answered empty and charged: not asked again
        if not force:
            if plain and transcript is not None:
                due = reaches_threshold(policy, transcript.total_tokens())
            else:
                due = should_compact(policy, active_messages(messages), tokens)
            if not due:
                return messages, None, False
        # The summary is a paid call: asked only while the tree is within max_spend (behaviour §6.2).
        denial = await retry_store(lambda: spend_before_call(self.store, turn), what="compaction budget")
        if denial is not None:
            return messages, denial, False

        async def requested(request: ModelRequest) -> None:
            await emit(
                "compaction.model.requested",
                turn.id,
                turn.conversation_id,
                store=self.store,
                model=request.model,
                tool_names=[],
                message_count=len(request.messages),
                prompt=_prompt_report(request),
            )

        try:
            async with heartbeating():
                made = await summarise(
                    messages,
                    policy,
                    agent,
                    auto=True,
                    fallback_model=turn.model,
                    turn_id=turn.id,
                    request_id=call.request_id,
                    metadata={
                        "turn_id": turn.id,
                        "conversation_id": turn.conversation_id,
                        "request_id": call.request_id,
                    },
                    on_request=requested,
                )
        except BudgetError:
            raise
        except EmptySummary as err:  # answered, so paid: charged once, and the turn goes on uncompacted
            compaction_logger.warning("automatic compaction failed for turn %s: %s", turn.id, err)
            return messages, await self._charge_empty_summary(call, turn, err.result), True
        except Exception as err:  # behaviour §3.10: automatic compaction never fails the turn
            compaction_logger.warning("automatic compaction failed for turn %s: %s", turn.id, err)
            return messages, None, True
        if made is None:
            return messages, None, True
        cost = cost_from_usage(made.result.usage, made.model)

        async def write() -> tuple[MessageRecord | None, bool, str | None]:
            async with self.store.atomic(turn_id=call.root_turn_id) as tx:
                current = await tx.load_turn(turn.id)
                if current.status != "running":
                    return None, False, None  # cancelled or finished meanwhile: the next step notices
                summary = await tx.find_response(turn.id, call.request_id, kind="context_summary")
                if summary is not None:
                    return summary, False, None
                summary = await tx.append_message(
                    turn.conversation_id,
                    role="assistant",
                    kind="context_summary",
                    text=made.text,
                    turn_id=turn.id,
                    metadata=made.metadata,
                    request_id=call.request_id,  # indexed: a concurrent attempt finds it with one read
                )
                announce_message(tx, summary)
                charged = await charge_turn(tx, current, made.result.usage, cost)
                return summary, True, await tree_spend_denial(tx, charged)

        summary, written, denial = await retry_store(write, what="compaction persist")
        if summary is None:
            return messages, None, True
        if written:
            await emit(
                "compaction.model.completed",
                turn.id,
                turn.conversation_id,
                store=self.store,
                model=made.model,
                tool_call_count=0,
                usage=made.result.usage.to_record(),
                cost=cost.total,
            )
        return [*messages, summary], denial, True

    async def _charge_empty_summary(self, call: ModelCall, turn: TurnRecord, result: Result) -> str | None:
        """Charge a compaction call answered with no summary (keyed by the request id, so once); the tree's spend
        verdict after it."""
        cost = cost_from_usage(result.usage, result.model)

        async def write() -> str | None:
            async with self.store.atomic(turn_id=call.root_turn_id) as tx:
                current = await tx.load_turn(turn.id)
                if current.status != "running" or call.request_id in current.state.empty_summaries:
                    return None
                empty = [*current.state.empty_summaries, call.request_id]
                options = current.options.with_state(current.state.model_copy(update={"empty_summaries": empty}))
                return await tree_spend_denial(tx, await charge_turn(tx, current, result.usage, cost, options=options))

        return await retry_store(write, what="compaction charge")

    async def _reserve(
        self, call: ModelCall
    ) -> ModelStep | tuple[TurnRecord, Transcript, ConversationRecord | None, bool]:
        """Reserve the request (see the module docstring); with what its prompt is built from, read in the same
        transaction: the turn's messages and, when the prompt shows it, the conversation (one store trip, issue 9)."""
        publish = await self._publish_verdict(call)
        # The response to this request is looked for with the turn's lock, in one statement (Look).
        look = Look.response(call.turn_id, call.request_id)
        async with self.store.atomic(turn_id=call.root_turn_id, look=look) as tx:
            turn = await tx.load_turn(call.turn_id)
            committed = await _committed_step(tx, turn, call.request_id)
            if committed is not None:
                return committed
            if turn.status not in ACTIVE_TURN_STATUSES:
                return ModelStep(outcome="stopped")
            before = turn.options.state
            if before.request_id != call.request_id and before.phase is None and not before.wait_input:
                # The turn's input comes first: the results of the turns it waits on, then any steering that arrived
                # meanwhile (the boundary below); steering first would set the phase and skip this join.
                waiting_on, turn = await _join_application_waits(tx, turn)
                if waiting_on:
                    await enter_waiting(tx, turn.id, waiting_on)
                    return ModelStep(outcome="waiting", waiting_on=waiting_on)
            boundary, turn = await control_boundary(tx, turn)
            if boundary == "paused":
                return ModelStep(outcome="paused")
            state = turn.state
            if state.holds_answer:
                # An answer held back at a pause, with no steering since: publish it without asking again.
                return await _publish_candidate(tx, turn, state, publish)
            if state.request_id != call.request_id:
                root = turn if turn.root_turn_id == turn.id else await tx.load_turn(turn.root_turn_id)
                usage = await tx.tree_usage(root.id)
                # Loop start (behaviour §6.2): depth, then the tree's observed spend (a child may have overspent
                # since this turn's last call), then the iteration this request would count.
                denial = (
                    depth_denial(root, turn.options.depth or 0)
                    or spend_denial(root, usage)
                    or iteration_denial(root, usage)
                )
                if denial is not None:
                    return ModelStep(outcome="budget_exceeded", budget_error=denial)
                state.waiting_on = None
                state.iterations += 1
                state.request_id = call.request_id
                state.phase = "model"
                stamped = stamp_request(turn, call.request_id)  # receipts: queued → message_id → request_id
                if stamped is not None:
                    turn = turn.model_copy(update={"options": turn.options.with_controls(stamped)})
            # Only what this worker has not read yet comes from the store (the transcript's prefix never changes).
            transcript = await self.transcripts.read(
                tx, turn.conversation_id, through_sequence=turn.context_message_sequence, turn_id=turn.id
            )
            # Behaviour §3.2: the first request that included each delivered message (for input_status).
            for message in transcript.delivered():  # the kept prefix's are known: no pass over every message
                delivery_id = message.metadata.get("delivery_id")
                if delivery_id and delivery_id not in state.delivery_requests:
                    state.delivery_requests[str(delivery_id)] = call.request_id
            now = utcnow()
            claimed = await tx.claim_turn(
                turn.id,
                from_=UNPAUSED_TURN_STATUSES,
                to="running",
                options=turn.options.with_state(state),
                started_at=turn.started_at or now,
                heartbeat_at=now,
            )
            if claimed is None:
                return ModelStep(outcome="stopped")
            conversation = await tx.load_conversation(claimed.conversation_id) if _prompt_reads(claimed) else None
            return claimed, transcript, conversation, turn.started_at is None

    async def _publish_verdict(self, call: ModelCall) -> Verdict:
        """The ``callback`` verdict for an answer held back at a pause, which ``_reserve`` may publish.

        Asked before ``_reserve``'s transaction (the hook never runs inside one); only read when a hook is set.
        """
        if settings.authorize is None:
            return Verdict("callback", True)
        turn = await self.store.load_turn(call.turn_id)
        if turn.options.state.holds_answer:
            return await callback_verdict(turn)
        return Verdict("callback", True)

    async def _persist(
        self,
        call: ModelCall,
        turn: TurnRecord,
        model: str,
        result: Result,
        audit: AnswerAudit | None,
        ended: list[TurnRecord],
        asked: datetime,
    ) -> ModelStep:
        """Write the response, then report it: ``model.completed`` (and ``turn.completed``) after the commit."""
        cost = cost_from_usage(result.usage, result.model or model)
        # What this one call was, kept with its response (the turn only sums its calls): `turnkit show --html` draws it.
        made = {"model": result.model or model, "usage": result.usage.to_record(), "cost": cost.total}
        made["requested_at"] = asked.isoformat()
        # A final answer's completion callback is authorised before the terminal write's transaction (behaviour §7.4):
        # a denial, or a hook that raises, is recorded with the answer and never rolls it back.
        verdict = await callback_verdict(turn) if not result.has_tool_calls else Verdict("callback", True)
        # The response is paid for: keep trying to record it for as long as the store is away (it is idempotent by
        # request id, so a commit whose acknowledgement was lost is found, not written twice).
        step, written = await retry_store(
            lambda: self._write_response(call, turn.conversation_id, result, cost, verdict, audit, ended, made),
            what="model persist",
        )
        if written:
            # Counted by the attempt that committed the call: never twice (kernel.metrics says what a retry does).
            model_call_committed(
                activity_meter(),
                agent=turn.agent_name,
                model=result.model or model,
                tokens={field: getattr(result.usage, field) for field in TOKEN_KINDS},
                cost=cost.total,
            )
            await emit(
                "model.completed",
                turn.id,
                turn.conversation_id,
                store=self.store,
                model=result.model or model,
                tool_call_count=len(step.tool_calls),
                usage=result.usage.to_record(),
                cost=cost.total,
            )
            await announce_step_end(turn, audit, step, result.text, store=self.store)
        return step

    async def _write_response(
        self,
        call: ModelCall,
        conversation_id: str,
        result: Result,
        cost: Cost,
        verdict: Verdict,
        audit: AnswerAudit | None = None,
        ended: list[TurnRecord] | None = None,
        made: dict[str, Any] | None = None,
    ) -> tuple[ModelStep, bool]:
        """Persist the assistant message, usage and cost (and a final answer); True when this attempt wrote them.

        A final answer's terminal record, as written, is put in ``ended`` (for the announcement after commit); an
        attempt retried after a failed commit starts it empty again. ``made`` (the call's model, usage, cost and
        start) is kept as the message's ``metadata["model_call"]``.
        """
        if ended is not None:
            ended.clear()
        # The response's append locks the turn's conversation: take it with the turn's lock, and look for a response
        # already committed to this request and for executions of the calls it proposes, in one round trip (a turn's
        # conversation never changes).
        look = Look.response(call.turn_id, call.request_id, call_ids=_proposed_call_ids(result.parts))
        async with self.store.atomic(turn_id=call.root_turn_id, conversation_id=conversation_id, look=look) as tx:
            turn = await tx.load_turn(call.turn_id)
            committed = await _committed_step(tx, turn, call.request_id)
            if committed is not None:
                return committed, False  # a zombie attempt committed first: theirs stands
            if turn.status != "running":
                return ModelStep(
                    outcome="stopped"
                ), False  # cancelled or finished meanwhile: the late answer is dropped
            state = turn.state
            if result.has_tool_calls:
                # Ids unique in the turn, or a repeated `call_0` would reuse the first call's execution (issue 8).
                result = result.model_copy(update={"parts": await _unique_call_ids(tx, turn.id, result.parts, state)})
            agent = resolve_agent(turn.agent_name)
            tool_calls = [
                ToolCallRef.carried(
                    tc.id,
                    tc.name,
                    tc.arguments_error,
                    call_policy(agent, tc.name, state.loaded_skills, state.mcp_tools),
                )
                for tc in result.tool_calls
            ]
            metadata: dict[str, Any] = {"request_id": call.request_id}
            if made is not None:
                metadata["model_call"] = made
            if result.output_data is not None and not tool_calls:
                metadata["output_data"] = result.output_data
            state.phase = "tools" if tool_calls else "output"
            state.message_id = new_id("message")  # the response's id, in the turn's state written with it
            audited_apart = call.audit_apart and not tool_calls and bool(agent.output_policy)
            if audited_apart:
                # Committed and charged before any check, judge or failure can come: the audit reads it from here.
                state.candidate, state.output_data = result.text, result.output_data
                state.awaiting_audit, state.audit_key, state.judge_answers = True, call.request_id, []
            # The response and the call's charge: one statement on PostgreSQL.
            message, turn = await append_charged(
                tx,
                turn,
                result.usage,
                cost,
                message={
                    "id": state.message_id,
                    "role": "assistant",
                    "kind": "tool_call" if tool_calls else "text",
                    "content": result.parts,
                    "turn_id": turn.id,
                    "metadata": metadata,
                    "request_id": call.request_id,  # indexed: a retry finds this response without listing the turn's
                },
                options=turn.options.with_state(state),
            )
            # Behaviour §3.7: message.created, then tool_call.created per proposed call, once this response committed.
            announce_message(tx, message)
            for ref in tool_calls:
                announce(tx, "tool_call.created", turn.id, turn.conversation_id, id=ref.id, name=ref.name)
            for judge in audit.charges if audit is not None else ():  # the audit's model calls are the turn's too
                turn = await charge_turn(tx, turn, judge.usage, judge.cost)
            denial = await tree_spend_denial(tx, turn)
            if denial is not None:
                over = ModelStep(
                    outcome="budget_exceeded", message_id=message.id, tool_calls=tool_calls, budget_error=denial
                )
                return over, True
            if audited_apart:
                return ModelStep(outcome="audit", message_id=message.id), True
            if not tool_calls:
                step = await publish_answer(
                    tx,
                    turn,
                    agent,
                    text=result.text,
                    output_data=result.output_data,
                    message_id=message.id,
                    verdict=verdict,
                    audit=audit,
                    ended=ended if ended is not None else [],
                )
                return step, True
        return ModelStep(outcome="tools", message_id=message.id, tool_calls=tool_calls), True


async def _committed_step(tx: StoreTx, turn: TurnRecord, request_id: str) -> ModelStep | None:
    """The step of a response already persisted for ``request_id``, if any (idempotent retries).

    One indexed lookup by ``(turn, request id)``, so a model call costs the same at every iteration (issue 9).
    """
    message = await tx.find_response(turn.id, request_id)
    if message is None:
        return None
    agent = resolve_agent(turn.agent_name)
    calls = [
        ToolCallRef.carried(
            str(part["id"]),
            str(part["name"]),
            part.get("arguments_error"),
            call_policy(agent, str(part["name"]), turn.state.loaded_skills, turn.state.mcp_tools),
        )
        for part in message.content
        if part.get("type") == "tool_call"
    ]
    # A retry returns what the first attempt did, a spend denial included (it is monotonic).
    awaiting = turn.status == "running" and turn.state.awaiting_audit and turn.state.audit_key == request_id
    denial = await tree_spend_denial(tx, turn) if (calls or awaiting) and turn.status == "running" else None
    if awaiting and denial is None:
        return ModelStep(outcome="audit", message_id=message.id)
    completed = not calls and turn.status == "completed"
    error = turn.error or {}
    if not calls and turn.status == "failed" and error.get("class") == OutputAudit.qualified_name:
        return ModelStep(
            outcome="failed", message_id=message.id, error_class=error["class"], error_message=error.get("message")
        )
    outcome = "budget_exceeded" if denial else "completed" if completed else "tools"
    preview = output_preview(turn.output_text) if outcome == "completed" else None
    return ModelStep(
        outcome=outcome, message_id=message.id, tool_calls=calls, budget_error=denial, output_preview=preview
    )


def _proposed_call_ids(parts: list[dict[str, Any]]) -> list[str]:
    """The ids of the tool calls among a response's ``parts``, as the model gave them (an empty one as ``""``)."""
    return [str(part.get("id") or "") for part in parts if part.get("type") == "tool_call"]


async def _unique_call_ids(
    tx: StoreTx, turn_id: str, parts: list[dict[str, Any]], state: TurnState
) -> list[dict[str, Any]]:
    """``parts`` with tool-call ids unique in the turn, found by indexed lookups of these ids only (issue 9).

    Every earlier call of the turn has its execution row by the time the model is asked again (a run, a failure, a
    budget denial, a skip or a steering repair each create one), so "taken" means "has an execution". Renamed calls
    get suffixes from ``state.call_id_suffix``, a per-turn counter, so that a model that says ``call_0`` every time
    costs one lookup per response, not one per earlier rename; a suffix that meets a provider's own id is skipped.
    """
    start = state.call_id_suffix
    taken = await tx.existing_call_ids(turn_id, _proposed_call_ids(parts))
    while True:
        renamed = unique_call_ids(parts, taken, start=start)
        new_ids = {str(new["id"]) for new, old in zip(renamed, parts, strict=True) if new.get("id") != old.get("id")}
        clashes = await tx.existing_call_ids(turn_id, new_ids)
        if not clashes:
            break
        taken |= clashes
    if new_ids:
        state.call_id_suffix = max(start, *(int(i.rsplit("_", 1)[1]) + 1 for i in new_ids))
    return renamed


async def _publish_candidate(tx: StoreTx, turn: TurnRecord, state: TurnState, verdict: Verdict) -> ModelStep:
    status, error = publication(resolve_agent(turn.agent_name), turn)  # the held answer's audit decides (§3.9)
    completed = await tx.claim_turn(
        turn.id,
        from_=WORKING_TURN_STATUSES,
        to=status,
        **({"error": error} if error else {}),
        output_text=state.candidate or "",
        output_data=state.output_data,
        started_at=turn.started_at or utcnow(),
        completed_at=utcnow(),
        claim_token=None,
    )
    if completed is None:
        return ModelStep(outcome="stopped")
    await completion_delivery(tx, completed, verdict)
    if error is not None:
        announce(tx, "turn.failed", turn.id, turn.conversation_id, error=error)
        return ModelStep(
            outcome="failed", message_id=state.message_id, error_class=error["class"], error_message=error["message"]
        )
    announce(tx, "turn.completed", turn.id, turn.conversation_id, status="completed", output_text=completed.output_text)
    return ModelStep(
        outcome="completed", message_id=state.message_id, output_preview=output_preview(completed.output_text)
    )


async def _join_application_waits(tx: StoreTx, turn: TurnRecord) -> tuple[list[str], TurnRecord]:
    """Behaviour §5.3 step 4: a turn with waits starts only once its targets finished, with their results as input.

    Returns the unfinished targets (the workflow waits for their signals), or [] after appending the
    ``{"wait_results": [...]}`` message and writing ``state.wait_input`` (in this transaction, so a pause or steering
    applied next cannot make a later request join again); with the turn as it now is.
    """
    edges = await tx.list_waits(turn_id=turn.id)
    if not edges:
        return [], turn
    targets = [await tx.load_turn(edge.target_turn_id) for edge in edges]
    unfinished = [target.id for target in targets if not target.terminal]
    if unfinished:
        return unfinished, turn
    text = json.dumps({"wait_results": [turn_result(target) for target in targets]}, sort_keys=True, default=str)
    announce_message(tx, await tx.append_message(turn.conversation_id, role="user", text=text, turn_id=turn.id))
    state = turn.state.model_copy(update={"wait_input": True})
    return [], await tx.update_turn(turn.id, options=turn.options.with_state(state))


def _prompt_reads(turn: TurnRecord) -> bool:
    """Whether the request of ``turn`` shows its conversation (see :func:`turnkit._engine.request.needs_conversation`).

    An unknown agent or prompt mode says no: the activity fails on it right after the reserve, as it always did.
    """
    try:
        return needs_conversation(turn, resolve_agent(turn.agent_name))
    except (ConfigError, ValueError):
        return False


def _summary_for(messages: list[MessageRecord], request_id: str) -> MessageRecord | None:
    """The automatic summary already written for ``request_id``, if any (idempotent retries)."""
    for message in messages:
        meta = message.metadata.get("compaction") if message.kind == "context_summary" else None
        if isinstance(meta, dict) and meta.get("request_id") == request_id:  # pyright: ignore[reportUnknownMemberType]
            return message
    return None


def _publisher(store: Store, turn: TurnRecord, call: ModelCall, attempt: int) -> CallPublisher | None:
    """The live publisher of this model call's deltas, or None when ``settings.stream_model_calls`` is off."""
    if not settings.stream_model_calls:
        return None
    return CallPublisher(
        transport_for(store),
        conversation_id=turn.conversation_id,
        turn_id=turn.id,
        call_id=call.request_id,
        attempt=attempt + call.attempts_before,  # a local first attempt counts: its retries start at 2
        root_turn_id=turn.root_turn_id if turn.parent_turn_id is not None else "",
    )


def _prompt_report(request: ModelRequest, *, message_chars: int | None = None) -> dict[str, Any]:
    """The size of what is sent: characters of instructions and messages, with the system prompt's report (hash,
    sections, stable/dynamic sizes, tool count) when the request has one (the ``model.requested`` report).
    ``message_chars``: the messages' characters, counted already (the transcript's running sum)."""
    instructions = len(request.instructions) + len(request.dynamic_instructions or "")
    messages = message_chars
    if messages is None:
        messages = sum(len(str(m.get("content") or "")) for m in request.messages)
    sizes = {"chars": instructions + messages, "instructions_chars": instructions, "message_chars": messages}
    return {**request.report, **sizes}


def _unless_capped(timeout: timedelta | None, schedule_to_close: timedelta | None) -> timedelta | None:
    """``timeout`` as the workflow scheduled it, or None when the server cut it to the schedule-to-close timeout (the
    time left to the turn's deadline, ``TurnWorkflow``'s cap): then what was asked for is not known here."""
    if timeout is not None and schedule_to_close is not None and timeout >= schedule_to_close:
        return None
    return timeout
