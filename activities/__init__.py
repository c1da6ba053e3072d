"""Temporal activities of TurnKit: the model call, tool calls and turn record writes.

Activities do all I/O (store, model providers, tools). They are built bound to a :class:`~turnkit.store.Store`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from activities.children import ChildActivities
from activities.deliveries import DeliveryActivities
from activities.lane import LaneActivities
from activities.model import ModelActivities
from activities.tools import ToolActivities
from activities.turns import TurnActivities
from turnkit.store.store import Store

__all__ = [
    "ChildActivities",
    "DeliveryActivities",
    "LaneActivities",
    "ModelActivities",
    "ToolActivities",
    "TurnActivities",
    "build_activities",
    "build_tool_activities",
]


def build_activities(store: Store) -> list[Callable[..., Any]]:
    """Every TurnKit activity, bound to ``store`` (register them all on a worker)."""
    turns = TurnActivities(store)
    children = ChildActivities(store)
    lane = LaneActivities(store)
    return [
        ModelActivities(store).model,
        ToolActivities(store).run_tool,
        turns.submit_turn,
        turns.finish_turn,
        turns.settle_tool,
        DeliveryActivities(store).deliver,
        children.delegate,
        children.join,
        children.wait,
        children.finish_wait,
        lane.lane_held,
        lane.start_turn,
        lane.end_turn,
        lane.follow_turn,
    ]


def build_tool_activities(store: Store) -> list[Callable[..., Any]]:
    """Only the tool activity, bound to ``store``: for a worker on a tool's own task queue (``--only tools``)."""
    return [ToolActivities(store).run_tool]
