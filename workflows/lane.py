"""``ConversationWorkflow``: the conversation's serial lane (workflow id = conversation id).

At most one turn of a conversation is active; submitted turns wait in FIFO order, and each runs as a workflow of its
own (workflow id = turn id), started through ``turnkit.start_turn``: a local activity whose eager start hands the
turn's first workflow task straight to this worker. The lane looks for the turn's end only when it has more to run:
then ``turnkit.follow_turn`` registers the lane as the turn's waiter, and the turn's end signals it
``target_finished`` (the store is asked again after ``FOLLOW_POLL`` without one). Two kinds of input arrive:

* ``submit`` (an update, used with update-with-start): writes the trigger message and the turn record through an
  activity and returns the turn id at once; the turn is queued.
* ``deliver`` (a signal, used with signal-with-start): a delivery row exists in the store. When the lane is idle
  (no active and no queued turn) it appends every buffered delivery to the transcript (exactly once: the store's
  compare-and-set decides) and *wakes*: a new turn consumes them all (behaviour §5.11). Input reaching a busy lane is
  buffered, so it lands in the transcript after the active turn's messages: the next turn's model sees the
  conversation in the order it happened, with the new input last.

The lane continues-as-new when idle, and also while a turn runs when its history is long: the turn is a workflow of
its own, so it outlives the run, and the new run follows it to its end (it registers as a waiter of the turn through
``turnkit.follow_turn``). Everything a run carries over is one object, its :class:`LaneInput` (``self._state``): the
queue, pending deliveries, bounded dedupe windows, the hold, the turn it follows. A turn workflow that ends without a
terminal record (terminated, timed out) is recorded ``failed`` by ``turnkit.follow_turn`` before the next turn starts.
A held lane (a sub-agent's turn runs here) is released only by the store's answer: ``deliver`` and ``wake`` make it
ask again.

Seeing it run: the lane's current details say what runs and what waits; a lane started with TurnKit's search
attributes starts its turns with theirs (see :mod:`turnkit.kernel.search_attributes`).
"""

from __future__ import annotations

import asyncio
import functools
from contextlib import suppress
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.exceptions import TimeoutError as ActivityTimeoutError

from turnkit._workflows.store_calls import store_call
from turnkit.kernel.activities import DeliveryCalls, LaneCalls, TurnCalls
from turnkit.kernel.metrics import lane_queued
from turnkit.kernel.names import (
    DELIVER_SIGNAL,
    LANE_ROLLING_OVER,
    LANE_STATUS_QUERY,
    LANE_WORKFLOW,
    SUBMIT_UPDATE,
    TARGET_FINISHED_SIGNAL,
    TURN_STARTED_UPDATE,
    WAKE_SIGNAL,
)
from turnkit.kernel.payloads import (
    DeliverBatch,
    DeliverySignal,
    EndTurn,
    LaneInput,
    LaneStatus,
    QueuedTurn,
    StartTurn,
    SubmitTurn,
    TurnTicket,
)
from turnkit.kernel.search_attributes import AGENT, has_turnkit_attributes

__all__ = ["RECENT_WINDOW", "ConversationWorkflow"]

#: How many recent submissions and deliveries the lane remembers to recognise repeats across continue-as-new.
RECENT_WINDOW = 256
#: Following a turn: its end signals the lane (`target_finished`); the store is asked again after this long anyway (a
#: workflow that closed without a terminal record signals nothing).
FOLLOW_POLL = timedelta(minutes=1)
#: How long a submission may keep retrying a store that is away before the update is rejected: the lane's write lock
#: is never held across an unbounded retry.
SUBMIT_TIMEOUT = timedelta(seconds=60)


