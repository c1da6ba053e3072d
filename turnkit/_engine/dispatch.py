"""What a turn workflow needs to decide, resolved outside it (issue 9: workflow decisions never read the live agent
registry or global settings).

Activities run with the worker's agent definitions and settings; they resolve, once, how the workflow must schedule
the model call (:func:`model_policy`) and dispatch each proposed call (:func:`call_policy`), and the result travels
in the payloads. A workflow replaying a turn thus decides exactly as it did, whatever the definitions say today, and
a worker that lacks an agent fails one activity clearly instead of failing workflow tasks forever.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any, Final

from turnkit._engine.builtin_tools import LaunchAgentTool, WaitForTool
from turnkit._engine.mcp_tools import mcp_call_policy
from turnkit.activity_tools import ActivityTool
from turnkit.agent import Agent
from turnkit.config import settings
from turnkit.kernel.payloads import CallPolicy, ModelPolicy
from turnkit.store.patience import BLINK_WINDOW

__all__ = ["TOOL_STORE_WINDOW", "call_policy", "model_policy", "warn_if_model_policy_differs"]

logger = logging.getLogger("turnkit._engine.dispatch")
#: What a tool activity's start-to-close timeout adds to the tool's own: the reservation and the commit may each
#: wait out a database blink (``turnkit.store.patience.BLINK_WINDOW``) around a body that used all its time.
TOOL_STORE_WINDOW: Final = 2 * BLINK_WINDOW
#: The differences already reported by this process: each is logged once, not per model call.
_reported: set[tuple[tuple[str, float, float], ...]] = set()


def model_policy() -> ModelPolicy:
    """The ``turnkit.model`` activity's timeouts and attempts, from the settings (behaviour §3.2)."""
    return ModelPolicy(
        timeout=settings.model_timeout,
        heartbeat=settings.model_heartbeat_timeout,
        max_attempts=settings.model_max_attempts,
        local=settings.model_local_activity,
    )


def warn_if_model_policy_differs(
    start_to_close: timedelta | None, heartbeat: timedelta | None, max_attempts: int | None
) -> None:
    """Log, once per difference, when a ``turnkit.model`` activity was scheduled with other timeouts or attempts than
    this worker's settings would give it.

    The process that submits a turn resolves its :func:`model_policy`: ``ask`` itself for a fresh conversation's first
    turn, a worker otherwise. A setting configured in the workers only (a short ``model_heartbeat_timeout``) then
    does not reach first turns, and a dead worker's model call waits out the other value; this says so where the
    worker's operator looks. Called by the model activity with what ``activity.info()`` shows.
    """
    own = model_policy()
    scheduled = (
        ("model_timeout", start_to_close.total_seconds() if start_to_close else None, own.timeout),
        ("model_heartbeat_timeout", heartbeat.total_seconds() if heartbeat else None, own.heartbeat),
        ("model_max_attempts", max_attempts or None, own.max_attempts),
    )
    differs = tuple((name, float(got), float(mine)) for name, got, mine in scheduled if got is not None and got != mine)
    if not differs or differs in _reported:
        return
    _reported.add(differs)
    logger.warning(
        "a model call was scheduled with %s, but this worker's settings say %s: the process that submitted its turn "
        "(ask, for a conversation's first turn) is configured otherwise; set these in every process",
        ", ".join(f"{name}={got:g}" for name, got, _ in differs),
        ", ".join(f"{name}={mine:g}" for name, _, mine in differs),
    )


def call_policy(
    agent: Agent,
    name: str,
    loaded_skills: Iterable[str] = (),
    mcp_tools: Mapping[str, list[dict[str, Any]]] | None = None,
) -> CallPolicy:
    """How the workflow dispatches a call to ``name`` proposed by ``agent``'s model in a turn that loaded
    ``loaded_skills`` (its stored ``TurnState.loaded_skills``) and recorded ``mcp_tools`` (``TurnState.mcp_tools``):
    delegation to a sub-agent, a coordination tool, the application's own activity (``turnkit.activity_tool``), or a
    tool activity with the timeouts and retries of its recovery mode, on its task queue (an MCP server's tool too);
    ``unknown`` when the name is not in the turn's tool set, e.g. a skill's tool before ``load_skill`` (the tool
    activity then records the failure at once)."""
    if agent.sub_agent(name) is not None:
        return CallPolicy(kind="sub_agent")
    loaded = tuple(loaded_skills)
    tool = agent.tool(name, loaded)
    if tool is None:
        served = mcp_call_policy(agent, name, mcp_tools or {})
        return CallPolicy(kind="unknown", at_most_once=False) if served is None else _with_store_window(served)
    if isinstance(tool, ActivityTool):
        return tool.call_policy()
    owner = None if agent.tool(name) is not None else agent.skill_owning(name)
    if isinstance(tool, LaunchAgentTool):
        return CallPolicy(kind="launch_agent")
    if isinstance(tool, WaitForTool):
        return CallPolicy(kind="wait_for")
    replay_safe = tool.recovery == "replay_safe"
    policy = CallPolicy(
        kind="tool",
        at_most_once=not replay_safe,
        timeout=tool.timeout,
        heartbeat=min(tool.timeout, settings.tool_heartbeat_timeout),
        max_attempts=tool.max_attempts if replay_safe else 1,
        initial_retry_interval=tool.initial_retry_interval,
        maximum_retry_interval=tool.maximum_retry_interval,
        task_queue=tool.task_queue,
        skill=None if owner is None else owner.key,
        local=tool.local,
    )
    return _with_store_window(policy)


def _with_store_window(policy: CallPolicy) -> CallPolicy:
    """A tool activity's policy whose body keeps its own timeout (the activity enforces it on the body) while the
    activity gets ``TOOL_STORE_WINDOW`` more: its store phases (the reservation before the body, the commit after it)
    may each wait out a database blink without spending the tool's time, nor turning a call whose effect happened into
    ``interrupted`` (docs/design.md, "Local tool calls" and "One turn")."""
    return policy.model_copy(update={"timeout": policy.timeout + TOOL_STORE_WINDOW, "body_timeout": policy.timeout})
