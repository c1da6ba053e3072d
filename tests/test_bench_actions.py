"""bench.actions counts a turn's Temporal Cloud actions as docs.temporal.io/cloud/actions bills them.

The recorded histories are real TurnKit runs (``tests/histories``, recorded by ``make histories``); each expected
count was checked by hand against the history's events, listed beside it. The driver's own run (``python -m
bench.actions``) is checked on the systems that need no extra package, against each dev server's ``action`` metric.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from temporalio.api.common.v1 import Payload, SearchAttributes
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import (
    ActivityTaskStartedEventAttributes,
    HistoryEvent,
    UpsertWorkflowSearchAttributesEventAttributes,
    WorkflowExecutionSignaledEventAttributes,
    WorkflowExecutionStartedEventAttributes,
)
from temporalio.client import WorkflowHistory

from bench.action_counts import MARKERS, billable, count_actions

ROOT = Path(__file__).resolve().parent.parent
HISTORIES = ROOT / "tests" / "histories"


def _recorded(name: str) -> WorkflowHistory:
    path = HISTORIES / f"{name}.json"
    return WorkflowHistory.from_json(path.stem, path.read_text())


def test_a_direct_first_turn_costs_six_actions() -> None:
    """A fresh conversation's first turn with one tool call: the start, the deadline's timer, model + tool + model
    activities and the closing status upsert; the workflow tasks and the cancelled timer are free."""
    counts = count_actions(_recorded("direct-first-turn-TurnWorkflow-v1"))
    assert counts == {"workflow started": 1, "timer started": 1, "activity attempt": 3, "search attribute upsert": 1}
    assert billable(counts) == 6


def test_local_activities_count_once_per_workflow_task() -> None:
    """Two local tool calls recorded in one workflow task are one action, a third in another task one more."""
    counts = count_actions(_recorded("turn-local-tools-TurnWorkflow-v1"))
    assert counts[MARKERS] == 2  # markers 12 and 13 (task 11), marker 20 (task 19)
    assert billable(counts) == 9  # + start, timer, 4 activities, upsert


def test_a_lane_is_counted_per_turn_between_event_ids() -> None:
    """A conversation lane serving two turns: each submit is an update and the store calls of its workflow task
    one local-activity action; the window of event ids picks out one turn's share."""
    lane = _recorded("lane-two-turns-ConversationWorkflow-v1")
    whole = count_actions(lane)
    assert whole == {
        "workflow started": 1,
        "update": 2,
        MARKERS: 3,  # markers in tasks 4, 11 and 20
        "timer started": 1,
        "signal": 1,
    }
    first = count_actions(lane, until_event_id=8)
    assert first == {"workflow started": 1, "update": 1, MARKERS: 1}
    second = count_actions(lane, after_event_id=8, until_event_id=15)
    assert second == {"update": 1, MARKERS: 1}


def _event(event_id: int, kind: int, **attributes: object) -> HistoryEvent:
    return HistoryEvent(event_id=event_id, event_type=kind, **attributes)  # pyright: ignore[reportArgumentType]


def test_retries_signal_with_start_and_versioning_upserts() -> None:
    """An activity's third attempt is three actions; a Signal-With-Start is one in all; an upsert of
    ``TemporalChangeVersion`` alone is free, and a marker of another kind (a patch's) is one like a local activity's."""
    e = EventType
    version = SearchAttributes(indexed_fields={"TemporalChangeVersion": Payload(data=b'["x-1"]')})
    events = [
        _event(
            1,
            e.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
            workflow_execution_started_event_attributes=(WorkflowExecutionStartedEventAttributes()),
        ),
        _event(
            2,
            e.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
            workflow_execution_signaled_event_attributes=(WorkflowExecutionSignaledEventAttributes(signal_name="go")),
        ),
        _event(3, e.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED),
        _event(
            4,
            e.EVENT_TYPE_ACTIVITY_TASK_STARTED,
            activity_task_started_event_attributes=(ActivityTaskStartedEventAttributes(attempt=3)),
        ),
        _event(
            5,
            e.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
            upsert_workflow_search_attributes_event_attributes=(
                UpsertWorkflowSearchAttributesEventAttributes(search_attributes=version)
            ),
        ),
        _event(6, e.EVENT_TYPE_MARKER_RECORDED),  # a marker of no local activity
        _event(7, e.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED),  # a later signal is billed
    ]
    counts = count_actions(events)
    assert counts == {"workflow started": 1, "activity attempt": 3, "signal": 1, MARKERS: 1}
    assert billable(counts) == 6


def test_the_driver_counts_turnkit_and_the_floor_as_their_servers_do(tmp_path: Path) -> None:
    """``python -m bench.actions`` on the two systems every install has, at K = 1: the floor's turn is 4 actions
    (start + 3 activities), TurnKit's first, second and later turns 5 each (an idle conversation's next turn runs
    without its lane, as its first does; the closing search-attribute upsert, and no timer: the deadline caps the
    activities), 6 with a local tool (its local activity starts the deadline's timer), 4 with search attributes off
    (no upsert: the floor's count), and each dev server's own ``action`` metric over the same turns agrees with the
    histories' count."""
    out = tmp_path / "counts.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench.actions", "--systems", "bare,turnkit", "--k", "1", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(out.read_text())
    totals = {key: [billable(Counter(turn)) for turn in measured["counts"]["1"]] for key, measured in found.items()}
    assert totals == {"bare": [4, 4], "turnkit": [5, 5, 5], "turnkit_local": [6, 6, 6], "turnkit_unsearched": [4, 4, 4]}
    for key, measured in found.items():
        assert sum(measured["server"]["1"].values()) == sum(totals[key]), (key, measured["server"])
