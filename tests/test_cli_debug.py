"""The debugger's verbs of the ``turnkit`` command (issue 11, "The `turnkit` command"), on the real dev server.

A lead agent delegates to a sub-agent that calls a tool; then ``show`` (text, ``--json``, ``--html``), ``replay``,
``history``, ``events --follow`` and ``db current`` run against that run, in-process through
:func:`turnkit.cli.run_command` (the function the console script runs).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

import turnkit
from tests.engine import Engine, Gate, eventually, gated_tool
from tests.faults import dev_server
from tests.history_scenarios import ends_at_completed_task, register_scenario_agents
from tests.test_history_limits import limits, step, stepper, turnkit_on
from tests.test_replay import AlteredTurnWorkflow
from turnkit import cli
from turnkit._ops.dbadmin import head_revision
from turnkit._ops.timeline import duration_text, render_html
from turnkit._ops.tree import TurnNode
from turnkit._temporal.histories import Run
from turnkit._temporal.replay import replay_runs, report
from turnkit._workflows.lane import ConversationWorkflow
from turnkit.kernel.records import DeliveryRecord, MessageRecord, ToolExecutionRecord, TurnRecord
from turnkit.plugin import PASSTHROUGH_MODULES
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, call_tools

ROOT = Path(__file__).resolve().parent.parent
#: Recorded with the deadline's timer from the start, which test_replay's AlteredTurnWorkflow keeps (v2 has none).
TURN_TOOLS_HISTORY = ROOT / "tests" / "histories" / "turn-tools-TurnWorkflow-v1.json"


@turnkit.tool(recovery="replay_safe")
def lookup(q: str) -> dict[str, Any]:
    """Look something up.

    Args:
        q: The query.
    """
    return {"answer": q.upper()}


def lead_agent(sub_tools: list[Any] | None = None) -> turnkit.Agent:
    """A lead that delegates once to ``researcher`` (which calls a tool), then answers."""
    researcher = turnkit.Agent(
        "researcher",
        description="Finds things out.",
        model="scripted",
        tools=sub_tools or [lookup],
        client=ScriptedClient(
            [call_tools((sub_tools[0].name, {}) if sub_tools else ("lookup", {"q": "x"})), "found x"]
        ),
    )
    client = ScriptedClient([call_tools(("researcher", {"task": "find x"})), "x it is"])
    return turnkit.Agent("lead", model="scripted", sub_agents=[researcher], client=client)


def options(engine: Engine) -> list[str]:
    return ["--address", engine.temporal_address, "--database-url", engine.database_url]


async def run_tree(tk: TurnKit) -> tuple[turnkit.Turn, str]:
    """A completed lead turn with one sub-agent turn; returns the lead turn and the sub-agent turn's id."""
    conversation = await tk.conversation(lead_agent())
    turn = await conversation.ask("what is x?")
    assert turn.status == "completed", turn.record.error
    (child,) = [t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id]
    return turn, child.id


async def lane_settled(tk: TurnKit, conversation_id: str) -> None:
    """The lane (still running) has its last workflow task completed, so its history is a stable prefix."""

    async def settled() -> bool:
        events = list((await tk.client.get_workflow_handle(conversation_id).fetch_history()).events)
        return ends_at_completed_task(events)

    await eventually(settled, what="the lane to settle")


