"""Temporal activities of TurnKit: the model call, tool calls and turn record writes.

Activities do all I/O (store, model providers, tools). Each class implements the activities a workflow calls by
method reference (:mod:`turnkit.kernel.activities`), bound to a :class:`~turnkit.store.Store`; :mod:`.registry`
builds the set a worker registers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from turnkit._lazy import lazy_exports

if TYPE_CHECKING:
    from turnkit._activities.registry import build_activities, build_tool_activities

__all__ = ["build_activities", "build_tool_activities"]

__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(__all__, "turnkit._activities.registry"))
