"""The demo runs the job TurnKit exists for (issue 11, "The demo shows the main job").

A real ``python -m turnkit.demo`` runs twice in an empty directory (no ``.turnkit/``, as in a fresh clone; the second
run reuses the SQLite file and the dev server's database). The tree each run left in the store is then checked: the
lead completed, its four sub-agents completed and ran at the same time, the launched one's completion callback was
delivered and woke the lead, the at-most-once tool ran once, and the budget was counted over the whole tree. The same
job also runs on a standalone ``python worker.py --app turnkit.demo`` (the module doubles as an application module).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine import Engine
from tests.test_cli_debug import bars
from tests.workers import ROOT, WorkerProcess
from turnkit import cli, demo
from turnkit._ops.tree import TurnNode, load_trees
from turnkit.kernel.records import TreeUsage
from turnkit.store import Store

SUB_AGENTS = ["archivist", "fact_checker", "researcher", "surveyor"]


def overlapping(nodes: list[TurnNode]) -> bool:
    """Whether every turn in ``nodes`` ran at the same time as every other (each started before the other ended)."""
    spans = [(node.turn.started_at, node.turn.completed_at) for node in nodes]
    assert all(start and end for start, end in spans), spans
    return all(a[0] < b[1] for a in spans for b in spans)  # type: ignore[operator]


async def check_demo_tree(store: Store, conversation_id: str, cwd: Path) -> tuple[TurnNode, TurnNode]:
    """Assert the tree the demo job leaves in the store; returns the lead's tree and the callback's turn."""
    trees = await load_trees(store, conversation_id)
    assert [tree.turn.agent_name for tree in trees] == ["lead", "lead"]
    lead, woken = trees
    assert lead.turn.status == "completed", lead.turn.error

    # Four sub-agents, all completed, all running at the same time.
    children = lead.children
    assert sorted(child.turn.agent_name for child in children) == SUB_AGENTS
    assert all(child.turn.status == "completed" for child in children), [c.turn.error for c in children]
    assert all(child.turn.root_turn_id == lead.turn.id for child in children)
    assert overlapping(children)

    # The launched fact-checker: started by launch_agent with a callback, which delivered its result to the lead's
    # conversation and woke it for a second turn (its own root) that read the result.
    [launch] = [e for e in lead.executions if e.tool_name == "launch_agent"]
    [checker] = [child for child in children if child.turn.agent_name == "fact_checker"]
    assert launch.status == "completed" and launch.result is not None
    assert launch.result["turn_id"] == checker.turn.id and checker.turn.parent_tool_execution_id == launch.id
    assert checker.turn.options.callback_conversation_id == conversation_id
    [delivery] = checker.deliveries
    assert delivery.key == f"completion:{checker.turn.id}" and delivery.destination_conversation_id == conversation_id
    assert delivery.delivered_at is not None and delivery.message_id is not None
    assert woken.turn.conversation_id == conversation_id and woken.turn.status == "completed"
    assert woken.turn.root_turn_id == woken.turn.id and woken.children == []
    assert woken.turn.output_text == (f"The fact-checker reported back (completed): {checker.turn.output_text}")

    # The at-most-once tool ran once, in the archivist's turn, and wrote one note.
    executions = [e for node in lead.walk() for e in node.executions]
    [save] = [e for e in executions if e.tool_name == "save_note"]
    [archivist] = [child for child in children if child.turn.agent_name == "archivist"]
    assert demo.save_note.recovery == "at_most_once"
    assert save.turn_id == archivist.turn.id and save.status == "completed" and save.result is not None
    note = cwd / save.result["saved"]
    assert json.loads(note.read_text())["title"] == "Brief: durable agents"

    # One budget for the whole tree: limits snapshotted on the root, usage summed over every turn and execution.
    limits = lead.turn.options.budget_limits
    assert limits is not None
    assert (limits.max_spend, limits.max_iterations, limits.max_tool_executions) == (0.05, 20, 20)
    async with store.atomic() as tx:
        usage = await tx.tree_usage(lead.turn.id)
    assert usage == TreeUsage.from_records([node.turn for node in lead.walk()], executions)
    assert usage.iterations == 2 + 2 + 2 + 3 + 2  # lead, fact_checker, researcher, surveyor, archivist
    assert usage.tool_executions == 4 + 1 + 2 + 2 + 1
    assert lead.turn.cost is not None and lead.turn.cost < usage.cost < limits.max_spend
    return lead, woken


def run_demo_process(cwd: Path) -> str:
    """``python -m turnkit.demo`` in ``cwd`` on the embedded defaults; returns its output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("TEMPORAL_ADDRESS", "TURNKIT_DATABASE_URL"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-m", "turnkit.demo"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def line_after(output: str, prefix: str) -> str:
    [found] = [line[len(prefix) :] for line in output.splitlines() if line.startswith(prefix)]
    return found.split()[0]


@pytest.mark.slow
async def test_demo_runs_the_main_job_twice_from_a_fresh_directory(tmp_path: Path) -> None:
    """Issue 11 "The demo shows the main job": a lead fans out to parallel sub-agents (one launched with a completion
    callback, one using an at-most-once tool) under a tree budget; the demo prints ``turnkit show`` of the tree with
    the Temporal UI links and writes the HTML timeline, from a fresh directory and again on the state it left."""
    assert not (tmp_path / ".turnkit").exists()
    conversations: list[str] = []
    for _ in range(2):
        output = await asyncio.to_thread(run_demo_process, tmp_path)
        conversation_id = line_after(output, "$ turnkit show ")
        conversations.append(conversation_id)
        store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / '.turnkit' / 'turnkit.db'}")
        try:
            lead, woken = await check_demo_tree(store, conversation_id, tmp_path)
        finally:
            await store.close()
        turns = [node.turn for node in lead.walk()] + [woken.turn]
        ui = line_after(output, "Temporal UI: ")
        assert ui.startswith("http://127.0.0.1:")
        for turn in turns:  # `turnkit show` of both trees: each turn's line, with its UI link
            assert f"{turn.id}  {turn.agent_name}  completed  " in output
            assert f"ui: {ui}/namespaces/default/workflows/{turn.id}" in output
        assert f"{ui}/namespaces/default/workflows/{conversation_id}" in output  # the lane
        assert f"tree: 5 turn(s) · {sum(node.tokens for node in lead.walk())} tokens" in output
        assert "4 of 4 were running at once" in output

        # The timeline of this run: one bar per turn, and the sub-agents' bars overlap.
        timeline = Path(line_after(output, "Timeline: "))
        assert timeline == (tmp_path / ".turnkit" / "demo-timeline.html").resolve()
        placed = bars(timeline.read_text())
        assert {turn.id for turn in turns} <= set(placed)
        spans = [placed[child.turn.id] for child in lead.children]
        assert all(a[0] < b[1] for a in spans for b in spans), spans
    assert conversations[0] != conversations[1]
    assert len(list((tmp_path / ".turnkit" / "notes").iterdir())) == 2  # one note per run


