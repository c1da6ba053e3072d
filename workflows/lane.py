"""``ConversationWorkflow``: the conversation's serial lane (workflow id = conversation id).

At most one turn of a conversation is active; submitted turns wait in FIFO order, and each runs as a workflow of its
own (workflow id = turn id). Since patch ``lane-starts-turns`` the lane starts it through ``turnkit.start_turn``, a
local activity whose eager start hands the turn's first workflow task straight to this worker. Since patch
``lane-follows-on-demand`` it looks for the turn's end only when it has more to run: then ``turnkit.follow_turn``
registers the lane as the turn's waiter, and the turn's end signals it ``target_finished`` (the store is asked again
after ``FOLLOW_POLL`` without one). Runs before that patch were signalled at every turn's end; older runs still
started the turn as a child and waited for the child's result. Two kinds of input arrive:

* ``submit`` (an update, used with update-with-start): writes the trigger message and the turn record through an
  activity and returns the turn id at once; the turn is queued.
* ``deliver`` (a signal, used with signal-with-start): a delivery row exists in the store. When the lane is idle
  (no active and no queued turn) it appends every buffered delivery to the transcript (exactly once: the store's
  compare-and-set decides) and *wakes*: a new turn consumes them all (behaviour §5.11). Input reaching a busy lane is
  buffered, so it lands in the transcript after the active turn's messages: the next turn's model sees the
  conversation in the order it happened, with the new input last.

The lane continues-as-new when idle, carrying its queue, pending deliveries and bounded dedupe windows; and (patch
``lane-follows-turns``) also while a turn runs, when its history is long: turns are started with
``ParentClosePolicy.ABANDON`` so they outlive the run, and the new run follows the carried turn to its end (it
registers as a waiter of the turn through ``turnkit.follow_turn``, so the turn's end signals it). A turn workflow
that ends without a terminal record (terminated, timed out, failed) is recorded ``failed`` by the lane before the
next turn starts. A held lane (a sub-agent's turn runs here) is released only by the store's answer (patch
``lane-rechecks-hold``): ``deliver`` and ``wake`` make it ask again.

Seeing it run (issue 11): the lane's current details say what runs and what waits; a lane started with TurnKit's
search attributes starts its turns with theirs (patch ``search-attributes``, see :mod:`turnkit.search_attributes`).
"""

from __future__ import annotations

import asyncio
import functools
from contextlib import suppress
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, RetryState
from temporalio.exceptions import TimeoutError as ActivityTimeoutError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from turnkit.payloads import (
        PATCH_LEVEL,
        DeliverBatch,
        DeliverResult,
        DeliverySignal,
        EndTurn,
        LaneInput,
        LaneStatus,
        QueuedTurn,
        StartTurn,
        SubmitTurn,
        TurnInput,
        TurnOutcome,
        TurnTicket,
    )
    from turnkit.search_attributes import AGENT, has_turnkit_attributes, turn_search_attributes
    from turnkit.turn_end import ended_reason
    from turnkit.waits import TARGET_FINISHED_SIGNAL

from workflows.patches import Patches
from workflows.store_calls import LOCAL_STORE_CALLS, store_call
from workflows.turn import TurnWorkflow

__all__ = ["RECENT_WINDOW", "ConversationWorkflow"]

