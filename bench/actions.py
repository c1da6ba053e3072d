"""Temporal Cloud actions per turn, counted from workflow histories: TurnKit's and each peer's.

What counts as an action, event by event, is :mod:`bench.action_counts`.

The driver (``python -m bench.actions``, ``make bench-actions``) runs, in one :mod:`bench.peers.serve` process per
system (each with a dev server of its own), turns of the peers' workload (:mod:`bench.peers.workload`) at each K and
counts the actions over every workflow a turn touched: its workflow, its children, and of TurnKit's conversation
lane only the events that turn added. TurnKit runs three turns in one conversation (:data:`TURNKIT_TURNS`), each
peer two fresh ones (which must agree). Beside each count, the dev server's counter over the same turns.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import sys
import tempfile
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.action_counts import MARKERS, billable
from bench.peers.__main__ import FLOOR, LOCAL_MODEL_PEERS, PEERS, Spec, start_child
from bench.single_server import git_commit


def _specs() -> list[Spec]:
    """Every column: the floor, the peers (LangGraph's among them: bench/peers/langgraph_app.py, counted when
    ``temporalio-langgraph`` is installed), TurnKit with its tool as an activity and as a local activity, and with
    ``settings.search_attributes`` off (what the closing ``TurnKitTurnStatus`` upsert costs, by difference)."""
    return [
        FLOOR,
        *PEERS,
        Spec("langgraph", "langgraph", "LangGraph + Temporal", peer=True),
        *LOCAL_MODEL_PEERS,
        Spec("turnkit", "turnkit", "TurnKit (SQLite)", peer=False),
        Spec("turnkit_local", "turnkit", "TurnKit (SQLite, local tool)", peer=False, local_tool=True),
        Spec(
            "turnkit_unsearched",
            "turnkit",
            "TurnKit (SQLite, search attributes off)",
            peer=False,
            search_attributes=False,
        ),
    ]


#: TurnKit's turns per K in one conversation, each asked once the one before has ended: the first, the second and a
#: later one (an idle conversation's turns run without its lane; a turn asked while another runs takes the lane).
TURNKIT_TURNS = ("first turn", "2nd turn", "later turn")


async def measure(ks: list[int], systems: list[str], logdir: Path) -> dict[str, dict[str, Any]]:
    """Each system's actions per turn at each K (``counts``) and its dev server's ``action`` metric over the same
    turns (``server``), one :mod:`bench.peers.serve` process (and dev server) at a time."""
    specs = [s for s in _specs() if s.system in systems]
    found: dict[str, dict[str, Any]] = {}
    for spec in specs:
        print(f"{spec.title}...", file=sys.stderr, flush=True)
        child = await start_child(spec, [], logdir)
        try:
            turns = len(TURNKIT_TURNS) if spec.system == "turnkit" else 2
            found[spec.key] = await child.ask({"op": "actions", "ks": ks, "turns": turns}, 600)
        finally:
            await child.stop()
    return found


def _total(counts: dict[str, int]) -> int:
    return billable(Counter(counts))


def _parts(counts: dict[str, int]) -> str:
    short = {
        "workflow started": "start",
        "child workflow start": "child",
        "timer started": "timer",
        "search attribute upsert": "upsert",
        "signal": "signal",
        "update": "update",
        "activity attempt": "act",
        MARKERS: "marker-task",
    }
    return " + ".join(f"{n} {short.get(name, name)}" for name, n in sorted(counts.items()))


def table(ks: list[int], found: dict[str, dict[str, Any]], titles: dict[str, str]) -> list[str]:
    """Markdown: one row per system and turn kind, one column per K (total, then its parts)."""
    lines = ["| system | turn | " + " | ".join(f"K = {k}" for k in ks) + " |", "|---|---|" + "---|" * len(ks)]
    for key, measured in found.items():
        per_k = measured["counts"]
        kinds = TURNKIT_TURNS if key.startswith("turnkit") else ("every turn",)
        for index, kind in enumerate(kinds):
            cells = []
            for k in ks:
                turns = per_k[str(k)]
                if len({_total(t) for t in turns}) > 1 and not key.startswith("turnkit"):
                    raise RuntimeError(f"{key} K={k}: turns differ: {turns}")
                counts = turns[index]
                cells.append(f"**{_total(counts)}** ({_parts(counts)})")
            lines.append(f"| {titles[key]} | {kind} | " + " | ".join(cells) + " |")
    return lines


def check_table(ks: list[int], found: dict[str, dict[str, Any]], titles: dict[str, str]) -> list[str]:
    """Markdown: per system and K, the histories' count summed over the turns run, beside the dev server's ``action``
    metric over the same turns (by its action types)."""
    lines = ["| system | K | turns | from the histories | the server's `action` metric |", "|---|---|---|---|---|"]
    for key, measured in found.items():
        for k in ks:
            turns = measured["counts"][str(k)]
            server = measured["server"].get(str(k), {})
            parts = ", ".join(f"{n} {kind}" for kind, n in sorted(server.items()))
            total = sum(_total(t) for t in turns)
            lines.append(f"| {titles[key]} | {k} | {len(turns)} | {total} | {sum(server.values())} ({parts}) |")
    return lines


def main() -> None:
    """``python -m bench.actions``: the table of actions per turn (:func:`table`), printed and written as JSON."""
    parser = argparse.ArgumentParser(description="Temporal Cloud actions per turn, TurnKit and the peers")
    parser.add_argument("--k", default="1,3,8", help="tool-loop iterations per turn, comma-separated")
    default = "bare,openai_agents,pydantic_ai,langgraph,turnkit"
    if importlib.util.find_spec("temporalio.langgraph") is None:
        default = default.replace("langgraph,", "")
    parser.add_argument("--systems", default=default)
    parser.add_argument("--json", type=Path, help="also write the raw counts here")
    args = parser.parse_args()
    ks = [int(k) for k in args.k.split(",")]

    titles = {s.key: s.title for s in _specs()}
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    sha = git_commit()
    with tempfile.TemporaryDirectory(prefix="bench-actions-") as tmp:
        found = asyncio.run(measure(ks, args.systems.split(","), Path(tmp)))
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC · git {sha} · load average {load} at start")
    print("\n".join(table(ks, found, titles)))
    print()
    print("\n".join(check_table(ks, found, titles)))
    if args.json:
        args.json.write_text(json.dumps(found, indent=2))


if __name__ == "__main__":
    main()
