"""The tools of an agent's MCP servers in a turn: listed once, recorded in the turn, offered and dispatched from the
record.

The model activity calls :func:`record_mcp_tools` before it builds a request: the first time a turn asks its model,
each server's tools are listed (one connection per server) and written into the turn's state (``mcp_tools``, by
server name), first writer wins. Everything after reads that record: the tools a request offers
(:func:`mcp_tool_specs`), how a proposed call is dispatched (:func:`mcp_call_policy`, which names the server and the
server's own tool name in the :class:`~turnkit.kernel.payloads.CallPolicy`) and the tool the tool activity runs
(:func:`mcp_tool`). So a retried model call and every later iteration of the turn offer the same list, whatever the
server lists meanwhile; the next turn lists again.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from turnkit.config import settings
from turnkit.kernel.payloads import CallPolicy, MCPTarget
from turnkit.model import ToolSpec
from turnkit.store.store import Store

if TYPE_CHECKING:
    from turnkit.agent import Agent
    from turnkit.kernel.records import TurnRecord
    from turnkit.kernel.turn_state import TurnState
    from turnkit.mcp import MCPServer, MCPTool

__all__ = ["mcp_call_policy", "mcp_tool", "mcp_tool_specs", "record_mcp_tools"]

logger = logging.getLogger("turnkit._engine.mcp_tools")

#: One recorded tool: ``{"name": the model's name, "tool": the server's, "description": …, "parameters": schema}``.
Entry = dict[str, Any]

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


async def record_mcp_tools(store: Store, turn: TurnRecord, agent: Agent) -> TurnRecord:
    """``turn`` with the tool list of each of ``agent``'s MCP servers recorded: the servers not recorded yet are
    listed now (a failure raises: the model call's attempt fails and is retried), then written, first writer wins.

    Raises:
        Exception: A server could not be listed (connection, timeout, protocol).
    """
    recorded = turn.options.state.mcp_tools
    missing = [server for server in agent.mcp_servers if server.name not in recorded]
    if not missing:
        return turn
    taken = _own_names(agent) | {entry["name"] for entries in recorded.values() for entry in entries}
    listed: dict[str, list[Entry]] = {}
    for server in missing:
        listed[server.name] = _entries(server, await server.list_tools(), taken)
    async with store.atomic(turn_id=turn.root_turn_id) as tx:
        current = await tx.load_turn(turn.id)
        state = current.options.state
        lists = {**listed, **state.mcp_tools}  # what a concurrent attempt recorded first stands
        if lists == state.mcp_tools:
            return current
        state = state.model_copy(update={"mcp_tools": lists})
        return await tx.update_turn(current.id, options=current.options.with_state(state))


def mcp_tool_specs(agent: Agent, state: TurnState) -> list[ToolSpec]:
    """The recorded tools of ``agent``'s servers, as the model sees them (servers the agent no longer has are left
    out, and so calls to their tools are unknown)."""
    return [
        ToolSpec(name=entry["name"], description=entry.get("description") or "", parameters=entry["parameters"])
        for server in agent.mcp_servers
        for entry in state.mcp_tools.get(server.name, ())
    ]


def mcp_call_policy(agent: Agent, name: str, recorded: Mapping[str, list[Entry]]) -> CallPolicy | None:
    """How a call of ``name`` is dispatched when it is a recorded tool of one of ``agent``'s servers: TurnKit's tool
    activity, with the server's timeout and the retries of the recovery it declares for that tool; None otherwise."""
    for server in agent.mcp_servers:
        for entry in recorded.get(server.name, ()):
            if entry["name"] != name:
                continue
            replay_safe = server.recovery_of(entry["tool"]) == "replay_safe"
            return CallPolicy(
                kind="tool",
                at_most_once=not replay_safe,
                timeout=server.timeout,
                heartbeat=min(server.timeout, settings.tool_heartbeat_timeout),
                max_attempts=server.max_attempts if replay_safe else 1,
                initial_retry_interval=server.initial_retry_interval,
                maximum_retry_interval=server.maximum_retry_interval,
                mcp=MCPTarget(server=server.name, tool=entry["tool"]),
            )
    return None


def mcp_tool(agent: Agent, name: str, target: MCPTarget) -> MCPTool | None:
    """The tool the tool activity runs for a call of ``name`` dispatched to ``target``; None when the agent no longer
    has that server (the call is then an unknown tool's)."""
    server = agent.mcp_server(target.server)
    return None if server is None else server.tool(name, target.tool)


def _own_names(agent: Agent) -> set[str]:
    """Every name the agent's own tools, skills' tools and sub-agents take (they win over a server's tool)."""
    skills = (*agent.skills, *agent.available_skills)
    tools: Iterable[Any] = (*agent.tools, *(each for skill in skills for each in skill.tools))
    names = {each.name for each in tools} | {each.name for each in agent.sub_agents}
    if agent.load_skill_tool is not None:
        names.add(agent.load_skill_tool.name)
    return names


def _entries(server: MCPServer, tools: Iterable[Any], taken: set[str]) -> list[Entry]:
    """The record of ``server``'s listed ``tools`` (``mcp.types.Tool``), under the names the model sees; a tool whose
    name is taken already is left out (and logged)."""
    entries: list[Entry] = []
    for listed in tools:
        original = str(listed.name)
        if not server.offers(original):
            continue
        name = server.prefix + _INVALID.sub("_", original)
        if name[0].isdigit():
            name = f"_{name}"
        if name in taken:
            logger.warning("MCP server %s: tool %s is left out, the name %s is taken", server.name, original, name)
            continue
        taken.add(name)
        schema = dict(listed.input_schema or {}) or {"type": "object", "properties": {}}
        entries.append({"name": name, "tool": original, "description": listed.description or "", "parameters": schema})
    return entries
