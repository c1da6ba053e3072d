"""The activities a TurnKit worker registers, bound to its store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from turnkit._activities.activity_tools import ActivityToolActivities
from turnkit._activities.asks import AskActivities
from turnkit._activities.audit import AuditActivities
from turnkit._activities.children import ChildActivities
from turnkit._activities.deliveries import DeliveryActivities
from turnkit._activities.lane import LaneActivities
from turnkit._activities.model import ModelActivities
from turnkit._activities.requests import RequestActivities
from turnkit._activities.tools import ToolActivities
from turnkit._activities.turns import TurnActivities
from turnkit.store.store import Store

__all__ = ["build_activities", "build_tool_activities"]


def build_activities(store: Store) -> list[Callable[..., Any]]:
    """Every TurnKit activity, bound to ``store`` (register them all on a worker)."""
    turns = TurnActivities(store)
    children = ChildActivities(store)
    lane = LaneActivities(store)
    activity_tools = ActivityToolActivities(store)
    asks = AskActivities(store)
    requests = RequestActivities(store)
    return [
        ModelActivities(store).model,
        AuditActivities(store).audit,
        ToolActivities(store).run_tool,
        activity_tools.open_tool,
        activity_tools.commit_tool,
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
        asks.ask,
        asks.follow,
        asks.control,
        requests.cancel_turns,
        requests.announce_cancel,
        requests.compact,
        requests.standalone_media,
        requests.end_standalone,
    ]


def build_tool_activities(store: Store) -> list[Callable[..., Any]]:
    """Only the tool activity, bound to ``store``: for a worker on a tool's own task queue (``--only tools``)."""
    return [ToolActivities(store).run_tool]