async def test_worker_py_runs_the_demo_app(engine: Engine, tmp_path: Path) -> None:
    """Issue 11: ``python worker.py --app turnkit.demo`` runs the demo's whole job (this process only submits it)."""
    worker = await WorkerProcess.for_engine(engine, app="turnkit.demo", cwd=tmp_path)
    try:
        run = await demo.run_job(engine.tk)
    finally:
        assert await worker.stop() == 0
    lead, woken = await check_demo_tree(engine.tk.store, run.conversation.id, tmp_path)
    assert [tree.turn.id for tree in run.trees] == [lead.turn.id, woken.turn.id]
    assert run.lead_turn.id == lead.turn.id and run.callback_turn.id == woken.turn.id
    assert run.tree_usage.iterations == 11 and run.limits.max_spend == 0.05


@pytest.mark.slow
async def test_demo_hold_prints_the_address_the_debugger_verbs_need(tmp_path: Path) -> None:
    """Issue 38: ``python -m turnkit.demo --hold`` prints the held dev server's address (a free port, not 7233), and
    ``turnkit history`` of the demo's lead turn works with it from another process while the server is held."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("TEMPORAL_ADDRESS", "TURNKIT_DATABASE_URL"):
        env.pop(name, None)
    held = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "turnkit.demo", "--hold", cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert held.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(120):
            while not lines or not lines[-1].startswith("  turnkit history "):
                line = await held.stdout.readline()
                assert line, "the demo ended before it printed the address:\n" + "\n".join(lines)
                lines.append(line.decode().rstrip("\n"))
        output = "\n".join(lines)
        address = line_after(output, "Temporal server: ")
        assert re.fullmatch(r"127\.0\.0\.1:\d+", address), address
        assert f"  turnkit check --address {address}" in output
        lead_turn = line_after(output, "lead turn      ").rstrip(":")
        exported = tmp_path / "lead.json"
        verb = ["history", lead_turn, "--address", address, "-o", str(exported)]
        assert await cli.run_command(verb) == 0
        started = json.loads(exported.read_text())["events"][0]["workflowExecutionStartedEventAttributes"]
        assert started["workflowType"]["name"] == "TurnWorkflow" and started["workflowId"] == lead_turn
    finally:
        held.terminate()  # SIGTERM: the demo stops its worker and the dev server
        await asyncio.wait_for(held.wait(), 60)
