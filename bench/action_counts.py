"""Temporal Cloud actions per turn, counted from workflow histories: TurnKit's and each peer's.

Temporal Cloud bills *actions*. Which operations are actions, and how they show in a workflow's event history, is
on Temporal's "Temporal Cloud Actions" page, https://docs.temporal.io/cloud/actions (now served at
https://docs.temporal.io/evaluate/cloud/actions; source ``docs/evaluate/temporal-cloud/actions.mdx`` in
temporalio/documentation), read 2026-12-05. :data:`ACTIONS` below is that page turned into one table, event type ->
action, with the rules it states:

- **Workflow started** (client start, Continue-As-New, child start): one per ``WorkflowExecutionStarted``.
  **Signal-With-Start** is one action in all, whether or not it starts the workflow: the signal recorded straight
  after the start it made is not counted again.
- **Child workflow**: "two Actions, one for starting the Workflow, and another for the attempted Execution": the
  parent's ``StartChildWorkflowExecutionInitiated`` counts one and the child's own ``WorkflowExecutionStarted`` the
  other, so a turn whose child histories are counted too gets both, and none twice.
- **Timer started**: one per ``TimerStarted`` (the SDK's implicit timers, e.g. ``wait_condition(timeout=...)``,
  included).
- **Search attribute upsert**: one per ``UpsertWorkflowSearchAttributes``, however many attributes it sets;
  attributes given at the start are free, and so is an upsert of ``TemporalChangeVersion`` alone.
- **Signal sent**: one per signal, from a client or a workflow; counted where it lands (``WorkflowExecutionSignaled``),
  so a signal between two workflows of the same turn is counted once.
- **Update received**: one per accepted update (``WorkflowExecutionUpdateAccepted``). Rejected updates are billed
  too but leave no event; the harness here sends none.
- **Activity started or retried**: one per attempt. A history records an activity's last attempt only, in
  ``ActivityTaskStarted.attempt``, so an activity that ran three times counts three.
- **Local activities**: "Temporal Cloud counts all RecordMarkers from each Workflow Task as one action": one per
  workflow task that recorded any marker, however many it recorded. That rule names no kind of marker, so a
  ``workflow.patched`` marker counts too (Pydantic AI's turn records one); the ``TemporalChangeVersion`` upsert that
  goes with it is exempt, as above, though the dev server's ``action`` metric counts it.
- **Workflow Execution Options updated**, **Nexus operation scheduled / cancelled**: one each.

Not in a history, so not counted here: queries (one each), activity heartbeats that reach the server (one each),
rejected updates, schedules, exports. :func:`server_actions` reads the dev server's own ``action`` counter, which
sees heartbeats and queries too: on this workload no system sends either (bench/README.md, "Temporal actions per
turn").

The driver that runs turns and prints the table is :mod:`bench.actions`.
"""

from __future__ import annotations

import socket
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

DOC_URL = "https://docs.temporal.io/cloud/actions"

_E = EventType


def _one(_: HistoryEvent) -> int:
    return 1


def _attempts(event: HistoryEvent) -> int:
    """An activity's attempts: the history keeps the last one's number only."""
    return max(event.activity_task_started_event_attributes.attempt, 1)


def _upsert(event: HistoryEvent) -> int:
    """An upsert counts one, unless it sets ``TemporalChangeVersion`` (versioning) and nothing else."""
    fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    return 0 if set(fields) <= {"TemporalChangeVersion"} else 1


#: Event type -> (action type, how many actions the event is). Local activity markers and Signal-With-Start are
#: rules across events, in :func:`count_actions`.
ACTIONS: dict[int, tuple[str, Callable[[HistoryEvent], int]]] = {
    _E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED: ("workflow started", _one),
    _E.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED: ("child workflow start", _one),
    _E.EVENT_TYPE_TIMER_STARTED: ("timer started", _one),
    _E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES: ("search attribute upsert", _upsert),
    _E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED: ("signal", _one),
    _E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED: ("update", _one),
    _E.EVENT_TYPE_ACTIVITY_TASK_STARTED: ("activity attempt", _attempts),
    _E.EVENT_TYPE_WORKFLOW_EXECUTION_OPTIONS_UPDATED: ("workflow options updated", _one),
    _E.EVENT_TYPE_NEXUS_OPERATION_SCHEDULED: ("nexus operation", _one),
    _E.EVENT_TYPE_NEXUS_OPERATION_CANCEL_REQUESTED: ("nexus operation", _one),
}

MARKERS = "markers (per workflow task)"


def count_actions(
    history: WorkflowHistory | Iterable[HistoryEvent], after_event_id: int = 0, until_event_id: int | None = None
) -> Counter[str]:
    """The billable actions of a workflow history, by action type (:data:`ACTIONS`, and :data:`MARKERS`).

    Args:
        history: The history (``handle.fetch_history()``) or its events.
        after_event_id: Count only the events after this one: what a long-lived workflow (a conversation's lane)
            added during one turn.
        until_event_id: And only those up to this one (the last event of that turn; default: the end).

    Returns:
        Action type -> count; :func:`billable` sums them.
    """
    events = list(history.events if isinstance(history, WorkflowHistory) else history)
    counts: Counter[str] = Counter()
    marker_tasks: set[int] = set()
    started_with_signal = False
    for index, event in enumerate(events):
        if event.event_id <= after_event_id or (until_event_id is not None and event.event_id > until_event_id):
            continue
        kind = event.event_type
        if kind == _E.EVENT_TYPE_MARKER_RECORDED:
            marker_tasks.add(event.marker_recorded_event_attributes.workflow_task_completed_event_id)
            continue
        if kind == _E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED and index == 1 and started_with_signal:
            continue  # Signal-With-Start: one action in all, the start's
        if kind == _E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED and index == 0:
            # A signal recorded before the first workflow task came with the start (Signal-With-Start).
            started_with_signal = len(events) > 1 and events[1].event_type == _E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        found = ACTIONS.get(kind)
        if found is not None:
            name, actions = found
            if n := actions(event):
                counts[name] += n
    if marker_tasks:
        counts[MARKERS] = len(marker_tasks)
    return counts


def billable(counts: Counter[str]) -> int:
    """The total of :func:`count_actions`' counts."""
    return sum(counts.values())


def free_port() -> int:
    """A TCP port free on localhost now (for the dev server's ``--metrics-port``)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_actions(port: int, namespace: str = "default") -> Counter[str]:
    """The dev server's own ``action`` counter (Prometheus, on ``--metrics-port``), frontend only, by action type:
    the metric Temporal's "Estimate Actions for migration" page (docs.temporal.io/cloud/migrate/estimate-actions)
    reads for Cloud's actions. It counts commands (``command_ScheduleActivityTask``: one per activity, not per
    attempt) and calls (``grpc_RecordActivityTaskHeartbeat``, queries), so it checks :func:`count_actions` and sees
    what a history does not. The server publishes the counter about once a second: read it after a quiet moment."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("action{") and 'service_name="frontend"' in line and f'namespace="{namespace}"' in line:
            labels, value = line.rsplit(" ", 1)
            kind = labels.split('action_type="', 1)[1].split('"', 1)[0]
            counts[kind] += int(float(value))
    return counts
