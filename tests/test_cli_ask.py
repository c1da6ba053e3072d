"""``turnkit ask --app MODULE AGENT TEXT`` (issue 11, "The `turnkit` command"): one turn from the command line, with
live progress and the answer, run as a subprocess (off the event loop) on the scripted offline model
(``tests/ask_app.py``: a lead that calls a tool, then a sub-agent, then answers)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.engine import Engine, eventually
from tests.workers import WorkerProcess
from turnkit._ops.ask import live_pollers
from turnkit.store.store import Store

ROOT = Path(__file__).resolve().parent.parent
sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@dataclass
class Ran:
    code: int
    out: str
    err: str
    pid: int


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> Ran:
    process = subprocess.Popen(
        [sys.executable, "-m", "turnkit.cli", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = process.communicate(timeout=180)
    return Ran(process.returncode, out, err, process.pid)


async def turnkit_cli(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> Ran:
    """Run ``python -m turnkit.cli ARGS`` in a thread: a blocked event loop would stall the session's dev server
    client and any in-process worker."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "TURNKIT_"))}
    environment = {**clean, "PYTHONPATH": str(ROOT), **(env or {})}
    return await asyncio.to_thread(_run, list(args), cwd, environment)


def cluster(engine: Engine) -> list[str]:
    return [
        "--address",
        engine.temporal_address,
        "--database-url",
        engine.database_url,
        "--task-queue",
        engine.tk.task_queue,
    ]


def answer_pid(text: str) -> int:
    match = re.search(r'"pid": (\d+)', text)
    assert match, text
    return int(match.group(1))


async def test_help() -> None:
    """``turnkit ask --help`` works and names the arguments."""
    ran = await turnkit_cli("ask", "--help")
    assert ran.code == 0, ran.err
    for word in ("AGENT", "TEXT", "--app", "--worker", "--json", "--database-url", "--address", "--task-queue"):
        assert word in ran.out


async def test_ask_prints_progress_and_the_answer(engine: Engine) -> None:
    """No worker polls the task queue: ask runs one in-process, prints the iterations, tool calls and the sub-agent's
    turn as they happen, then the answer on stdout; the turn record in the store agrees."""
    ran = await turnkit_cli("ask", "--app", "tests.ask_app", "lead", "What is Temporal?", *cluster(engine))
    assert ran.code == 0, ran.err
    assert ran.out.startswith("The answer: ") and ran.out.rstrip().endswith("(checked)")
    assert answer_pid(ran.out) == ran.pid  # the tool ran in the CLI's own in-process worker
    err = ran.err
    assert f"worker: in-process (no worker polls task queue {engine.tk.task_queue})" in err
    # Issue 38: the model's text is printed as it streams (PostgreSQL, or the in-process worker), a line per call.
    assert "live text: on (" in err, err
    assert re.search(r"^ +\d+\.\d\ds  > The answer: .*\(checked\)$", err, re.M), err
    progress = [
        "lead: iteration 1: Looking it up. · calls lookup",
        'lead: calls lookup {"topic": "temporal"}',
        "lead: lookup completed:",
        "lead: iteration 2: calls checker",
        "checker: sub-agent turn turn_",
        "checker: iteration 1: the fact holds",
        "checker: sub-agent turn completed: the fact holds",
        "lead: checker completed:",
        "lead: iteration 3: The answer:",
        "completed in ",
    ]
    positions = [err.find(line) for line in progress]
    assert -1 not in positions, err
    assert positions == sorted(positions), err  # in the order they happened
    assert "3 iteration(s) · 2 tool call(s) · 1 sub-agent turn(s)" in err
    assert re.search(r"^ +\d+\.\d\ds {4}checker: ", err, re.M), err  # the sub-agent is indented under the lead
    turn_id = re.search(r"turnkit ask: agent lead · turn (turn_\w+)", err)
    assert turn_id, err
    record = await engine.tk.store.load_turn(turn_id.group(1))
    assert record.status == "completed" and ran.out.strip() == record.output_text


@pytest.mark.crash
@sqlite_only
async def test_ask_uses_the_worker_that_polls_the_queue(engine: Engine) -> None:
    """A worker process polls the task queue: ask leaves the turn to it (the tool runs in that process), and says so."""
    worker = await WorkerProcess.for_engine(engine, app="tests.ask_app")
    try:

        async def polling() -> bool:
            return bool(await live_pollers(engine.tk))

        await eventually(polling, what="the worker process polling the task queue")
        ran = await turnkit_cli("ask", "--app", "tests.ask_app", "lead", "What is Temporal?", *cluster(engine))
    finally:
        assert await worker.stop() == 0
    assert ran.code == 0, ran.err
    assert f"worker: 1 worker(s) polling task queue {engine.tk.task_queue}" in ran.err
    assert answer_pid(ran.out) == worker.pid


@sqlite_only
async def test_failed_turn_exits_non_zero(engine: Engine) -> None:
    """A turn that fails (the model raises ModelError) prints why on stderr, nothing on stdout, and exits 1."""
    ran = await turnkit_cli("ask", "--app", "tests.ask_app", "broken", "hi", *cluster(engine))
    assert ran.code == 1, ran.err
    assert ran.out == ""
    assert re.search(r"turn turn_\w+ failed: TurnKit::ModelError: the provider said no", ran.err), ran.err
    assert "Traceback" not in ran.err  # the SDK's activity tracebacks are kept out (--verbose shows them)


@sqlite_only
async def test_json_prints_the_final_turn_record(engine: Engine) -> None:
    """``--json`` prints the final turn record as JSON on stdout; ``--quiet`` leaves stderr empty."""
    ran = await turnkit_cli("ask", "--app", "tests.ask_app", "lead", "hi", "--json", "--quiet", *cluster(engine))
    assert ran.code == 0, ran.err
    record = json.loads(ran.out)
    assert record["status"] == "completed" and record["agent_name"] == "lead"
    assert record["output_text"].startswith("The answer: ")
    assert record["id"].startswith("turn_") and record["conversation_id"].startswith("conv_")
    assert ran.err == ""


async def test_unknown_agent_is_a_usage_error() -> None:
    """An agent the app does not register: exit 2, naming the agents it does register (nothing is started)."""
    ran = await turnkit_cli("ask", "--app", "tests.ask_app", "nobody", "hi")
    assert ran.code == 2
    assert "no agent 'nobody' in tests.ask_app (registered: broken, checker, lead)" in ran.err


async def test_ask_on_the_embedded_defaults(tmp_path: Path) -> None:
    """Nothing configured: ask starts the embedded dev server and a SQLite store under ./.turnkit/, runs the turn on
    an in-process worker and stops the server again."""
    ran = await turnkit_cli("ask", "--app", "tests.ask_app", "lead", "hi", cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert ran.code == 0, ran.err
    assert "worker: in-process (embedded dev server: no other worker can poll it)" in ran.err
    assert ran.out.startswith("The answer: ")
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / '.turnkit' / 'turnkit.db'}", migrate=False)
    try:
        [turn] = await store.list_turns(agent_name="lead")
        assert turn.status == "completed"
    finally:
        await store.close()