#: How many recent submissions and deliveries the lane remembers to recognise repeats across continue-as-new.
RECENT_WINDOW = 256
#: Patch: deliveries reaching a busy lane wait for it to be idle (older runs appended them at once).
DELIVER_WHEN_IDLE = "deliver-when-idle"
#: Patch (issue 8 item 5): turns outlive the lane's run (ABANDON), the lane continues-as-new while busy and follows the
#: carried turn, and a turn workflow that ended abnormally gets a terminal record.
LANE_FOLLOWS_TURNS = "lane-follows-turns"
#: Patch (issue 8 item 7): a nudge makes a held lane re-check the store; no signal releases the hold by itself.
LANE_RECHECKS_HOLD = "lane-rechecks-hold"
#: Following a carried turn: its end signals the lane (`target_finished`); the store is asked again after this long
#: anyway (a workflow that closed without a terminal record signals nothing).
FOLLOW_POLL = timedelta(minutes=1)
#: Patch (issue 9): the lane starts each turn as a workflow of its own from a local activity, eagerly, and follows it
#: by its end signal, instead of a child workflow: the child's start and its first workflow task each waited for the
#: server's rate-limited transfer queue on the way from ``ask`` to the first model call (docs/design.md).
LANE_STARTS_TURNS = "lane-starts-turns"
#: Patch: a submission gives up after SUBMIT_TIMEOUT (older runs retried it forever while holding the write lock).
BOUNDED_SUBMIT = "bounded-submit"
#: How long a submission may keep retrying a store that is away before the update is rejected (issue 8 item 1).
SUBMIT_TIMEOUT = timedelta(seconds=60)
#: Patch (issue 11): turns start with TurnKit's search attributes and the lane adds its agent when it lacks it; only
#: when the lane was started with them itself (see :mod:`turnkit.search_attributes`).
SEARCH_ATTRIBUTES = "search-attributes"
#: Patch (issue 9): the lane hears of its turn's end only when it has more to do (a queued turn, a delivery): then it
#: registers as a waiter of the turn (``turnkit.follow_turn``) and the end signals it. Before, every turn's terminal
#: write signalled its lane, a signal and a lane workflow task per turn that an idle lane did not need.
LANE_FOLLOWS_ON_DEMAND = "lane-follows-on-demand"
#: The patches each patch level added (workflows/patches.py): a run of level 1 takes all of the above unasked.
PATCH_LEVELS = {
    1: frozenset(
        {
            LANE_FOLLOWS_ON_DEMAND,
            DELIVER_WHEN_IDLE,
            LANE_FOLLOWS_TURNS,
            LANE_RECHECKS_HOLD,
            LANE_STARTS_TURNS,
            BOUNDED_SUBMIT,
            SEARCH_ATTRIBUTES,
            LOCAL_STORE_CALLS,
        }
    ),
}


