"""The names under which TurnKit's workflows, updates, signals and queries are registered: what clients and other
workflows use to start and message them, so that client code (``ask``, deliveries, repair) never imports the workflow
modules. The activities' names are on their declarations (:mod:`turnkit.kernel.activities`).

The workflow definitions in ``workflows/`` register under these same names; a test checks that they agree.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CANCEL_WORKFLOW",
    "COMPACTION_WORKFLOW",
    "DELIVER_SIGNAL",
    "LANE_ROLLING_OVER",
    "LANE_STATUS_QUERY",
    "LANE_WORKFLOW",
    "RESUME_SIGNAL",
    "STANDALONE_MEDIA_WORKFLOW",
    "SUBMIT_UPDATE",
    "TARGET_FINISHED_SIGNAL",
    "TOOL_ACTIVITY_PREFIX",
    "TURN_STARTED_UPDATE",
    "TURN_WORKFLOW",
    "WAKE_SIGNAL",
]

#: The conversation's lane (workflow id = conversation id).
LANE_WORKFLOW: Final = "ConversationWorkflow"
#: One turn (workflow id = turn id).
TURN_WORKFLOW: Final = "TurnWorkflow"
#: One ``Turn.cancel`` request: the store's writes, then the workflows cancelled and the ends announced.
CANCEL_WORKFLOW: Final = "CancelWorkflow"
#: One ``Conversation.compact`` request: its summariser call as an activity.
COMPACTION_WORKFLOW: Final = "CompactionWorkflow"
#: ``Turn.paint`` / ``Turn.view_media`` of a prepared turn (workflow id = turn id): its media call as an activity.
STANDALONE_MEDIA_WORKFLOW: Final = "StandaloneMediaWorkflow"
#: The lane's update that appends a trigger message and queues a turn; returns a ``TurnTicket``.
SUBMIT_UPDATE: Final = "submit"
#: The lane's update that returns once the lane has started a queued turn (its argument, the turn id): ``started``,
#: ``unknown`` (the lane does not hold it) or ``again`` (the lane continues as new: ask again).
TURN_STARTED_UPDATE: Final = "turn_started"
#: The failure type of a ``turn_started`` update that a lane refuses while it continues as new (ask its next run).
LANE_ROLLING_OVER: Final = "LaneRollingOver"
#: The lane's signal that a delivery row exists for it.
DELIVER_SIGNAL: Final = "deliver"
#: The lane's signal that a sub-agent's turn in its conversation ended.
WAKE_SIGNAL: Final = "wake"
#: The lane's query: what runs and what waits (a ``LaneStatus``).
LANE_STATUS_QUERY: Final = "status"
#: A turn's signal that the application resumed it (the store says so already).
RESUME_SIGNAL: Final = "resume"
#: The signal a turn's end sends to each workflow that waits for it (a turn's ``wait_for``, a lane following its turn,
#: a team's workflow that asked an agent through :mod:`turnkit.workflow`), with the ended turn's id.
TARGET_FINISHED_SIGNAL: Final = "target_finished"
#: A tool call's activity type is this prefix and the tool's name (one dynamic activity runs them all).
TOOL_ACTIVITY_PREFIX: Final = "tool:"
