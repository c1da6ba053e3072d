"""Task queues per tool (``@tool(task_queue="gpu")``): which tools a worker's queue serves, and calls that arrive
on the wrong one.

A tool with a ``task_queue`` of its own runs on that queue, served by a worker on the box that can run it
(``worker.py --queue gpu --only tools``); a tool without one runs on its turn's queue. The queue travels in the
call's :class:`~turnkit.kernel.payloads.CallPolicy`, resolved by the model activity, so the workflow never reads the
agent registry (docs/design.md, "Layers" and "One turn").
"""

from __future__ import annotations

from turnkit.agent import registered_agents
from turnkit.tools import Tool

__all__ = ["misrouted", "registered_tools", "tools_on_queue"]


def registered_tools() -> list[Tool]:
    """Every tool of every registered agent, each instance once, in registration order."""
    seen: dict[int, Tool] = {}
    for agent in registered_agents().values():
        for each in agent.tools:
            seen.setdefault(id(each), each)
    return list(seen.values())


def tools_on_queue(task_queue: str, *, turn_queue: str) -> list[Tool]:
    """The registered tools whose calls are scheduled on ``task_queue``: those declaring it, and, when it is the
    turns' queue ``turn_queue``, those declaring none."""
    return [
        each
        for each in registered_tools()
        if each.task_queue == task_queue or (each.task_queue is None and task_queue == turn_queue)
    ]


def misrouted(tool: Tool, task_queue: str) -> str | None:
    """Why a call of ``tool`` must not run on ``task_queue`` (None when it may).

    A tool with a queue of its own runs only there: a call arriving elsewhere was dispatched by a worker whose
    definitions differ from this one's (a deploy in progress, an app module out of date), and running it here could
    run it on a box without the GPU or the credentials it needs.
    """
    if tool.task_queue is None or tool.task_queue == task_queue:
        return None
    return (
        f"tool {tool.name} runs on task queue {tool.task_queue!r}, but its call arrived on {task_queue!r}: "
        "the workers' agent definitions differ (register the same app modules in every worker)"
    )