@workflow.defn(name="ConversationWorkflow")
class ConversationWorkflow:
    """The lane: FIFO, one active turn, deliveries applied as they come, idle continue-as-new."""

    @workflow.init
    def __init__(self, lane: LaneInput) -> None:
        # Handlers can run before run() (update/signal-with-start, after continue-as-new): all state is set up here.
        self._conversation_id = lane.conversation_id
        self._patched = Patches(PATCH_LEVELS, lane.patch_level)
        self._queue: list[QueuedTurn] = list(lane.queue)
        self._recent_turns: dict[str, None] = dict.fromkeys(lane.recent_turn_ids)
        self._pending_deliveries: list[str] = list(lane.pending_delivery_ids)
        self._recent_deliveries: dict[str, None] = dict.fromkeys(lane.recent_delivery_ids)
        self._wake_pending = lane.wake_pending
        self._turns_started = lane.turns_started
        self._max_history_events = lane.max_history_events
        self._active: str | None = lane.active.turn_id if lane.active else None
        self._deliver_when_idle = True  # set from the patch marker when run() starts
        self._follows_turns = False  # set from the patch marker when run() starts
        # The active turn as queued (carried if the lane continues as new while it runs), and whether its workflow
        # has started (only then may the lane roll over: ABANDON applies to started children).
        self._active_turn: QueuedTurn | None = lane.active
        self._active_started = False
        # A nudge arrived: a held lane asks the store whether the sub-agent's turn is still active.
        self._recheck = False
        # The followed (carried) turn signalled its end.
        self._followed_ended = False
        # Turns whose end was signalled (`target_finished`), most recent last: the turn this lane started is over
        # once its id is here (a late signal of an earlier turn names another id).
        self._ended_turns: dict[str, None] = {}
        self._starts_turns = False  # set from the patch marker when run() starts
        # The active turn was started and nothing needs its end yet (patch ``lane-follows-on-demand``).
        self._on_demand = False
        # A sub-agent's turn (run by its parent, not by this lane) is active here: deliveries wait for its `wake`.
        self._held = lane.held
        self._wakes = 0
        # Store writes of the lane happen one at a time, so queue order = creation order = message order.
        self._writing = asyncio.Lock()
        # Start turns with search attributes and add the agent's (set when run() starts).
        self._search = False
        # The history length of the workflow task in which a submit last completed (None: none in this run).
        self._submitted_in: int | None = None

    # Messages -------------------------------------------------------------------------------------------------------

    @workflow.update(name="submit")
    async def submit(self, request: SubmitTurn) -> TurnTicket:
        """Append the trigger message, create the pending turn and queue it; returns its ids at once."""
        async with self._writing:
            wakes = self._wakes
            # Never hold the write lock across an unbounded retry: a failing submit releases it and is rejected.
            bounded = self._patched(BOUNDED_SUBMIT)
            try:
                ticket = await store_call(
                    "turnkit.submit_turn",
                    request,
                    TurnTicket,
                    summary="submit turn",
                    schedule_to_close=SUBMIT_TIMEOUT if bounded else None,
                    patched=self._patched,
                )
            except ActivityError as err:
                # Reject the update (the caller gets the error); never fail the lane's workflow task.
                cause = err.cause
                if bounded and (err.retry_state == RetryState.TIMEOUT or isinstance(cause, ActivityTimeoutError)):
                    # Retried until the bound (the store is away): say so, not the last attempt's driver error.
                    message = f"the store did not accept the turn within {SUBMIT_TIMEOUT.total_seconds():.0f} s"
                    raise ApplicationError(message, type="TurnKit::StoreError", non_retryable=True) from err
                if isinstance(cause, ApplicationError):
                    raise ApplicationError(cause.message, type=cause.type, non_retryable=True) from err
                raise ApplicationError(str(cause or err), type="Error", non_retryable=True) from err
            if ticket.busy and (self._wakes == wakes or self._patched(LANE_RECHECKS_HOLD)):
                # A sub-agent's turn runs here: its end (`wake`) lets the queue go on. A wake that came meanwhile
                # asked for a re-check (patched), which runs after this handler releases the write lock.
                self._held = True
            # Completed in this workflow task: the lane does not continue as new in it (see _before_rollover).
            self._submitted_in = workflow.info().get_current_history_length()
            self._run_ahead(ticket.ahead)
            if ticket.turn_id not in self._recent_turns:  # a retried submit is not queued twice
                self._queue.append(ticket.queued())
                _remember(self._recent_turns, ticket.turn_id)
            self._show()
            return ticket

    @submit.validator
    def _validate_submit(self, request: SubmitTurn) -> None:
        if request.conversation_id != self._conversation_id:
            raise ApplicationError(
                f"turn submitted to conversation {request.conversation_id} reached lane {self._conversation_id}",
                type="InvalidSubmission",
            )

    @workflow.signal(name="deliver")
    def deliver(self, signal: DeliverySignal) -> None:
        """A delivery row was created for this conversation: apply it (duplicates are dropped)."""
        # Also a nudge: a held lane asks the store again, so `turnkit reconcile` heals a `wake` that never came.
        self._nudge()
        if signal.delivery_id in self._recent_deliveries or signal.delivery_id in self._pending_deliveries:
            return
        self._pending_deliveries.append(signal.delivery_id)
        self._show()

    @workflow.signal(name="wake")
    def wake(self) -> None:
        """A sub-agent's turn in this conversation ended: held deliveries may go in now."""
        self._wakes += 1
        self._nudge()

    @workflow.signal(name=TARGET_FINISHED_SIGNAL)
    def target_finished(self, turn_id: str) -> None:
        """A turn of this lane has ended: the one it follows since it continued as new (its wait row names this lane),
        or (patch ``lane-starts-turns``) any turn of the conversation's own, whose terminal write signals the lane."""
        self._followed_ended = True
        _remember(self._ended_turns, turn_id)

    def _nudge(self) -> None:
        if self._patched(LANE_RECHECKS_HOLD):
            self._recheck = True  # never release on a signal alone: the store says whether a turn still runs
        else:
            self._held = False

    @workflow.query(name="status")
    def status(self) -> LaneStatus:
        """What runs and what waits in this lane."""
        return LaneStatus(
            conversation_id=self._conversation_id,
            active_turn_id=self._active,
            queued_turn_ids=[queued.turn_id for queued in self._queue],
            pending_delivery_ids=list(self._pending_deliveries),
            turns_started=self._turns_started,
            run_history_events=workflow.info().get_current_history_length(),
        )

    # Main loop ------------------------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, lane: LaneInput) -> None:
        self._deliver_when_idle = self._patched(DELIVER_WHEN_IDLE)
        self._follows_turns = self._patched(LANE_FOLLOWS_TURNS)
        self._starts_turns = self._follows_turns and self._patched(LANE_STARTS_TURNS)
        # Only when the start carried TurnKit's attributes: then the namespace has them (never a wedge).
        self._search = has_turnkit_attributes(workflow.info().typed_search_attributes) and self._patched(
            SEARCH_ATTRIBUTES
        )
        if self._held and self._patched(LANE_RECHECKS_HOLD):
            self._recheck = True  # a carried hold is re-checked once: its `wake` may have come to the old run
        turn: asyncio.Task[None] | None = None
        if self._active_turn is not None:  # carried by continue-as-new (only runs with the patch carry one)
            turn = asyncio.create_task(self._follow_turn(self._active_turn))
        while True:
            self._show()
            await workflow.wait_condition(functools.partial(self._has_work, turn))
            if turn is not None and turn.done():
                turn = None
            self._show()
            if self._held and self._recheck:
                await self._recheck_hold()
                continue
            idle = turn is None and not self._queue
            if self._pending_deliveries and not self._held and (idle or not self._deliver_when_idle):
                await self._apply_deliveries(wake=idle)
                continue
            if turn is not None:
                if self._busy_rollover_due():
                    await self._before_rollover()
                    if not turn.done():
                        workflow.continue_as_new(self._carry(active=self._active_turn))
                continue
            if self._queue and not self._held:
                turn = asyncio.create_task(self._run_turn(self._queue.pop(0)))
                continue
            if self._wake_pending and not self._held:
                await self._apply_deliveries(wake=True)
                continue
            if not self._should_continue_as_new():
                continue
            # Idle and due for a fresh run: let in-flight handlers land first, then roll over.
            await self._before_rollover()
            if (self._queue or self._pending_deliveries) and not self._held:
                continue
            workflow.continue_as_new(self._carry(active=None))

    async def _before_rollover(self) -> None:
        """Wait until continuing as new is safe: every handler has finished, and (patch ``local-store-calls``) no
        submit completed in this workflow task.

        A submit's store call is local, so its update is accepted and completed in the task that ran it. If that
        task also continued as new and the server then refused the task (an event arrived meanwhile, e.g. the
        turn's end: "unhandled command"), the update would be aborted although its turn row is committed. A task of
        its own for the rollover (a 1 ms timer) keeps every accepted submit in the history.
        """
        while True:
            await workflow.wait_condition(workflow.all_handlers_finished)
            if self._submitted_in != workflow.info().get_current_history_length():
                return
            if not self._patched(LOCAL_STORE_CALLS):
                return  # a history from before the patch continued as new in such a task: replay it as it ran
            await workflow.sleep(timedelta(milliseconds=1), summary="roll over in a task of its own")

    def _carry(self, *, active: QueuedTurn | None) -> LaneInput:
        """The next run's input: everything this run keeps in memory."""
        return LaneInput(
            conversation_id=self._conversation_id,
            queue=self._queue,
            recent_turn_ids=list(self._recent_turns),
            pending_delivery_ids=self._pending_deliveries,
            recent_delivery_ids=list(self._recent_deliveries),
            wake_pending=self._wake_pending,
            held=self._held,
            turns_started=self._turns_started,
            max_history_events=self._max_history_events,
            active=active,
            patch_level=PATCH_LEVEL,  # the next run starts on this code
        )

    def _busy_rollover_due(self) -> bool:
        """Continue-as-new while a turn runs (patched): only once its workflow started, so it outlives this run."""
        return self._follows_turns and self._active_started and self._should_continue_as_new()

    async def _recheck_hold(self) -> None:
        """Ask the store whether a sub-agent's turn is still active here; hold or release accordingly."""
        self._recheck = False  # a nudge during the check asks again
        async with self._writing:  # after a submit in flight: it may have set the hold from an older answer
            self._held = await store_call(
                "turnkit.lane_held",
                self._conversation_id,
                bool,
                summary="is a sub-agent turn active?",
                patched=self._patched,
            )

    async def _apply_deliveries(self, *, wake: bool) -> None:
        """Append the signalled deliveries (exactly once) and, when idle, start a turn for delivered input."""
        batch = list(self._pending_deliveries)
        wakes = self._wakes
        # The woken turn's id, chosen here so that every run of the call (a local attempt, its fallback activity, a
        # retried workflow task) finds the turn an earlier one committed (patched with the local store calls).
        woken = f"turn_{workflow.uuid4().hex[:24]}" if wake and self._patched(LOCAL_STORE_CALLS) else None
        async with self._writing:
            result = await store_call(
                "turnkit.deliver",
                DeliverBatch(conversation_id=self._conversation_id, delivery_ids=batch, wake=wake, woken_turn_id=woken),
                DeliverResult,
                summary=f"deliver {len(batch)}" + (" · wake" if wake else ""),
                patched=self._patched,
            )
        if result.ahead is not None:
            self._run_ahead(result.ahead)  # the deliveries wait until it has ended: the loop runs it first
            return
        if result.busy:
            # Unless that turn's end was signalled meanwhile: then try again (patched: the wake asked for a re-check).
            self._held = self._wakes == wakes or self._patched(LANE_RECHECKS_HOLD)
            return
        for delivery_id in batch:
            self._pending_deliveries.remove(delivery_id)
            _remember(self._recent_deliveries, delivery_id)
        if wake:
            self._wake_pending = False
        elif result.delivered_ids:
            self._wake_pending = True  # a turn is busy: the input waits for the next wake
        if result.turn is not None:
            self._queue.append(result.turn)
            _remember(self._recent_turns, result.turn.turn_id)

    def _run_ahead(self, ahead: QueuedTurn | None) -> None:
        """Run ``ahead`` before anything else: a turn ``ask`` started without this lane (a fresh conversation's first
        turn, docs/design.md) that is still active. The lane "starts" it (a no-op when its workflow runs, the start it
        missed when its client died first) and follows it to its end as it does its own.

        No patch: only results recorded with ``ahead`` set lead here, and no older history has one. A run from before
        patch ``lane-starts-turns`` (its turns are children, whose start would collide with the running workflow)
        holds instead, as for a sub-agent's turn: a nudge (a delivery, ``turnkit reconcile``) releases it once the
        store says the turn has ended.
        """
        if ahead is None or ahead.turn_id in self._recent_turns:
            return
        if not self._starts_turns:
            self._held = True
            return
        self._queue.insert(0, ahead)
        _remember(self._recent_turns, ahead.turn_id)

    async def _run_turn(self, queued: QueuedTurn) -> None:
        self._active = queued.turn_id
        self._active_turn = queued
        self._turns_started += 1
        self._show()
        attributes = None
        if self._search:
            if workflow.info().typed_search_attributes.get(AGENT) is None:  # started by a delivery: no agent yet
                workflow.upsert_search_attributes([AGENT.value_set(queued.agent_name)])
            attributes = turn_search_attributes(
                conversation_id=self._conversation_id,
                agent_name=queued.agent_name,
                root_turn_id=queued.root_turn_id,
                parent_turn_id=None,
            )
        turn_input = queued.turn_input(self._conversation_id)
        if self._starts_turns:
            try:
                await self._start_turn(queued, turn_input)
            finally:
                self._clear_active()
            return
        try:
            if self._follows_turns:
                # ABANDON: the turn outlives this run when the lane continues as new while it runs.
                handle = await workflow.start_child_workflow(
                    TurnWorkflow.run,
                    turn_input,
                    id=queued.turn_id,
                    static_summary=f"turn · {queued.agent_name}",
                    parent_close_policy=ParentClosePolicy.ABANDON,
                    search_attributes=attributes,
                )
                self._active_started = True
                await handle
            else:
                await workflow.execute_child_workflow(
                    TurnWorkflow.run,
                    turn_input,
                    id=queued.turn_id,
                    static_summary=f"turn · {queued.agent_name}",
                    search_attributes=attributes,
                )
        except ChildWorkflowError as err:
            # A turn that crashed (a bug, a termination) must not take the lane down with it.
            workflow.logger.warning("turn %s ended abnormally: %s", queued.turn_id, err.cause or err)
            if self._follows_turns:
                # Its record may still say `running`: make it terminal before the next turn starts.
                await self._end_turn("turnkit.end_turn", queued, ended_reason(err.cause), summary="record abnormal end")
        finally:
            self._clear_active()

    async def _start_turn(self, queued: QueuedTurn, turn_input: TurnInput) -> None:
        """Start the turn's workflow (a local activity: no task of the server's queues before its first model call)
        and wait for its end signal; without one for ``FOLLOW_POLL``, ask the store, which also records a turn whose
        workflow closed without a terminal record (terminated, timed out)."""
        await store_call(
            "turnkit.start_turn",
            StartTurn(turn=turn_input, search_attributes=self._search),
            bool,
            summary=f"start {queued.turn_id}",
            patched=self._patched,
        )
        self._active_started = True  # it outlives this run: the lane may continue as new and follow it
        turn_id = queued.turn_id
        if self._patched(LANE_FOLLOWS_ON_DEMAND):
            # Nothing else to run: the turn's end is of no use yet, so nothing signals it and no timer runs. When
            # more work arrives, ask the store, which registers this lane as the turn's waiter (docs/design.md).
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
        return await store_call(
            "turnkit.follow_turn",
            EndTurn(turn_id=turn_id),
            bool,
            summary=f"has {turn_id} ended?",
            patched=self._patched,
        )

    async def _follow_turn(self, queued: QueuedTurn) -> None:
        """Follow a turn started by an earlier run of this lane (carried by continue-as-new) until it ends: ask the
        store, then wait for the turn's end signal (or a while) and ask again."""
        self._active = queued.turn_id
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

    async def _end_turn(self, activity: str, queued: QueuedTurn, reason: str, *, summary: str) -> None:
        await store_call(
            activity,
            EndTurn(turn_id=queued.turn_id, reason=reason),
            TurnOutcome,
            summary=summary,
            patched=self._patched,
        )

    def _clear_active(self) -> None:
        self._on_demand = False
        self._active = None
        self._active_turn = None
        self._active_started = False

    def _show(self) -> None:
        """The current details shown in the UI: ``running turn_… · 2 queued · 1 delivery pending``."""
        if self._active and self._on_demand:
            parts = [f"started {self._active} (followed when more work arrives)"]
        else:
            parts = [f"running {self._active}" if self._active else "idle"]
        if self._queue:
            parts.append(f"{len(self._queue)} queued")
        if self._pending_deliveries:
            count = len(self._pending_deliveries)
            parts.append(f"{count} {'delivery' if count == 1 else 'deliveries'} pending")
        if self._held:
            parts.append("held: a sub-agent's turn runs here")
        workflow.set_current_details(" · ".join(parts))

    def _has_work(self, turn: asyncio.Task[None] | None) -> bool:
        """What the main loop waits for: (idle) a queued turn, a delivery, a wake or a rollover, or (busy) the active
        turn finishing."""
        if turn is None:
            held = self._held  # a sub-agent's turn runs in this conversation: wait for its `wake`
            work = bool(self._queue or self._pending_deliveries or self._wake_pending) and not held
            return work or (held and self._recheck) or self._should_continue_as_new()
        if turn.done() or (bool(self._pending_deliveries) and not self._deliver_when_idle):
            return True
        return (self._held and self._recheck) or self._busy_rollover_due()

    def _needs_turn_end(self) -> bool:
        """Whether the lane has something to do once its active turn ends (patch ``lane-follows-on-demand``): a queued
        turn, deliveries waiting for it to be idle, a wake. (A rollover carries the turn: the next run follows it.)"""
        return bool(self._queue or self._pending_deliveries or self._wake_pending)

    def _should_continue_as_new(self) -> bool:
        info = workflow.info()
        return info.is_continue_as_new_suggested() or info.get_current_history_length() > self._max_history_events


def _remember(window: dict[str, None], key: str) -> None:
    window[key] = None
    while len(window) > RECENT_WINDOW:
        del window[next(iter(window))]
