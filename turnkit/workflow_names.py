"""The names under which TurnKit's workflows, updates and signals are registered: what clients use to start and
message them, so that client code (``ask``, deliveries, repair) never imports the workflow modules.

The workflow definitions in ``workflows/`` register under these same names; a test checks that they agree.
"""

from __future__ import annotations

from typing import Final

__all__ = ["DELIVER_SIGNAL", "LANE_WORKFLOW", "SUBMIT_UPDATE", "TURN_WORKFLOW", "WAKE_SIGNAL"]

#: The conversation's lane (workflow id = conversation id).
LANE_WORKFLOW: Final = "ConversationWorkflow"
#: One turn (workflow id = turn id).
TURN_WORKFLOW: Final = "TurnWorkflow"
#: The lane's update that appends a trigger message and queues a turn; returns a ``TurnTicket``.
SUBMIT_UPDATE: Final = "submit"
#: The lane's signal that a delivery row exists for it.
DELIVER_SIGNAL: Final = "deliver"
#: The lane's signal that a sub-agent's turn in its conversation ended.
WAKE_SIGNAL: Final = "wake"
