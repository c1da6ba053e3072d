"""The workflows a TurnKit worker (and the replayer) registers."""

from __future__ import annotations

from turnkit._workflows.lane import ConversationWorkflow
from turnkit._workflows.turn import TurnWorkflow

__all__ = ["ALL_WORKFLOWS"]

#: Every workflow a TurnKit worker (and the replayer) registers.
ALL_WORKFLOWS: list[type] = [ConversationWorkflow, TurnWorkflow]
