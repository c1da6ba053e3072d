"""``turnkit show --html FILE [--follow]``: one self-contained HTML page with a timeline of a run's tree.

One row per turn and per tool execution, in tree order, each a bar placed on a shared time axis (absolute
positioning in percent of the tree's span), coloured by status; a bar's ``data-id`` is its turn or execution id.
Inline CSS only, no scripts and no external assets, so the page opens anywhere, offline. With ``--follow`` the file
is rewritten as the run goes on (:func:`follow_html`) and reloads itself (a ``meta refresh``) until the run ends.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from html import escape
from pathlib import Path

from turnkit._engine.turn_stream import stream_turn
from turnkit._ops.tree import TurnNode, load_trees
from turnkit.store.store import Store, utcnow
from turnkit.streaming import Restart, TextDelta, ThinkingDelta

__all__ = ["follow_html", "render_html"]

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
}

_STYLE = """
body{font:13px/1.4 system-ui,sans-serif;margin:24px;color:#1f2933}
h1{font-size:18px} h2{font-size:15px;margin-top:28px}
.row{display:flex;align-items:center;height:24px;border-bottom:1px solid #eef1f4}
.label{width:420px;box-sizing:border-box;flex:none;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.lane{position:relative;flex:1;height:18px;background:#f7f9fb}
.bar{position:absolute;top:2px;height:14px;border-radius:3px;min-width:2px;opacity:.9}
.tool .bar{top:5px;height:8px}
.axis{display:flex;justify-content:space-between;margin-left:420px;color:#7b8794;font-size:11px}
.meta{color:#616e7c}
"""


def render_html(
    trees: list[TurnNode],
    *,
    links: dict[str, str] | None = None,
    title: str = "TurnKit run",
    refresh: float | None = None,
) -> str:
    """The page for ``trees`` (``links``: workflow id -> Temporal UI address, shown on each turn's row); ``refresh``:
    the page reloads itself every so many seconds (a run being followed, :func:`follow_html`)."""
    body = [f"<h1>{escape(title)}</h1>"]
    reload = ""
    if refresh is not None:
        reload = f"<meta http-equiv='refresh' content='{refresh:g}'>"
        body.append(f"<p class='meta'>Running: this page reloads every {refresh:g} s until the run ends.</p>")
    for tree in trees:
        body.append(_tree_section(tree, links or {}))
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
        page = render_html(now, links=links(now), title=title, refresh=refresh if running else None)
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


def _tree_section(tree: TurnNode, links: dict[str, str]) -> str:
    nodes = tree.walk()
    now = utcnow()
    starts = [t for n in nodes for t in [n.turn.started_at or n.turn.created_at] + [e.started_at for e in n.executions]]
    ends = [t for n in nodes for t in [n.turn.completed_at or now] + [e.completed_at or now for e in n.executions]]
    begin = min(t for t in starts if t is not None)
    end = max(ends)
    span = max((end - begin).total_seconds(), 0.001)
    rows = [
        f"<h2>{escape(tree.turn.id)} <span class='meta'>{escape(tree.turn.agent_name)} · "
        f"{escape(tree.turn.status)} · {span:.2f}s</span></h2>",
        f"<div class='axis'><span>0 s</span><span>{span / 2:.2f} s</span><span>{span:.2f} s</span></div>",
    ]
    _rows(tree, 0, rows, begin, span, links)
    return "<section>\n" + "\n".join(rows) + "\n</section>"


def _rows(node: TurnNode, depth: int, rows: list[str], begin: datetime, span: float, links: dict[str, str]) -> None:
    turn = node.turn
    label = f"{turn.agent_name} · {turn.status} · {node.iterations} iter · {node.tokens} tok · {turn.id}"
    if turn.id in links:
        label = f"<a href='{escape(links[turn.id], quote=True)}'>{escape(label)}</a>"
    else:
        label = escape(label)
    start = turn.started_at or turn.created_at
    rows.append(_row("turn", turn.id, depth, label, start, turn.completed_at, turn.status, begin, span))
    for execution in node.executions:
        text = escape(f"tool {execution.tool_name} · {execution.status}")
        rows.append(
            _row(
                "tool",
                execution.id,
                depth + 1,
                text,
                execution.started_at,
                execution.completed_at,
                execution.status,
                begin,
                span,
            )
        )
        for child in node.children_of(execution.id):
            _rows(child, depth + 2, rows, begin, span, links)
    attached = {e.id for e in node.executions}
    for child in node.children:
        if child.turn.parent_tool_execution_id not in attached:
            _rows(child, depth + 1, rows, begin, span, links)


def _row(
    kind: str,
    record_id: str,
    depth: int,
    label: str,
    start: datetime | None,
    end: datetime | None,
    status: str,
    begin: datetime,
    span: float,
) -> str:
    bar = ""
    if start is not None:
        left = (start - begin).total_seconds() / span * 100
        took = ((end or utcnow()) - start).total_seconds()
        width = max(took / span * 100, 0.0)
        bar = (
            f"<div class='bar' data-id='{escape(record_id, quote=True)}' title='{took:.3f} s' "
            f"style='left:{left:.3f}%;width:{width:.3f}%;background:{_COLOURS.get(status, '#9aa5b1')}'></div>"
        )
    pad = depth * 16
    return (
        f"<div class='row {kind}'><div class='label' style='padding-left:{pad}px'>{label}</div>"
        f"<div class='lane'>{bar}</div></div>"
    )