@workflow.defn(name=LANE_WORKFLOW)
class ConversationWorkflow:
    """The lane: FIFO, one active turn, deliveries applied as they come, idle continue-as-new."""

    @workflow.init
    def __init__(self, lane: LaneInput) -> None:
        # Handlers can run before run() (update/signal-with-start, after continue-as-new): all state is set up here.
        # What a run carries to the next is this one object, kept current in place.
        self._state = lane
        # The active turn's workflow has started (only then may the lane roll over while busy: it outlives the run).
        self._active_started = False
        # A nudge arrived: a held lane asks the store whether the sub-agent's turn is still active.
        self._recheck = False
        # The followed (carried) turn signalled its end.
        self._followed_ended = False
        # Turns whose end was signalled (`target_finished`), most recent last: the turn this lane started is over
        # once its id is here (a late signal of an earlier turn names another id).
        self._ended_turns: list[str] = []
        # The active turn was started and nothing needs its end yet.
        self._on_demand = False
        # Store writes of the lane happen one at a time, so queue order = creation order = message order.
        self._writing = asyncio.Lock()
        # Start turns with search attributes and add the agent's (set when run() starts).
        self._search = False
        # The history length of the workflow task in which a submit last completed (None: none in this run).
        self._submitted_in: int | None = None
        # This run is about to continue as new: `turn_started` updates waiting here answer "again".
        self._rolling_over = False

    # Messages -------------------------------------------------------------------------------------------------------

    @workflow.update(name=SUBMIT_UPDATE)
    async def submit(self, request: SubmitTurn) -> TurnTicket:
        """Append the trigger message, create the pending turn and queue it; returns its ids at once."""
        async with self._writing:
            try:
                ticket = await store_call(
                    TurnCalls.submit_turn,
                    self._knowing(request),
                    summary="submit turn",
                    schedule_to_close=SUBMIT_TIMEOUT,
                )
            except ActivityError as err:
                # Reject the update (the caller gets the error); never fail the lane's workflow task.
                cause = err.cause
                if err.retry_state == RetryState.TIMEOUT or isinstance(cause, ActivityTimeoutError):
                    # Retried until the bound (the store is away): say so, not the last attempt's driver error.
                    message = f"the store did not accept the turn within {SUBMIT_TIMEOUT.total_seconds():.0f} s"
                    raise ApplicationError(message, type="TurnKit::StoreError", non_retryable=True) from err
                if isinstance(cause, ApplicationError):
                    raise ApplicationError(cause.message, type=cause.type, non_retryable=True) from err
                raise ApplicationError(str(cause or err), type="Error", non_retryable=True) from err
            if ticket.busy:
                # A sub-agent's turn runs here: its end (`wake`) lets the queue go on. A wake that came meanwhile
                # asked for a re-check, which runs after this handler releases the write lock.
                self._state.held = True
            # Completed in this workflow task: the lane does not continue as new in it (see _before_rollover).
            self._submitted_in = workflow.info().get_current_history_length()
            self._run_ahead(ticket.ahead)
            self._queue_lost(ticket.earlier)
            if ticket.turn_id not in self._state.recent_turn_ids:  # a retried submit is not queued twice
                self._state.queue.append(ticket.queued())
                _remember(self._state.recent_turn_ids, ticket.turn_id)
                lane_queued(workflow.metric_meter(), len(self._state.queue))  # not again on replay
            self._show()
            return ticket

    @submit.validator
    def _validate_submit(self, request: SubmitTurn) -> None:
        if request.conversation_id != self._state.conversation_id:
            raise ApplicationError(
                f"turn submitted to conversation {request.conversation_id} reached lane {self._state.conversation_id}",
                type="InvalidSubmission",
            )

    @workflow.update(name=TURN_STARTED_UPDATE)
    async def turn_started(self, turn_id: str) -> str:
        """Return once this lane has started ``turn_id``'s workflow: ``Turn.result()`` of a queued turn waits here
        instead of polling the store. ``started``: it was queued or active here and its workflow exists now;
        ``unknown``: this lane never queued it (as far as its window of recent turns goes: a lost submission);
        ``again``: this run is continuing as new, ask the next run (a waiting update must not hold the rollover)."""
        async with self._writing:
            pass  # a submission in flight lands first: a turn submitted a moment ago is queued by then
        await workflow.wait_condition(lambda: self._rolling_over or not self._holds(turn_id))
        if self._holds(turn_id):
            return "again"
        return "started" if turn_id in self._state.recent_turn_ids else "unknown"

    @turn_started.validator
    def _validate_turn_started(self, turn_id: str) -> None:
        # While this run rolls over, a waiter is told to ask the next run before its update is accepted: a rejected
        # update leaves no event, so waiters asking again and again cannot grow the history of a run that is ending.
        if self._rolling_over:
            raise ApplicationError("the lane is continuing as new: ask its next run", type=LANE_ROLLING_OVER)

    def _holds(self, turn_id: str) -> bool:
        """Whether ``turn_id`` is queued here, or is the active turn and its workflow is not started yet."""
        state = self._state
        if any(queued.turn_id == turn_id for queued in state.queue):
            return True
        return state.active is not None and state.active.turn_id == turn_id and not self._active_started

    @workflow.signal(name=DELIVER_SIGNAL)
    def deliver(self, signal: DeliverySignal) -> None:
        """A delivery row was created for this conversation: apply it (duplicates are dropped)."""
        # Also a nudge: a held lane asks the store again, so `turnkit reconcile` heals a `wake` that never came.
        self._recheck = True
        state = self._state
        if signal.delivery_id in state.recent_delivery_ids or signal.delivery_id in state.pending_delivery_ids:
            return
        state.pending_delivery_ids.append(signal.delivery_id)
        self._show()

    @workflow.signal(name=WAKE_SIGNAL)
    def wake(self) -> None:
        """A sub-agent's turn in this conversation ended: a held lane asks the store whether it may go on (never
        released by a signal alone)."""
        self._recheck = True

    @workflow.signal(name=TARGET_FINISHED_SIGNAL)
    def target_finished(self, turn_id: str) -> None:
        """A turn of this lane has ended: the one it follows (its wait row names this lane)."""
        self._followed_ended = True
        _remember(self._ended_turns, turn_id)

    @workflow.query(name=LANE_STATUS_QUERY)
    def status(self) -> LaneStatus:
        """What runs and what waits in this lane."""
        state = self._state
        return LaneStatus(
            conversation_id=state.conversation_id,
            active_turn_id=state.active.turn_id if state.active else None,
            queued_turn_ids=[queued.turn_id for queued in state.queue],
            pending_delivery_ids=list(state.pending_delivery_ids),
            turns_started=state.turns_started,
            run_history_events=workflow.info().get_current_history_length(),
        )

    # Main loop ------------------------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, lane: LaneInput) -> None:
        state = self._state
        # Only when the start carried TurnKit's attributes: then the namespace has them (never a wedge).
        self._search = has_turnkit_attributes(workflow.info().typed_search_attributes)
        if state.held:
            self._recheck = True  # a carried hold is re-checked once: its `wake` may have come to the old run
        turn: asyncio.Task[None] | None = None
        if state.active is not None:  # carried by continue-as-new while it ran
            turn = asyncio.create_task(self._follow_turn(state.active))
        while True:
            self._rolling_over = False  # a rollover that did not happen (more work came) releases no update
            self._show()
            await workflow.wait_condition(functools.partial(self._has_work, turn))
            if turn is not None and turn.done():
                turn = None
            self._show()
            if state.held and self._recheck:
                await self._recheck_hold()
                continue
            idle = turn is None and not state.queue
            if state.pending_delivery_ids and not state.held and idle:
                await self._apply_deliveries()
                continue
            if turn is not None:
                if self._busy_rollover_due():
                    await self._before_rollover()
                    if not turn.done():
                        workflow.continue_as_new(state)  # it carries the active turn: the next run follows it
                continue
            if state.queue and not state.held:
                turn = asyncio.create_task(self._run_turn(state.queue.pop(0)))
                continue
            if not self._should_continue_as_new():
                continue
            # Idle and due for a fresh run: let in-flight handlers land first, then roll over.
            await self._before_rollover()
            if (state.queue or state.pending_delivery_ids) and not state.held:
                continue
            workflow.continue_as_new(state)

    async def _before_rollover(self) -> None:
        """Wait until continuing as new is safe: every handler has finished, and no submit completed in this workflow
        task.

        A submit's store call is local, so its update is accepted and completed in the task that ran it. If that
        task also continued as new and the server then refused the task (an event arrived meanwhile, e.g. the
        turn's end: "unhandled command"), the update would be aborted although its turn row is committed. A task of
        its own for the rollover (a 1 ms timer) keeps every accepted submit in the history. ``turn_started`` updates
        waiting for a queued turn answer "again" and finish: the next run answers them.
        """
        self._rolling_over = True
        while True:
            await workflow.wait_condition(workflow.all_handlers_finished)
            if self._submitted_in != workflow.info().get_current_history_length():
                return
            await workflow.sleep(timedelta(milliseconds=1), summary="roll over in a task of its own")

    def _busy_rollover_due(self) -> bool:
        """Continue-as-new while a turn runs: only once its workflow started, so it outlives this run."""
        return self._active_started and self._should_continue_as_new()

    async def _recheck_hold(self) -> None:
        """Ask the store whether a sub-agent's turn is still active here; hold or release accordingly."""
        self._recheck = False  # a nudge during the check asks again
        async with self._writing:  # after a submit in flight: it may have set the hold from an older answer
            self._state.held = await store_call(
                LaneCalls.lane_held, self._state.conversation_id, summary="is a sub-agent turn active?"
            )

    async def _apply_deliveries(self) -> None:
        """Append the signalled deliveries (exactly once) and start a turn for the delivered input (the lane is
        idle)."""
        state = self._state
        batch = list(state.pending_delivery_ids)
        # The woken turn's id, chosen here so that every run of the call (a local attempt, its fallback activity, a
        # retried workflow task) finds the turn an earlier one committed.
        woken = f"turn_{workflow.uuid4().hex[:24]}"
        async with self._writing:
            result = await store_call(
                DeliveryCalls.deliver,
                DeliverBatch(
                    conversation_id=state.conversation_id,
                    delivery_ids=batch,
                    wake=True,
                    woken_turn_id=woken,
                    known_turn_id=self._known_turn_id(),
                ),
                summary=f"deliver {len(batch)} · wake",
            )
        if result.ahead is not None:
            self._run_ahead(result.ahead)  # the deliveries wait until it has ended: the loop runs it first
            return
        if result.busy:
            state.held = True  # a wake that came meanwhile asked for a re-check
            return
        for delivery_id in batch:
            state.pending_delivery_ids.remove(delivery_id)
            _remember(state.recent_delivery_ids, delivery_id)
        self._queue_lost(result.earlier)
        if result.turn is not None:
            state.queue.append(result.turn)
            _remember(state.recent_turn_ids, result.turn.turn_id)
            lane_queued(workflow.metric_meter(), len(state.queue))

    def _known_turn_id(self) -> str | None:
        """The newest turn this lane has queued: its store calls that queue a turn ask for the submitted turns after
        it (lost submissions, docs/design.md)."""
        recent = self._state.recent_turn_ids
        return recent[-1] if recent else None

    def _knowing(self, request: SubmitTurn) -> SubmitTurn:
        """``request`` with the newest turn this lane has queued (the activity's input: a replay matches commands by
        type and id, not by input, so histories recorded before it still replay)."""
        known = self._known_turn_id()
        return request if known is None else request.model_copy(update={"known_turn_id": known})

    def _queue_lost(self, earlier: list[QueuedTurn]) -> None:
        """Queue the submitted turns the store found that this lane does not know: their submission was lost with
        the workflow task that ran it (caller, worker and server down together). They are newer than every turn the
        lane knows, so the end of the queue is their place, before the turn being queued now."""
        state = self._state
        known = {queued.turn_id for queued in state.queue}
        if state.active is not None:
            known.add(state.active.turn_id)
        for queued in earlier:
            if queued.turn_id in known or queued.turn_id in state.recent_turn_ids:
                continue
            state.queue.append(queued)
            _remember(state.recent_turn_ids, queued.turn_id)

    def _run_ahead(self, ahead: QueuedTurn | None) -> None:
        """Run ``ahead`` before anything else: a turn ``ask`` started without this lane (a fresh conversation's first
        turn, docs/design.md) that is still active. The lane "starts" it (a no-op when its workflow runs, the start it
        missed when its client died first) and follows it to its end as it does its own."""
        if ahead is None or ahead.turn_id in self._state.recent_turn_ids:
            return
        self._state.queue.insert(0, ahead)
        _remember(self._state.recent_turn_ids, ahead.turn_id)

    async def _run_turn(self, queued: QueuedTurn) -> None:
        self._state.active = queued
        self._state.turns_started += 1
        self._show()
        if self._search and workflow.info().typed_search_attributes.get(AGENT) is None:
            # Started by a delivery, the lane had no agent yet.
            workflow.upsert_search_attributes([AGENT.value_set(queued.agent_name)])
        try:
            await self._start_turn(queued)
        finally:
            self._clear_active()

    async def _start_turn(self, queued: QueuedTurn) -> None:
        """Start the turn's workflow (a local activity: no task of the server's queues before its first model call)
        and wait for its end; without a signal for ``FOLLOW_POLL``, ask the store, which also records a turn whose
        workflow closed without a terminal record (terminated, timed out)."""
        start = StartTurn(turn=queued.turn_input(self._state.conversation_id), search_attributes=self._search)
        await store_call(LaneCalls.start_turn, start, summary=f"start {queued.turn_id}")
        self._active_started = True  # it outlives this run: the lane may continue as new and follow it
        turn_id = queued.turn_id
        # Nothing else to run: the turn's end is of no use yet, so nothing signals it and no timer runs. When more work
        # arrives, ask the store, which registers this lane as the turn's waiter (docs/design.md).
        self._on_demand = True
        self._show()
        await workflow.wait_condition(lambda: turn_id in self._ended_turns or self._needs_turn_end())
        self._on_demand = False
        self._show()
        if turn_id in self._ended_turns or await self._has_ended(turn_id):
            return
        while turn_id not in self._ended_turns:
            with suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: turn_id in self._ended_turns, timeout=FOLLOW_POLL, timeout_summary="ask the store again"
                )
            if turn_id in self._ended_turns or await self._has_ended(turn_id):
                return

    async def _has_ended(self, turn_id: str) -> bool:
        """Ask the store whether the turn has ended; if not, its end will signal this lane (``turnkit.follow_turn``)."""
        return await store_call(LaneCalls.follow_turn, EndTurn(turn_id=turn_id), summary=f"has {turn_id} ended?")

    async def _follow_turn(self, queued: QueuedTurn) -> None:
        """Follow a turn started by an earlier run of this lane (carried by continue-as-new) until it ends: ask the
        store, then wait for the turn's end signal (or a while) and ask again."""
        self._active_started = True
        self._show()
        try:
            while True:
                self._followed_ended = False  # a signal during the check asks again at once
                if await self._has_ended(queued.turn_id):
                    return
                with suppress(TimeoutError):
                    await workflow.wait_condition(
                        lambda: self._followed_ended, timeout=FOLLOW_POLL, timeout_summary="ask the store again"
                    )
        finally:
            self._clear_active()

    def _clear_active(self) -> None:
        self._on_demand = False
        self._state.active = None
        self._active_started = False

    def _show(self) -> None:
        """The current details shown in the UI: ``running turn_… · 2 queued · 1 delivery pending``."""
        state = self._state
        active = state.active.turn_id if state.active else None
        if active and self._on_demand:
            parts = [f"started {active} (followed when more work arrives)"]
        else:
            parts = [f"running {active}" if active else "idle"]
        if state.queue:
            parts.append(f"{len(state.queue)} queued")
        if state.pending_delivery_ids:
            count = len(state.pending_delivery_ids)
            parts.append(f"{count} {'delivery' if count == 1 else 'deliveries'} pending")
        if state.held:
            parts.append("held: a sub-agent's turn runs here")
        workflow.set_current_details(" · ".join(parts))

    def _has_work(self, turn: asyncio.Task[None] | None) -> bool:
        """What the main loop waits for: (idle) a queued turn, a delivery or a rollover, (held) a re-check, or (busy)
        the active turn finishing."""
        state = self._state
        if turn is None:
            work = bool(state.queue or state.pending_delivery_ids) and not state.held
            return work or (state.held and self._recheck) or self._should_continue_as_new()
        if turn.done():
            return True
        return (state.held and self._recheck) or self._busy_rollover_due()

    def _needs_turn_end(self) -> bool:
        """Whether the lane has something to do once its active turn ends: a queued turn, or deliveries waiting for it
        to be idle. (A rollover carries the turn: the next run follows it.)"""
        return bool(self._state.queue or self._state.pending_delivery_ids)

    def _should_continue_as_new(self) -> bool:
        info = workflow.info()
        return info.is_continue_as_new_suggested() or info.get_current_history_length() > self._state.max_history_events


def _remember(window: list[str], key: str) -> None:
    """Add ``key`` to a bounded window of recent ids (oldest first)."""
    if key not in window:
        window.append(key)
    del window[:-RECENT_WINDOW]