async def test_show_lists_the_tree_as_text_json_and_html(
    tk: TurnKit, engine: Engine, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue 11 `turnkit show`: both turns with status, agent, tokens and the UI link; --json parses; --html
    writes one self-contained page naming both turns."""
    turn, child_id = await run_tree(tk)
    capsys.readouterr()
    ui = ["--ui", "http://ui.example:8233"]
    assert await cli.run_command(["show", turn.id, *ui, *options(engine)]) == 0
    text = capsys.readouterr().out
    lead_line = next(line for line in text.splitlines() if line.startswith(turn.id))
    assert "lead" in lead_line and "completed" in lead_line and "iter" in lead_line
    child_line = next(line for line in text.splitlines() if line.strip().startswith(child_id))
    assert "researcher" in child_line and "completed" in child_line
    assert child_line.index(child_id) > lead_line.index(turn.id)  # nested
    assert "tool researcher  completed" in text and "tool lookup  completed" in text
    assert f"http://ui.example:8233/namespaces/default/workflows/{child_id}" in text

    assert await cli.run_command(["show", "turn_" + "0" * 24, *options(engine)]) == 1
    assert "not found" in capsys.readouterr().err
    assert await cli.run_command(["show", turn.record.conversation_id, "--json", *options(engine)]) == 0
    (tree,) = json.loads(capsys.readouterr().out)["trees"]
    assert (tree["turn_id"], tree["agent"], tree["status"]) == (turn.id, "lead", "completed")
    (child,) = tree["children"]
    assert (child["turn_id"], child["status"], child["iterations"]) == (child_id, "completed", 2)
    assert child["tokens"] > 0 and tree["duration_seconds"] > 0
    assert [e["tool_name"] for e in child["tool_executions"]] == ["lookup"]

    page = tmp_path / "run.html"
    assert await cli.run_command(["show", turn.id, "--html", str(page), *options(engine)]) == 0
    html = page.read_text()
    assert turn.id in html and child_id in html and html.count("class='bar'") == 8  # 2 turns, 4 model calls, 2 tools
    assert "<script" not in html and "<link" not in html and "src=" not in html
    # Issue 38: each model call's row has the model, tokens and cost the activity recorded with its response.
    shown = Page(html)
    calls = [label for kind, label in shown.rows if kind == "model"]
    assert len(calls) == 4 and all(
        re.match(r"model scripted · [1-9]\d* tok \(\d+ in, \d+ out\) · \$", c) for c in calls
    )
    assert shown.totals[0].startswith("2 turns · 4 model calls · ")
    assert [content for _, content in shown.messages][:1] == ["what is x?"]  # the user's message opens to its text


@pytest.mark.usefixtures("through_lanes")
async def test_replay_names_every_run_and_an_exported_history_replays(
    tk: TurnKit, engine: Engine, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Issue 11 `turnkit replay` / `turnkit history`: the lane, the lead turn and the sub-agent turn replay (one
    line each, exit 0); a history exported as JSON loads with WorkflowHistory.from_json and replays."""
    turn, child_id = await run_tree(tk)
    await lane_settled(tk, turn.record.conversation_id)
    capsys.readouterr()
    assert await cli.run_command(["replay", turn.id, *options(engine)]) == 0
    out = capsys.readouterr().out
    for workflow_id, workflow_type in (
        (turn.record.conversation_id, "ConversationWorkflow"),
        (turn.id, "TurnWorkflow"),
        (child_id, "TurnWorkflow"),
    ):
        assert any(line.startswith(f"OK  {workflow_type} {workflow_id} run ") for line in out.splitlines()), out
    assert "all OK" in out

    exported = tmp_path / f"{child_id}.json"
    assert await cli.run_command(["history", child_id, "-o", str(exported), *options(engine)]) == 0
    history = WorkflowHistory.from_json(child_id, exported.read_text())
    assert history.events[0].workflow_execution_started_event_attributes.workflow_type.name == "TurnWorkflow"
    capsys.readouterr()
    assert await cli.run_command(["history", turn.id, *options(engine)]) == 0  # to stdout, for `> turn.json`
    assert WorkflowHistory.from_json(turn.id, capsys.readouterr().out).events
    assert await cli.run_command(["replay", str(exported)]) == 0  # a file needs no cluster
    assert f"OK  TurnWorkflow {child_id} run " in capsys.readouterr().out
    run_id = (await tk.client.get_workflow_handle(child_id).describe()).run_id
    assert await cli.run_command(["history", child_id, "--run-id", run_id, *options(engine)]) == 0
    assert WorkflowHistory.from_json(child_id, capsys.readouterr().out).run_id == run_id


async def test_replay_all_replays_closed_workflows_of_a_query(
    tk: TurnKit, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 11 `turnkit replay --all --query`: every matching closed workflow is replayed; running ones are not."""
    turn, child_id = await run_tree(tk)
    query = f'WorkflowId = "{turn.id}" OR WorkflowId = "{child_id}" OR WorkflowId = "{turn.record.conversation_id}"'

    async def visible() -> bool:
        found = [w async for w in tk.client.list_workflows(query) if w.close_time is not None]
        return len(found) == 2

    await eventually(visible, what="both turns in visibility")
    capsys.readouterr()
    assert await cli.run_command(["replay", "--all", "--query", query, *options(engine)]) == 0
    out = capsys.readouterr().out
    assert f"OK  TurnWorkflow {turn.id} " in out and f"OK  TurnWorkflow {child_id} " in out
    assert turn.record.conversation_id not in out  # the lane is still running
    assert "replayed 2 run(s) of 2 workflow(s): all OK" in out


async def test_replay_reports_nondeterminism_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 11 `turnkit replay`: a history the changed code no longer fits is reported with its workflow id, run
    id, the recorded event and the command issued instead, and the exit status is 1."""
    register_scenario_agents()
    history = WorkflowHistory.from_json("recorded-turn", TURN_TOOLS_HISTORY.read_text())
    run = Run("recorded-turn", history.run_id, history)
    restrictions = SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH_MODULES, "tests")
    changed = Replayer(
        workflows=[ConversationWorkflow, AlteredTurnWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=SandboxedWorkflowRunner(restrictions=restrictions),
    )
    (outcome,) = await replay_runs([run], replayer=changed, timeout=30)
    assert outcome.status == "nondeterministic"
    assert report([outcome]) == 1
    out = capsys.readouterr().out
    assert f"NONDETERMINISM  TurnWorkflow recorded-turn run {history.run_id}" in out
    assert (
        "scheduled event 'turnkit.model' does not match activity type of activity command 'turnkit.finish_turn'" in out
    )
    # The same history on today's code replays: the failure above is the change, not the tool. The run is named by
    # the workflow id its history records (issue 38), not by the file's name.
    assert await cli.run_command(["replay", str(TURN_TOOLS_HISTORY)]) == 0
    workflow_id = history.events[0].workflow_execution_started_event_attributes.workflow_id
    out = capsys.readouterr().out
    assert workflow_id.startswith("turn_") and f"OK  TurnWorkflow {workflow_id} run {history.run_id}" in out, out
    assert TURN_TOOLS_HISTORY.stem not in out


async def test_replay_is_bounded_by_a_timeout_and_skips_runs_without_a_workflow_task() -> None:
    """A run that has just continued as new (one event, no workflow task yet) is not replayable; a replay that
    hangs is cut off by the timeout."""
    full = WorkflowHistory.from_json("t", TURN_TOOLS_HISTORY.read_text())
    first_only = WorkflowHistory("t", [full.events[0]])
    run = Run("t", full.run_id, first_only)
    assert not run.replayable and Run("t", full.run_id, full).replayable
    register_scenario_agents()
    (outcome,) = await replay_runs([run], timeout=1.0)
    assert outcome.status == "failed" and "within 1 s" in outcome.message


async def test_events_follow_ends_when_the_turn_ends(
    tk: TurnKit, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 11 `turnkit events --follow`: events print as they are recorded, and the command exits 0 once the
    turn is terminal."""
    _seen.clear()
    gate = Gate()
    conversation = await tk.conversation(lead_agent([gated_tool(gate, "slow")]))
    turn = await conversation.ask("what is x?", wait=False)
    following = asyncio.create_task(
        cli.run_command(["events", turn.id, "--follow", "--interval", "0.1", *options(engine)])
    )
    await asyncio.wait_for(gate.entered.wait(), 30)
    await eventually(lambda: _printed(capsys, "tool_call.started"), what="the sub-agent's tool call to show")
    assert not following.done()
    gate.opened.set()
    assert await asyncio.wait_for(following, 30) == 0
    out = "".join(_seen) + capsys.readouterr().out
    for kind in ("turn.started", "message.user", "tool_call.created", "tool_call.completed", "turn.completed"):
        assert kind in out, out
    assert out.index("tool_call.completed") < out.rindex("turn.completed")
    assert out.splitlines()[-1].split()[1] == turn.id  # the lead's end comes last


async def test_events_of_a_conversation_are_its_turns_events_and_a_wrong_id_is_one_line(
    tk: TurnKit, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 38: `turnkit events CONVERSATION_ID` prints the events of every turn of the conversation, oldest turn
    first (it raised "too many values to unpack"); an id of neither kind, or of no record, is a one-line error."""
    agent = turnkit.Agent("chatty", model="scripted", client=ScriptedClient(["first answer", "second answer"]))
    conversation = await tk.conversation(agent)
    first = await conversation.ask("one")
    second = await conversation.ask("two")
    assert (first.status, second.status) == ("completed", "completed")
    capsys.readouterr()
    assert await cli.run_command(["events", conversation.id, *options(engine)]) == 0
    lines = capsys.readouterr().out.splitlines()
    ends = [line.split()[1] for line in lines if "turn.completed" in line]
    assert ends == [first.id, second.id], lines
    assert {line.split()[1] for line in lines} == {first.id, second.id}
    assert lines[-1].split()[1:3] == [second.id, "chatty"] and "second answer" in lines[-1]
    assert await cli.run_command(["events", conversation.id, "--follow", *options(engine)]) == 0  # all ended: returns
    assert len(capsys.readouterr().out.splitlines()) == len(lines)

    # A sub-agent's conversation: its own turn's events, not its parent's.
    _, child_id = await run_tree(tk)
    child = await tk.store.load_turn(child_id)
    capsys.readouterr()
    assert await cli.run_command(["events", child.conversation_id, *options(engine)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and {line.split()[1] for line in lines} == {child_id} and "turn.completed" in lines[-1]

    for wrong, says in (
        ("msg_" + "0" * 24, "not a turn id (turn_…) or a conversation id (conv_…): 'msg_"),
        ("conv_" + "0" * 24, "not found"),
    ):
        assert await cli.run_command(["events", wrong, *options(engine)]) == 1
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err


#: What a model, a tool or a user could put in the record to take over the terminal that prints it: clear the screen,
#: set the title, reverse the text, return to the line start and overwrite the line above.
HOSTILE = "\x1b[2J\x1b]0;pwned\x07\u202eboom\r\x1b[1A\x9b31mforged\nline"


async def test_events_and_show_print_no_terminal_escape_from_the_record(
    tk: TurnKit, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """Operator output: `turnkit events` and `turnkit show` (text and --json) print the record's content (the user's
    message, a tool's arguments and result, the model's error) without any escape sequence, control character or
    line break from it; the visible text stays."""

    @turnkit.tool
    def echo(text: str) -> dict[str, Any]:
        """Echo the text back.

        Args:
            text: What to echo.
        """
        return {"echo": text}

    def fail(request: turnkit.ModelRequest) -> turnkit.Result:
        raise turnkit.ModelError(HOSTILE)

    client = ScriptedClient([call_tools(("echo", {"text": HOSTILE})), fail])
    conversation = await tk.conversation(turnkit.Agent("echoer", model="scripted", tools=[echo], client=client))
    turn = await conversation.ask(HOSTILE)
    assert turn.status == "failed" and (turn.error or {})["message"] == HOSTILE  # the record keeps what was said
    capsys.readouterr()
    outputs: list[str] = []
    for verb in (["events", turn.id], ["events", turn.id, "--json"], ["show", turn.id], ["show", turn.id, "--json"]):
        assert await cli.run_command([*verb, *options(engine)]) == 0
        outputs.append(capsys.readouterr().out)
    events_text, events_json, show_text, show_json = outputs
    for out in outputs:
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]", out), repr(out)
    assert "pwned" not in show_text, "an OSC string (the window title) is not shown"
    assert "boom" in events_text and "forged line" in events_text and "forged line" in show_text
    assert all(line[:4].isdigit() for line in events_text.splitlines()), "a value started a line of its own"
    assert len(events_json.splitlines()) == len(events_text.splitlines())
    assert json.loads(show_json)["trees"][0]["error"]["message"] == HOSTILE  # JSON keeps the data, escaped


_seen: list[str] = []


async def _printed(capsys: pytest.CaptureFixture[str], text: str) -> bool:
    _seen.append(capsys.readouterr().out)
    return text in "".join(_seen)


async def test_db_current_and_upgrade(engine: Engine, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Issue 11 `turnkit db current | upgrade`: the head revision of a migrated store; a fresh one is upgraded."""
    capsys.readouterr()
    assert await cli.run_command(["db", "current", "--database-url", engine.database_url]) == 0
    assert capsys.readouterr().out.strip() == f"{head_revision()} (head)"
    fresh = f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}"
    assert await cli.run_command(["db", "current", "--database-url", fresh]) == 1
    assert await cli.run_command(["db", "upgrade", "--database-url", fresh]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"upgraded (empty) -> {head_revision()}"
    assert await cli.run_command(["db", "current", "--database-url", fresh]) == 0


VERBS = ["reconcile", "check", "repair", "db", "show", "replay", "history", "events", "demo", "worker", "ask"]


def test_version_is_the_installed_packages(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 38: `turnkit --version` prints the package's version from its metadata, and exits 0."""
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"turnkit {version('turnkit')}"


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_has_help(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 11: `--help` works for every verb, and every verb but demo takes the same connection options."""
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args([verb, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: turnkit {verb}")
    if verb != "demo":
        for option in ("--address", "--namespace", "--database-url", "--task-queue"):
            assert option in out


def test_turnkit_worker_help() -> None:
    """Issue 11: `turnkit worker --help` prints the worker's options (it used to print nothing useful)."""
    done = subprocess.run(
        [sys.executable, "-m", "turnkit.cli", "worker", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: turnkit worker") and "--app" in done.stdout and "--grace" in done.stdout


async def test_replay_walks_every_continued_as_new_run(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 11 `turnkit replay`: a turn that continued as new (a private dev server with a low history limit) is
    replayed run by run, every run of its chain named."""
    async with dev_server(*limits()) as server, turnkit_on(server, database_url) as tk:
        agent = turnkit.Agent("long-turn", model="scripted", tools=[step], client=stepper(12), max_iterations=20)
        turn = await (await tk.conversation(agent)).ask("go")
        assert turn.status == "completed", turn.record.error
        runs = [w.run_id async for w in tk.client.list_workflows(f"WorkflowId = '{turn.id}'")]
        assert len(runs) >= 2
        capsys.readouterr()
        assert (
            await cli.run_command(["replay", turn.id, "--address", server.address, "--database-url", database_url]) == 0
        )
    out = capsys.readouterr().out
    replayed = {line.split(" run ")[1].split()[0] for line in out.splitlines() if f"TurnWorkflow {turn.id} run" in line}
    assert replayed == set(runs), out


def parallel_tree() -> TurnNode:
    """A lead turn whose two sub-agent turns ran at the same time (records as the store returns them)."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def at(seconds: float) -> datetime:
        return t0 + timedelta(seconds=seconds)

    def turn(
        turn_id: str, agent: str, start: float, end: float, parent: str | None = None, via: str | None = None
    ) -> TurnRecord:
        return TurnRecord(
            id=turn_id, conversation_id=f"conv_{turn_id[5:]}", agent_name=agent, root_turn_id="turn_lead",
            parent_turn_id=parent, parent_tool_execution_id=via, status="completed", started_at=at(start),
            completed_at=at(end), created_at=at(start), updated_at=at(end), usage={"input_tokens": 10},
        )  # fmt: skip

    def call(execution_id: str, turn_id: str, name: str, start: float, end: float) -> ToolExecutionRecord:
        return ToolExecutionRecord(
            id=execution_id, turn_id=turn_id, tool_call_id=f"call_{execution_id}", tool_name=name,
            status="completed", started_at=at(start), completed_at=at(end), created_at=at(start), updated_at=at(end),
        )  # fmt: skip

    alpha = TurnNode(
        turn("turn_alpha", "alpha", 1.0, 3.0, "turn_lead", "tool_a"), [call("tool_x", "turn_alpha", "lookup", 1.5, 2.5)]
    )
    beta = TurnNode(
        turn("turn_beta", "beta", 1.2, 3.5, "turn_lead", "tool_b"), [call("tool_y", "turn_beta", "lookup", 2.0, 3.0)]
    )
    lead_calls = [call("tool_a", "turn_lead", "alpha", 0.9, 3.1), call("tool_b", "turn_lead", "beta", 0.9, 3.6)]
    return TurnNode(turn("turn_lead", "lead", 0.0, 4.0), lead_calls, children=[alpha, beta])


def bars(html: str) -> dict[str, tuple[float, float]]:
    """``data-id`` -> (left %, right %) of every bar on the page."""
    found = re.findall(r"data-id='([^']+)'[^>]*left:([\d.]+)%;width:([\d.]+)%", html)
    return {bar_id: (float(left), float(left) + float(width)) for bar_id, left, width in found}


def test_timeline_bars_of_parallel_sub_agents_overlap() -> None:
    """Issue 11 `turnkit show --html`: one bar per turn and tool execution on one time axis; parallel sub-agents'
    bars overlap, each sits inside its parent's."""
    placed = bars(render_html([parallel_tree()]))
    assert set(placed) == {"turn_lead", "turn_alpha", "turn_beta", "tool_a", "tool_b", "tool_x", "tool_y"}
    assert placed["turn_lead"] == (0.0, 100.0)
    (a_left, a_right), (b_left, b_right) = placed["turn_alpha"], placed["turn_beta"]
    assert a_left < b_right and b_left < a_right  # they overlap
    assert placed["tool_a"][0] <= a_left and a_right <= placed["tool_a"][1]


class Page(HTMLParser):
    """What a timeline page shows, as a browser parses it: each row's kind and label text, the bars' ids, each tree's
    totals and axis labels, each message's summary and content, and every element's tag."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.rows: list[tuple[str, str]] = []
        self.bars: list[str] = []
        self.totals: list[str] = []
        self.axis: list[str] = []
        self.messages: list[tuple[str, str]] = []
        self.tags: set[str] = set()
        self._into: str | None = None  # where text goes: "label", "totals", "axis", "summary", "pre"
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        classes = (dict(attrs).get("class") or "").split()
        if "row" in classes:
            self.rows.append((classes[1], ""))
        elif "label" in classes:
            self._into = "label"
        elif "bar" in classes:
            self.bars.append(dict(attrs)["data-id"] or "")
        elif "totals" in classes:
            self.totals.append("")
            self._into = "totals"
        elif "axis" in classes:
            self.axis.clear()
            self._into = "axis"
        elif "message" in classes:
            self.messages.append(("", ""))
        elif tag == "summary" and self.messages and not self.messages[-1][0]:
            self._into = "summary"
        elif tag == "pre":
            self._into = "pre"

    def handle_endtag(self, tag: str) -> None:
        if tag in ("div", "summary", "pre"):  # what a row's label, the totals, the axis, a message end with
            self._into = None

    def handle_data(self, data: str) -> None:
        if self._into == "label":
            kind, text = self.rows[-1]
            self.rows[-1] = (kind, text + data)
        elif self._into == "totals":
            self.totals[-1] += data
        elif self._into == "axis":
            self.axis.append(data)
        elif self._into == "summary":
            self.messages[-1] = (data, self.messages[-1][1])
        elif self._into == "pre":
            self.messages[-1] = (self.messages[-1][0], self.messages[-1][1] + data)


def quick_turn() -> tuple[TurnNode, dict[str, list[MessageRecord]]]:
    """A turn of 4 ms: a model call asking for a tool, the tool, a model call answering, a delivery; its messages say
    things a page must not run."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def at(ms: float) -> datetime:
        return t0 + timedelta(milliseconds=ms)

    turn = TurnRecord(
        id="turn_quick", conversation_id="conv_quick", agent_name="<b>quick</b>", root_turn_id="turn_quick",
        status="completed", started_at=at(0), completed_at=at(4), created_at=at(0), updated_at=at(4),
        usage={"input_tokens": 30, "output_tokens": 12}, cost=0.0042,
    )  # fmt: skip
    tool = ToolExecutionRecord(
        id="tool_q", turn_id="turn_quick", tool_call_id="call_1", tool_name="lookup", status="completed",
        started_at=at(1.5), completed_at=at(2), created_at=at(1.5), updated_at=at(2),
    )  # fmt: skip
    delivery = DeliveryRecord(
        id="delivery_q", source_conversation_id="conv_quick", destination_conversation_id="conv_other",
        source_turn_id="turn_quick", key="k", created_at=at(3.5), delivered_at=at(3.8), updated_at=at(3.8),
    )  # fmt: skip

    def message(seq: int, role: Any, kind: Any, content: list[dict[str, Any]], ms: float, **meta: Any) -> MessageRecord:
        return MessageRecord(
            id=f"msg_{seq}", conversation_id="conv_quick", turn_id="turn_quick", role=role, kind=kind, sequence=seq,
            content=content, created_at=at(ms), metadata=meta,
        )  # fmt: skip

    def call(ms: float, input_tokens: int, output_tokens: int, cost: float) -> dict[str, Any]:
        usage = {"input_tokens": input_tokens, "output_tokens": output_tokens}
        made = {"model": "gpt-<i>", "usage": usage, "cost": cost, "requested_at": at(ms).isoformat()}
        return {"request_id": f"req_{ms}", "model_call": made}

    messages = [
        message(1, "user", "text", [{"type": "text", "text": "<script>alert('x')</script> & more"}], 0),
        message(2, "assistant", "tool_call", [{"type": "tool_call", "id": "call_1", "name": "lookup"}], 1.2,
                **call(0.2, 10, 5, 0.001)),
        message(3, "tool", "tool_result", [{"type": "tool_result", "content": "</pre><h3>found</h3>"}], 2),
        message(4, "assistant", "text", [{"type": "text", "text": "the answer"}], 3.4, **call(2.1, 20, 7, 0.0032)),
        message(5, "assistant", "text", [{"type": "text", "text": "Saved."}], 3.5),  # a terminal tool's: no call
    ]  # fmt: skip
    return TurnNode(turn, [tool], [delivery]), {"turn_quick": messages}


def test_timeline_shows_model_calls_deliveries_totals_contents_and_a_millisecond_axis() -> None:
    """Issue 38 `turnkit show --html`: a model call's row says its model, tokens and cost, a delivery has its row, the
    tree's totals are above it, a turn of 4 ms has the axis 0 ms / 2 ms / 4 ms, and each message's content is in a
    collapsed block, HTML-escaped (the user's script and the tool's tags are text, never elements)."""
    tree, messages = quick_turn()
    page = Page(render_html([tree], messages=messages))
    assert [kind for kind, _ in page.rows] == ["turn", "model", "tool", "model", "delivery"]
    labels = [label for _, label in page.rows]
    assert labels[0].startswith("<b>quick</b> · completed · ") and "$0.004200" in labels[0]
    assert labels[1] == "model gpt-<i> · 15 tok (10 in, 5 out) · $0.001000"
    assert labels[3] == "model gpt-<i> · 27 tok (20 in, 7 out) · $0.003200"
    assert labels[2] == "tool lookup · completed" and labels[4] == "delivery → conv_other · delivered"
    assert page.bars == ["turn_quick", "msg_2", "tool_q", "msg_4", "delivery_q"]
    assert page.totals == [
        "1 turn · 2 model calls · 42 tokens · $0.004200 · 1 tool execution · 1 delivery"
    ]  # fmt: skip
    assert page.axis == ["0 ms", "2 ms", "4 ms"]
    assert [summary.split(" · ")[0] for summary, _ in page.messages] == [
        "#1 user",
        "#2 assistant",
        "#3 tool",
        "#4 assistant",
        "#5 assistant",
    ]
    assert page.messages[0][1] == "<script>alert('x')</script> & more"
    assert "</pre><h3>found</h3>" in page.messages[2][1]
    assert page.messages[3][1] == "the answer"
    assert not page.tags & {"script", "b", "i", "h3"}  # every text from the record stayed text
    bars_at = bars(render_html([tree], messages=messages))
    assert bars_at["msg_2"] == pytest.approx((5.0, 30.0)) and bars_at["turn_quick"] == pytest.approx((0.0, 100.0))


@pytest.mark.parametrize(
    ("seconds", "span", "text"),
    [(0.0, 0.004, "0 ms"), (0.0015, 0.003, "1.5 ms"), (0.35, 0.7, "350 ms"), (1.234, 2.5, "1.2 s"),
     (45.6, 90.0, "46 s"), (300.0, 600.0, "5 min"), (2.0, None, "2 s")],
)  # fmt: skip
def test_durations_read_in_the_unit_the_span_needs(seconds: float, span: float | None, text: str) -> None:
    """Issue 38: the timeline's axis and durations: ms under a second, s under two minutes, min beyond."""
    assert duration_text(seconds, span) == text


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium package (headless)")
def test_timeline_renders_in_headless_chromium(tmp_path: Path) -> None:
    """Issue 11 `turnkit show --html`: the page renders offline in headless Chromium, and a screenshot is taken."""
    page = tmp_path / "timeline.html"
    page.write_text(render_html([parallel_tree()], title="parallel"))
    shot = tmp_path / "timeline.png"
    browser = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,400"]
    dom = subprocess.run([*browser, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=60)
    assert dom.returncode == 0 and "turn_alpha" in dom.stdout and "turn_beta" in dom.stdout, dom.stderr
    taken = subprocess.run([*browser, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=60)
    assert taken.returncode == 0, taken.stderr
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000
