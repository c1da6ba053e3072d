"""``turnkit show``: a run's tree of turns, sub-agents, tool executions and deliveries, as text or JSON.

Reads the store only (no Temporal connection). With a Temporal UI address (``--ui`` or ``$TURNKIT_UI``) each turn's
workflow gets its link. Text output is :func:`~turnkit._ops.printable.printable` line by line; JSON output escapes
every control character (``json.dumps`` writes ASCII), so neither lets a terminal escape sequence through.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from turnkit._ops.printable import printable
from turnkit._ops.tree import TurnNode, seconds_between

__all__ = ["render_json", "render_text", "ui_links", "workflow_url"]


def workflow_url(ui: str, namespace: str, workflow_id: str) -> str:
    """The Temporal UI page of a workflow (its latest run)."""
    return f"{ui.rstrip('/')}/namespaces/{quote(namespace, safe='')}/workflows/{quote(workflow_id, safe='')}"


def ui_links(trees: list[TurnNode], ui: str | None, namespace: str) -> dict[str, str]:
    """Workflow id -> UI address for every turn in ``trees`` (empty without a UI address)."""
    if not ui:
        return {}
    return {node.turn.id: workflow_url(ui, namespace, node.turn.id) for tree in trees for node in tree.walk()}


def render_json(trees: list[TurnNode], *, links: dict[str, str] | None = None) -> str:
    """The trees as one JSON document: ``{"trees": [turn, ...]}``, sub-agent turns under ``children``."""
    return json.dumps({"trees": [tree.to_dict(links=links) for tree in trees]}, indent=2, default=str)


def render_text(trees: list[TurnNode], *, links: dict[str, str] | None = None) -> str:
    """The trees as indented text: one line per turn, tool execution and delivery."""
    lines: list[str] = []
    for tree in trees:
        _turn_lines(tree, "", lines, links or {})
        costs = [node.turn.cost for node in tree.walk() if node.turn.cost is not None]
        total_cost = sum(costs) if costs else None
        total_tokens = sum(node.tokens for node in tree.walk())
        lines.append(f"  tree: {len(tree.walk())} turn(s) · {total_tokens} tokens · {_money(total_cost)}")
        lines.append("")
    # Names, errors and tool names come from the record: no escape sequence or line break in them reaches the terminal.
    return "\n".join(printable(line, one_line=True) for line in lines).rstrip("\n")


def _turn_lines(node: TurnNode, indent: str, lines: list[str], links: dict[str, str]) -> None:
    turn = node.turn
    lines.append(
        f"{indent}{turn.id}  {turn.agent_name}  {turn.status}  {_duration(node.duration)}  "
        f"{node.iterations} iter  {node.tokens} tok  {_money(turn.cost)}"
    )
    inner = indent + "    "
    if turn.id in links:
        lines.append(f"{inner}ui: {links[turn.id]}")
    if turn.error:
        lines.append(f"{inner}error: {turn.error.get('class', '')}: {turn.error.get('message', '')}")
    for execution in node.executions:
        took = _duration(seconds_between(execution.started_at, execution.completed_at))
        lines.append(f"{inner}tool {execution.tool_name}  {execution.status}  {took}  ({execution.id})")
        for child in node.children_of(execution.id):
            _turn_lines(child, inner + "    ", lines, links)
    for delivery in node.deliveries:
        state = "delivered" if delivery.delivered_at else "pending"
        lines.append(f"{inner}delivery → {delivery.destination_conversation_id}  {state}  ({delivery.id})")
    attached = {e.id for e in node.executions}
    for child in node.children:
        if child.turn.parent_tool_execution_id not in attached:  # launched without a known execution
            _turn_lines(child, inner, lines, links)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.2f}s" if seconds < 60 else f"{int(seconds // 60)}m{seconds % 60:04.1f}s"


def _money(value: Any) -> str:
    return "$-" if value is None else f"${float(value):.6f}"
