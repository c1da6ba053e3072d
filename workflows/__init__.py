"""Temporal workflow definitions of TurnKit (deterministic code only)."""

from __future__ import annotations

from workflows.lane import ConversationWorkflow
from workflows.turn import TurnWorkflow

__all__ = ["ALL_WORKFLOWS", "ConversationWorkflow", "TurnWorkflow"]

#: Every workflow a TurnKit worker (and the replayer) registers.
ALL_WORKFLOWS: list[type] = [ConversationWorkflow, TurnWorkflow]
