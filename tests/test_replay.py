"""Replay tests: recorded histories must replay against today's workflow code (style guide B6).

* Every ``tests/histories/*.json`` (recorded by ``make histories``) replays without non-determinism.
* A scenario run now on the dev server replays at once (catches non-determinism within one version of the code).
* A negative control: a deliberately changed ``TurnWorkflow`` must fail to replay a recorded history.

``TurnWorkflow`` reads how to dispatch each call from its model step (histories recorded before that read the agent
registry while replaying), so each test registers the scenario agents first (the autouse fixture empties the
registry before every test).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

import turnkit
from tests.history_scenarios import SCENARIOS, TEAM_WORKFLOWS, patch_markers, register_scenario_agents, workflow_id
from turnkit._workflows.lane import ConversationWorkflow
from turnkit._workflows.registry import ALL_WORKFLOWS
from turnkit.kernel.payloads import FinishTurn, TurnInput, TurnOutcome
from turnkit.plugin import PASSTHROUGH_MODULES, TurnKitPlugin
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, call_tools

HISTORIES = sorted(Path(__file__).parent.glob("histories/*.json"))


def turnkit_replayer() -> Replayer:
    """A replayer configured exactly like a TurnKit worker, which also runs a team's own workflows (the scenarios').

    ``TurnKitPlugin`` itself registers ``ALL_WORKFLOWS``; passing them again would register every workflow twice
    (``ValueError: More than one workflow named ...``), so the replayer gets them from the plugin only, after the
    team's, as a team's worker does.
    """
    replayer = Replayer(workflows=TEAM_WORKFLOWS, plugins=[TurnKitPlugin(strict_sandbox=True)])
    assert list(replayer.config(active_config=True).get("workflows", [])) == [*TEAM_WORKFLOWS, *ALL_WORKFLOWS]
    return replayer


def load_history(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text())


def test_histories_are_recorded() -> None:
    assert len(HISTORIES) >= 5, "run `make histories` to record tests/histories/*.json"
    scenarios = {path.stem.rsplit("-", 2)[0] for path in HISTORIES}  # <scenario>[-<label>]-<WorkflowType>-v<N>
    assert set(SCENARIOS) <= scenarios


@pytest.mark.parametrize("path", HISTORIES, ids=[path.stem for path in HISTORIES])
async def test_recorded_history_replays(path: Path) -> None:
    register_scenario_agents()
    await turnkit_replayer().replay_workflow(load_history(path))


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_fresh_history_replays(tk: TurnKit, scenario: str) -> None:
    """Every scenario still runs as scripted today, and what it records replays at once."""
    entries = await SCENARIOS[scenario](tk)
    histories = [await tk.client.get_workflow_handle(workflow_id(e)).fetch_history() for e in entries]
    if scenario == "turn-tools":
        assert {h.events[0].workflow_execution_started_event_attributes.workflow_type.name for h in histories} == {
            "TurnWorkflow",
            "ConversationWorkflow",
        }
    register_scenario_agents()
    replayer = turnkit_replayer()
    for history in histories:
        await replayer.replay_workflow(history)


async def test_a_turn_replays_as_it_ran_after_its_agent_changed(tk: TurnKit) -> None:
    """Issue 9 (workflow decisions never read the live registry): a turn that called a tool replays unchanged after
    the agent is redefined so that the same name is a sub-agent; the dispatch travelled in the model step."""
    lookup = turnkit.tool(recovery="replay_safe")(_lookup)
    agent = turnkit.Agent(
        "shifty", model="scripted", tools=[lookup], client=ScriptedClient([call_tools(("lookup", {})), "done"])
    )
    turn = await (await tk.conversation(agent)).ask("go")
    assert turn.status == "completed" and [e.tool_name for e in await turn.tool_executions()] == ["lookup"]
    history = await tk.client.get_workflow_handle(turn.id).fetch_history()

    helper = turnkit.Agent("lookup", model="scripted", client=ScriptedClient(["as a sub-agent"]))
    turnkit.register(turnkit.Agent("shifty", model="scripted", sub_agents=[helper], client=ScriptedClient(["x"])))
    await turnkit_replayer().replay_workflow(history)  # raised NondeterminismError when the workflow asked the registry


def _lookup() -> str:
    """Look something up."""
    return "found"


# -- patch markers ----------------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("through_lanes")
async def test_runs_of_the_baseline_record_no_patch_markers(tk: TurnKit) -> None:
    """Release 0.2.0 is the baseline of the workflow code: a new conversation's lane and its turn record no patch
    marker and no ``TemporalChangeVersion`` upsert, and both histories replay under the strict sandbox. (A later
    change to workflow code goes through ``workflow.patched``, and its marker appears here.)"""
    register_scenario_agents()
    lookup = turnkit.tool(recovery="replay_safe")(_lookup)
    agent = turnkit.Agent(
        "unmarked", model="scripted", tools=[lookup], client=ScriptedClient([call_tools(("lookup", {})), "done"])
    )
    conversation = await tk.conversation(agent)
    turn = await conversation.ask("go")
    assert turn.status == "completed"
    for workflow_id_ in (conversation.id, turn.id):
        history = await tk.client.get_workflow_handle(workflow_id_).fetch_history()
        assert patch_markers(history.events) == [], workflow_id_
        await turnkit_replayer().replay_workflow(history)


# -- negative control -------------------------------------------------------------------------------------------------


@workflow.defn(name="TurnWorkflow")
class AlteredTurnWorkflow:
    """``TurnWorkflow`` as a careless edit might leave it: same deadline timer, but a different first activity."""

    @workflow.run
    async def run(self, turn: TurnInput) -> TurnOutcome:
        finish = asyncio.create_task(
            workflow.execute_activity(
                "turnkit.finish_turn",
                FinishTurn(turn_id=turn.turn_id, status="completed"),
                result_type=TurnOutcome,
                start_to_close_timeout=timedelta(seconds=30),
            )
        )
        if turn.deadline is not None:
            remaining = (turn.deadline - workflow.now()).total_seconds()
            await workflow.wait_condition(finish.done, timeout=max(remaining, 0.001))
        return await finish


async def test_changed_workflow_fails_replay() -> None:
    """Proves the replay test can fail: the recorded turn-tools history does not fit a changed TurnWorkflow."""
    # v1: recorded with the deadline's timer from the start, which the altered workflow keeps (v2, recorded without
    # it, fails on the timer first).
    paths = [path for path in HISTORIES if path.name == "turn-tools-TurnWorkflow-v1.json"]
    assert paths, "tests/histories/turn-tools-TurnWorkflow-v1.json is missing: run `make histories`"
    register_scenario_agents()
    # TurnKitPlugin would also register the real TurnWorkflow, so configure the same converter and sandbox by hand.
    restrictions = SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH_MODULES, "tests")
    replayer = Replayer(
        workflows=[ConversationWorkflow, AlteredTurnWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=SandboxedWorkflowRunner(restrictions=restrictions),
    )
    with pytest.raises(workflow.NondeterminismError, match=r"'turnkit\.model' does not match"):
        await replayer.replay_workflow(load_history(paths[-1]))


# -- the sandbox ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strict", [True, False])
async def test_strict_sandbox_runs_workflow_code_from_source(monkeypatch: pytest.MonkeyPatch, strict: bool) -> None:
    """The replayers' strict sandbox re-imports ``workflows/`` for every run, so the sandbox's checks apply to it; a
    worker's plugin shares the host's import (cheaper), so a change to the host module reaches its runs."""
    import turnkit._workflows.turn

    path = next(p for p in HISTORIES if p.name.startswith("turn-tools-TurnWorkflow-"))
    monkeypatch.setattr(turnkit._workflows.turn, "TOOL_ACTIVITY_PREFIX", "renamed:")
    register_scenario_agents()
    replayer = Replayer(workflows=[], plugins=[TurnKitPlugin(strict_sandbox=strict)])
    if strict:
        await replayer.replay_workflow(load_history(path))
    else:
        with pytest.raises(workflow.NondeterminismError):
            await replayer.replay_workflow(load_history(path))


async def test_an_unsandboxed_worker_replays_every_recorded_history() -> None:
    """``TurnKitPlugin(sandbox=False)`` (``worker.py --no-sandbox``) runs the workflows with the unsandboxed runner;
    a worker so configured replays every checked-in history as the sandboxed one does (a cache eviction or a crash
    makes a worker replay), and the strict sandbox cannot be asked for without the sandbox."""
    register_scenario_agents()
    plugin = TurnKitPlugin(sandbox=False)
    replayer = Replayer(workflows=TEAM_WORKFLOWS, plugins=[plugin])
    assert isinstance(replayer.config(active_config=True).get("workflow_runner"), UnsandboxedWorkflowRunner)
    failures: dict[str, str] = {}
    for path in HISTORIES:
        result = await replayer.replay_workflow(load_history(path), raise_on_replay_failure=False)
        if result.replay_failure is not None:
            failures[path.name] = str(result.replay_failure)
    assert not failures, failures
    with pytest.raises(turnkit.ConfigError, match="strict_sandbox=True needs sandbox=True"):
        TurnKitPlugin(strict_sandbox=True, sandbox=False)
