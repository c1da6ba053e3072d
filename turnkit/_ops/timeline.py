"""``turnkit show --html FILE [--follow]``: one self-contained HTML page with a timeline of a run's tree.

One row per turn, per model call, per tool execution and per delivery, in tree order (a turn's calls in the order
they started, a sub-agent's turn under the call that started it), each a bar placed on a shared time axis (absolute
positioning in percent of the tree's span), coloured by status; a bar's ``data-id`` is its turn, message (a model
call is the assistant message it answered with), execution or delivery id. A model call's row says its model, tokens
and cost; each tree's heading gives its totals. A turn's messages follow its row, collapsed: each opens to its
content. The axis reads in the unit the span needs (ms, s or min). Every text from the record is HTML-escaped. Inline
CSS only, no scripts and no external assets, so the page opens anywhere, offline. With ``--follow`` the file is
rewritten as the run goes on (:func:`follow_html`) and reloads itself (a ``meta refresh``) until the run ends.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from html import escape
from pathlib import Path
from typing import Any

from turnkit._engine.turn_stream import stream_turn
from turnkit._ops.tree import TurnNode, load_messages, load_trees
from turnkit.kernel.records import DeliveryRecord, MessageRecord, ToolExecutionRecord
from turnkit.model import Usage
from turnkit.store.store import Store, utcnow
from turnkit.streaming import Restart, TextDelta, ThinkingDelta

__all__ = ["duration_text", "follow_html", "render_html"]

_COLOURS = {
    "completed": "#3a9d5d",
    "running": "#2f7fd1",
    "pending": "#9aa5b1",
    "waiting": "#c9a227",
    "paused": "#c9a227",
    "failed": "#d64545",
    "interrupted": "#d98a2b",
    "cancelled": "#7b6f8f",
    "stale": "#7b6f8f",
    "model": "#8e6cc7",
    "delivered": "#3aa0a0",
}

#: The most characters of one message the page shows: a debugging page stays small enough to open when a tool
#: returned megabytes; the whole message is in the store (``turnkit show --json`` does not print messages either).
_MESSAGE_CHARS = 10_000

_STYLE = """
body{font:13px/1.4 system-ui,sans-serif;margin:24px;color:#1f2933}
h1{font-size:18px} h2{font-size:15px;margin-top:28px}
.row{display:flex;align-items:center;height:24px;border-bottom:1px solid #eef1f4}
.label{width:420px;box-sizing:border-box;flex:none;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.lane{position:relative;flex:1;height:18px;background:#f7f9fb}
.bar{position:absolute;top:2px;height:14px;border-radius:3px;min-width:2px;opacity:.9}
.tool .bar,.model .bar,.delivery .bar{top:5px;height:8px}
.model .label,.delivery .label{color:#52606d}
.axis{display:flex;justify-content:space-between;margin-left:420px;color:#7b8794;font-size:11px}
.meta,.totals{color:#616e7c}
.messages{margin:2px 0 6px;color:#52606d}
.message{margin-left:16px}
.messages pre{white-space:pre-wrap;word-break:break-word;background:#f7f9fb;padding:6px;margin:2px 0 4px}
"""


@dataclass(frozen=True)
class _Axis:
    """The tree's time axis: where it begins and how long it spans (seconds)."""

    begin: datetime
    span: float

    def place(self, start: datetime, end: datetime | None) -> tuple[float, float, float]:
        """Left and width (percent of the axis) of a bar from ``start`` to ``end`` (now while it lasts); its seconds."""
        took = ((end or utcnow()) - start).total_seconds()
        return (start - self.begin).total_seconds() / self.span * 100, max(took / self.span * 100, 0.0), took


def render_html(
    trees: list[TurnNode],
    *,
    links: dict[str, str] | None = None,
    title: str = "TurnKit run",
    messages: dict[str, list[MessageRecord]] | None = None,
    refresh: float | None = None,
) -> str:
    """The page for ``trees`` (``links``: workflow id -> Temporal UI address, shown on each turn's row; ``messages``:
    turn id -> its messages, :func:`turnkit._ops.tree.load_messages`, without which the page has no model calls and
    no message contents; ``refresh``: the page reloads itself every so many seconds, a run being followed,
    :func:`follow_html`)."""
    body = [f"<h1>{escape(title)}</h1>"]
    reload = ""
    if refresh is not None:
        reload = f"<meta http-equiv='refresh' content='{refresh:g}'>"
        body.append(f"<p class='meta'>Running: this page reloads every {refresh:g} s until the run ends.</p>")
    for tree in trees:
        body.append(_tree_section(tree, links or {}, messages or {}))
    return (
        f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>{reload}"
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


async def follow_html(
    store: Store,
    trees: list[TurnNode],
    path: Path,
    *,
    links: Callable[[list[TurnNode]], dict[str, str]],
    title: str,
    refresh: float = 1.0,
) -> list[TurnNode]:
    """Write the page of ``trees`` to ``path`` now, and again at each committed event of every unfinished root turn
    among them (its stream, :mod:`turnkit.streaming`: tool calls, sub-agents, its end), reloading itself every
    ``refresh`` seconds while one runs; the last write, once they all ended, does not reload. Returns the trees as
    they ended."""
    ids = [tree.turn.id for tree in trees]

    async def write(running: bool) -> list[TurnNode]:
        now = [tree for turn_id in ids for tree in await load_trees(store, turn_id)]
        messages = await load_messages(store, now)
        page = render_html(now, links=links(now), title=title, messages=messages, refresh=refresh if running else None)
        path.write_text(page, encoding="utf-8")
        return now

    await write(any(not tree.turn.terminal for tree in trees))
    for tree in trees:
        if tree.turn.terminal:
            continue
        async for event in stream_turn(store, tree.turn.id):
            if not isinstance(event, TextDelta | ThinkingDelta | Restart):  # the page shows records, not words
                await write(True)
    return await write(False)


def duration_text(seconds: float, span: float | None = None) -> str:
    """``seconds`` in the unit ``span`` (default: ``seconds`` itself) reads best in: ms under a second, s under two
    minutes, min beyond; as few decimals as the span needs (a 4 ms turn's axis reads 0 ms, 2 ms, 4 ms)."""
    span = seconds if span is None else span
    factor, unit = (1000.0, "ms") if span < 1 else (1.0, "s") if span < 120 else (1 / 60, "min")
    top = span * factor
    decimals = 0 if top >= 10 else 1 if top >= 1 else 2
    text = f"{seconds * factor:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{text} {unit}"


def _tree_section(tree: TurnNode, links: dict[str, str], messages: dict[str, list[MessageRecord]]) -> str:
    nodes = tree.walk()
    now = utcnow()
    calls = {n.turn.id: _model_calls(messages.get(n.turn.id, [])) for n in nodes}
    starts = [
        t
        for n in nodes
        for t in [n.turn.started_at or n.turn.created_at]
        + [e.started_at for e in n.executions]
        + [d.created_at for d in n.deliveries]
        + [c.start for c in calls[n.turn.id]]
    ]
    ends = [
        t
        for n in nodes
        for t in [n.turn.completed_at or now]
        + [e.completed_at or now for e in n.executions]
        + [d.delivered_at or now for d in n.deliveries]
    ]
    begin = min(t for t in starts if t is not None)
    axis = _Axis(begin, max((max(ends) - begin).total_seconds(), 0.001))
    span = axis.span
    rows = [
        f"<h2>{escape(tree.turn.id)} <span class='meta'>{escape(tree.turn.agent_name)} · "
        f"{escape(tree.turn.status)} · {duration_text(span)}</span></h2>",
        f"<div class='totals'>{escape(_totals(nodes, calls))}</div>",
        f"<div class='axis'><span>{duration_text(0, span)}</span><span>{duration_text(span / 2, span)}</span>"
        f"<span>{duration_text(span, span)}</span></div>",
    ]
    _rows(tree, 0, rows, axis, links, messages, calls)
    return "<section>\n" + "\n".join(rows) + "\n</section>"


@dataclass(frozen=True)
class _ModelCall:
    """One model call of a turn: the assistant message it answered with, when it was asked, what it used."""

    message: MessageRecord
    start: datetime
    model: str
    usage: Usage
    cost: float | None


def _model_calls(messages: list[MessageRecord]) -> list[_ModelCall]:
    """The turn's model calls, from its assistant responses (those with a request id; one recorded before calls kept
    their model, usage and start shows as a mark at its time, without tokens)."""
    found: list[_ModelCall] = []
    for message in messages:
        if message.role != "assistant" or message.kind not in ("text", "tool_call"):
            continue
        if "request_id" not in message.metadata:  # not a response: a terminal tool's answer, a manual compaction's
            continue
        made = message.metadata.get("model_call")  # what activities/model.py keeps of the call
        meta: dict[str, Any] = made if isinstance(made, dict) else {}  # pyright: ignore[reportUnknownVariableType]
        start = message.created_at
        if isinstance(meta.get("requested_at"), str):
            start = min(datetime.fromisoformat(meta["requested_at"]), message.created_at)
        usage = Usage.from_dict(meta["usage"]) if isinstance(meta.get("usage"), dict) else Usage()
        cost = meta.get("cost")
        found.append(
            _ModelCall(message, start, str(meta.get("model") or "?"), usage, float(cost) if cost is not None else None)
        )
    return found


def _totals(nodes: list[TurnNode], calls: dict[str, list[_ModelCall]]) -> str:
    costs = [node.turn.cost for node in nodes if node.turn.cost is not None]
    return " · ".join(
        [
            _count(len(nodes), "turn"),
            _count(sum(len(c) for c in calls.values()), "model call"),
            f"{sum(node.tokens for node in nodes)} tokens",
            _money(sum(costs) if costs else None),
            _count(sum(len(node.executions) for node in nodes), "tool execution"),
            _count(sum(len(node.deliveries) for node in nodes), "delivery", "deliveries"),
        ]
    )


def _rows(
    node: TurnNode,
    depth: int,
    rows: list[str],
    axis: _Axis,
    links: dict[str, str],
    messages: dict[str, list[MessageRecord]],
    calls: dict[str, list[_ModelCall]],
) -> None:
    turn = node.turn
    label = (
        f"{turn.agent_name} · {turn.status} · {node.iterations} iter · {node.tokens} tok · {_money(turn.cost)} · "
        f"{turn.id}"
    )
    if turn.id in links:
        label = f"<a href='{escape(links[turn.id], quote=True)}'>{escape(label)}</a>"
    else:
        label = escape(label)
    start = turn.started_at or turn.created_at
    rows.append(_row("turn", turn.id, depth, label, start, turn.completed_at, turn.status, axis))
    if messages.get(turn.id):  # collapsed under the turn's row: one line until opened
        rows.append(_messages_block(messages[turn.id], depth + 1))
    # The turn's model calls and tool executions in the order they started; a sub-agent under the call that ran it.
    steps: list[tuple[datetime, int, _ModelCall | ToolExecutionRecord]] = [(c.start, 0, c) for c in calls[turn.id]]
    steps += [(e.started_at or e.created_at, 1, e) for e in node.executions]
    for _, _, step in sorted(steps, key=lambda s: (s[0], s[1])):
        if isinstance(step, _ModelCall):
            rows.append(_model_row(step, depth + 1, axis))
            continue
        text = escape(f"tool {step.tool_name} · {step.status}")
        rows.append(_row("tool", step.id, depth + 1, text, step.started_at, step.completed_at, step.status, axis))
        for child in node.children_of(step.id):
            _rows(child, depth + 2, rows, axis, links, messages, calls)
    for delivery in node.deliveries:
        rows.append(_delivery_row(delivery, depth + 1, axis))
    attached = {e.id for e in node.executions}
    for child in node.children:
        if child.turn.parent_tool_execution_id not in attached:
            _rows(child, depth + 1, rows, axis, links, messages, calls)


def _model_row(call: _ModelCall, depth: int, axis: _Axis) -> str:
    usage = call.usage
    text = (
        f"model {call.model} · {usage.total_tokens} tok ({usage.input_tokens} in, {usage.output_tokens} out) · "
        f"{_money(call.cost)}"
    )
    return _row("model", call.message.id, depth, escape(text), call.start, call.message.created_at, "model", axis)


def _delivery_row(delivery: DeliveryRecord, depth: int, axis: _Axis) -> str:
    state = "delivered" if delivery.delivered_at else "pending"
    text = escape(f"delivery → {delivery.destination_conversation_id} · {state}")
    end = delivery.delivered_at  # a pending one lasts until now
    return _row("delivery", delivery.id, depth, text, delivery.created_at, end, state, axis)


def _messages_block(messages: list[MessageRecord], depth: int) -> str:
    """The turn's messages, collapsed; each opens to its content (escaped, cut at ``_MESSAGE_CHARS``)."""
    items = []
    for message in messages:
        content = _content_text(message)
        if len(content) > _MESSAGE_CHARS:
            content = content[:_MESSAGE_CHARS] + f"\n… ({len(content) - _MESSAGE_CHARS} more characters in the store)"
        summary = f"#{message.sequence} {message.role} · {message.kind} · {_first_line(content)}"
        items.append(
            f"<details class='message' data-id='{escape(message.id, quote=True)}'><summary>{escape(summary)}</summary>"
            f"<pre>{escape(content)}</pre></details>"
        )
    count = _count(len(messages), "message")
    return (
        f"<details class='messages' style='padding-left:{depth * 16}px'><summary>{count}</summary>"
        + "".join(items)
        + "</details>"
    )


def _content_text(message: MessageRecord) -> str:
    """A message's text, or (tool calls, tool results, media) its content as JSON."""
    if message.kind in ("text", "context_summary") and message.text:
        return message.text
    return json.dumps(message.content, indent=1, ensure_ascii=False, default=str)


def _first_line(text: str, limit: int = 80) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _row(
    kind: str,
    record_id: str,
    depth: int,
    label: str,
    start: datetime | None,
    end: datetime | None,
    status: str,
    axis: _Axis,
) -> str:
    bar = ""
    if start is not None:
        left, width, took = axis.place(start, end)
        bar = (
            f"<div class='bar' data-id='{escape(record_id, quote=True)}' title='{duration_text(took)}' "
            f"style='left:{left:.3f}%;width:{width:.3f}%;background:{_COLOURS.get(status, '#9aa5b1')}'></div>"
        )
    pad = depth * 16
    return (
        f"<div class='row {kind}'><div class='label' style='padding-left:{pad}px'>{label}</div>"
        f"<div class='lane'>{bar}</div></div>"
    )


def _count(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {plural or noun + 's'}"


def _money(value: Any) -> str:
    return "$-" if value is None else f"${float(value):.6f}"
