"""Issue 11, "Seeing a run": search attributes on every lane and turn, current details, and the worker's start-up
check, against the real dev server (the session's, which registers the attributes, and a private one without them).

The attributes are Keyword search attributes (:mod:`turnkit._temporal.search_attributes`); visibility is eventually
consistent, so every search is polled until it answers.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory

import turnkit
from tests.engine import Gate, eventually, gated_tool
from tests.faults import DevServer, dev_server
from turnkit._temporal.search_attributes import create_commands
from turnkit.config import configure, reset_settings
from turnkit.kernel.errors import ConfigError
from turnkit.kernel.payloads import OUTPUT_PREVIEW_CHARS, TurnOutcome
from turnkit.kernel.search_attributes import (
    AGENT,
    ALL_SEARCH_ATTRIBUTES,
    CONVERSATION_ID,
    PARENT_TURN_ID,
    ROOT_TURN_ID,
    TURN_STATUS,
)
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit
from turnkit.store import Store
from turnkit.testing import ScriptedClient, call_tools

ROOT = Path(__file__).resolve().parent.parent
TEMPORAL = str(Path(sys.executable).parent / "temporal")
NAMES = [key.name for key in ALL_SEARCH_ATTRIBUTES]

# The attributes do not depend on the store: one backend is enough.
sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


async def cli(address: str, *args: str) -> str:
    """Run the ``temporal`` CLI against ``address``; returns its stdout (fails the test on a non-zero exit). In a
    thread: the in-process worker keeps answering (a query needs it)."""
    command = [TEMPORAL, *args, "--address", address]
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def search(client: Client, query: str) -> dict[str, dict[str, Any]]:
    """Workflow id -> TurnKit attributes of every workflow the visibility query finds."""
    found: dict[str, dict[str, Any]] = {}
    async for execution in client.list_workflows(query):
        attributes = execution.typed_search_attributes
        found[execution.id] = {key.name: attributes.get(key) for key in ALL_SEARCH_ATTRIBUTES}
    return found


async def found(client: Client, query: str, expected: dict[str, dict[str, Any]]) -> None:
    """Wait until ``query`` finds exactly ``expected`` (ids and their attributes)."""
    seen: list[dict[str, dict[str, Any]]] = []

    async def check() -> bool:
        seen[:] = [await search(client, query)]
        return seen[0] == expected

    try:
        await eventually(check, what=f"visibility: {query}")
    except AssertionError as err:
        raise AssertionError(f"{query} found {seen} instead of {expected}") from err


async def details(client: Client, workflow_id: str) -> str:
    """The workflow's current details, as the UI reads them (the built-in metadata query)."""
    handle = client.get_workflow_handle(workflow_id)
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return metadata.current_details


async def shows(client: Client, workflow_id: str, expected: str) -> None:
    """Wait until the workflow's current details read ``expected``."""

    async def check() -> bool:
        return await details(client, workflow_id) == expected

    await eventually(check, what=f"current details of {workflow_id}: {expected!r}")


@sqlite_only
async def test_lanes_and_turns_are_found_by_conversation_tree_and_status(tk: TurnKit, temporal_address: str) -> None:
    """Issue 11 "Search attributes" and "Current details": after a turn with a sub-agent, the lane and both turns
    are found by conversation, agent, root and parent turn with `client.list_workflows` and with
    `temporal workflow list --query`; the status was `waiting` while the parent waited on its sub-agent and is
    terminal at the end; the lane, the waiting turn and the sub-agent's turn show their current details."""
    gate = Gate()
    worker = turnkit.Agent(
        "sa_worker",
        description="Does the work.",
        model="scripted",
        tools=[gated_tool(gate, "work")],
        client=ScriptedClient([call_tools(("work", {})), "worked"]),
    )
    lead_client = ScriptedClient([call_tools(("sa_worker", {"task": "t"})), "done", "second answer"])
    lead = turnkit.Agent("sa_lead", model="scripted", sub_agents=[worker], client=lead_client)
    conversation = await tk.conversation(lead)
    turn = await conversation.ask("go", wait=False)
    await asyncio.wait_for(gate.entered.wait(), 30)
    second = await conversation.ask("and then this", wait=False)  # queued behind the running turn
    [child] = [t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id]
    client = tk.client

    # While the sub-agent works: the parent is `waiting`, the sub-agent's turn `running`.
    parent_attributes = {
        CONVERSATION_ID.name: conversation.id,
        AGENT.name: "sa_lead",
        ROOT_TURN_ID.name: turn.id,
        PARENT_TURN_ID.name: None,
        TURN_STATUS.name: "waiting",
    }
    child_attributes = {
        CONVERSATION_ID.name: child.conversation_id,
        AGENT.name: "sa_worker",
        ROOT_TURN_ID.name: turn.id,
        PARENT_TURN_ID.name: turn.id,
        TURN_STATUS.name: "running",
    }
    await found(client, f"TurnKitRootTurnId = '{turn.id}'", {turn.id: parent_attributes, child.id: child_attributes})
    await found(
        client, f"TurnKitParentTurnId = '{turn.id}' AND TurnKitAgent = 'sa_worker'", {child.id: child_attributes}
    )
    await shows(client, turn.id, "iteration 1 · waiting on 1 sub-agent: sa_worker")
    await shows(client, child.id, "iteration 1 · tool work")
    await shows(client, conversation.id, f"running {turn.id} · 1 queued")
    metadata = await cli(temporal_address, "workflow", "metadata", "--workflow-id", turn.id)
    assert "iteration 1 · waiting on 1 sub-agent: sa_worker" in metadata, metadata

    gate.opened.set()
    assert (await turn.result(timeout=60)).status == "completed"
    assert (await second.result(timeout=60)).status == "completed"

    # At the end: every turn's status is terminal; the conversation finds its lane and both of its turns.
    lane_attributes = dict.fromkeys(NAMES) | {CONVERSATION_ID.name: conversation.id, AGENT.name: "sa_lead"}
    done = {TURN_STATUS.name: "completed"}
    second_attributes = parent_attributes | done | {ROOT_TURN_ID.name: second.id}
    await found(
        client,
        f"TurnKitConversationId = '{conversation.id}'",
        {conversation.id: lane_attributes, turn.id: parent_attributes | done, second.id: second_attributes},
    )
    await found(
        client,
        f"TurnKitRootTurnId = '{turn.id}' AND TurnKitTurnStatus = 'completed'",
        {turn.id: parent_attributes | done, child.id: child_attributes | done},
    )
    # Nothing queued behind the second turn: the lane has not looked for its end (patch lane-follows-on-demand).
    await shows(client, conversation.id, f"started {second.id} (followed when more work arrives)")

    # The same searches from the command line, as an operator runs them.
    listed = json.loads(
        await cli(
            temporal_address, "workflow", "list", "--query", f"TurnKitRootTurnId = '{turn.id}'", "--output", "json"
        )
    )
    assert sorted(item["execution"]["workflowId"] for item in listed) == sorted([turn.id, child.id])
    query = f"TurnKitConversationId = '{conversation.id}' AND WorkflowType = 'ConversationWorkflow'"
    listed = json.loads(await cli(temporal_address, "workflow", "list", "--query", query, "--output", "json"))
    assert [item["execution"]["workflowId"] for item in listed] == [conversation.id]


@turnkit.tool(terminal=True)
def file_memo(memo: str) -> str:
    """File the memo; its text is the turn's answer.

    Args:
        memo: The memo.
    """
    return memo


def completed_result(history: WorkflowHistory) -> dict[str, Any]:
    """The result payload of a closed run, as the UI and ``temporal workflow show`` display it."""
    [payload] = history.events[-1].workflow_execution_completed_event_attributes.result.payloads
    return json.loads(payload.data)


@sqlite_only
async def test_a_turns_workflow_result_shows_the_start_of_its_answer(tk: TurnKit) -> None:
    """Issue 38 "What a user sees": a completed turn's workflow result carries the first OUTPUT_PREVIEW_CHARS
    characters of its answer (cut with an ellipsis; the record keeps the whole), whether the model answered or a
    terminal tool did; the workflow's static summary names its agent. Read as an operator does: the handle's result,
    describe(), and the completed event of the history."""
    long_answer = "Durable agents keep going. " * 30
    model = turnkit.Agent("preview_model", model="scripted", client=ScriptedClient([long_answer]))
    memo = turnkit.Agent(
        "preview_memo",
        model="scripted",
        tools=[file_memo],
        client=ScriptedClient([call_tools(("file_memo", {"memo": "Memo filed: all good."}))]),
    )
    answered = await (await tk.conversation(model)).ask("say a lot")
    filed = await (await tk.conversation(memo)).ask("file it")
    assert answered.output_text == long_answer and filed.output_text == "Memo filed: all good."

    cut = long_answer[: OUTPUT_PREVIEW_CHARS - 1] + "…"
    for turn, preview, agent in ((answered, cut, "preview_model"), (filed, "Memo filed: all good.", "preview_memo")):
        handle = tk.client.get_workflow_handle(turn.id, result_type=TurnOutcome)
        outcome = await handle.result()
        assert (outcome.status, outcome.output_preview) == ("completed", preview)
        description = await handle.describe()
        assert description.status == WorkflowExecutionStatus.COMPLETED
        assert await description.static_summary() == f"turn · {agent}"
        result = completed_result(await handle.fetch_history())
        assert result["output_preview"] == preview and len(json.dumps(result)) < 2 * OUTPUT_PREVIEW_CHARS
    assert len(cut) == OUTPUT_PREVIEW_CHARS < len(long_answer)


@sqlite_only
async def test_a_lane_started_by_a_delivery_adds_its_agent(tk: TurnKit) -> None:
    """Issue 11 "Search attributes": a lane started by signal-with-start (a delivery: the sender does not know the
    conversation's agent) adds the agent when it runs its first turn; the turn carries every attribute."""
    agent = turnkit.Agent("sa_posted", model="scripted", client=ScriptedClient(["got it"]))
    conversation = await tk.conversation(agent)
    delivery = await conversation.post("hello", key=f"sa-{uuid.uuid4().hex}")

    async def turn_ended() -> bool:
        turns = await tk.store.list_turns(conversation_id=conversation.id)
        return bool(turns) and all(t.terminal for t in turns)

    await eventually(turn_ended, what="the delivered input's turn")
    [turn] = await tk.store.list_turns(conversation_id=conversation.id)
    assert delivery.destination_conversation_id == conversation.id
    await found(
        tk.client,
        f"TurnKitConversationId = '{conversation.id}' AND TurnKitAgent = 'sa_posted'",
        {
            conversation.id: dict.fromkeys(NAMES) | {CONVERSATION_ID.name: conversation.id, AGENT.name: "sa_posted"},
            turn.id: {
                CONVERSATION_ID.name: conversation.id,
                AGENT.name: "sa_posted",
                ROOT_TURN_ID.name: turn.id,
                PARENT_TURN_ID.name: None,
                TURN_STATUS.name: "completed",
            },
        },
    )


async def run_worker_script(server: DevServer, database_url: str) -> subprocess.CompletedProcess[str]:
    """``python worker.py`` against ``server``; returns once it exited (or fails after 60 s)."""
    command = [sys.executable, str(ROOT / "worker.py"), "--address", server.address, "--database-url", database_url]
    return await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60, cwd=ROOT)


@sqlite_only
async def test_workers_name_missing_search_attributes(database_url: str) -> None:
    """Issue 11 "Search attributes": on a namespace without TurnKit's attributes, `worker.py` and the in-process
    worker refuse to start with an error naming each missing one and the commands that create them; with
    `search_attributes=False` a turn runs without them (nothing wedges); once the README's commands registered them
    the worker starts and the turn is searchable. A client starting a lane on such a namespace gets an error that
    says what to do."""
    async with dev_server(search_attributes=False) as server:
        script = await run_worker_script(server, database_url)
        assert script.returncode == 2, script.stderr
        assert all(name in script.stderr for name in NAMES), script.stderr
        assert "temporal operator search-attribute create" in script.stderr
        assert "Traceback" not in script.stderr

        store = await Store.open(database_url)
        try:
            client = await Client.connect(server.address, plugins=[TurnKitPlugin(store)])
            tk = TurnKit(client, store, task_queue=f"tq-{uuid.uuid4().hex[:12]}")
            with pytest.raises(ConfigError) as raised:
                async with tk.worker():
                    pass
            message = str(raised.value)
            assert all(name in message for name in NAMES), message
            for command in create_commands("default"):
                assert command in message

            # A client that starts a turn anyway (a fresh conversation's first: its own workflow, issue 9) gets
            # Temporal's refusal, with what to do about it; the turn it wrote is recorded failed, never run later.
            agent = turnkit.Agent("sa_plain", model="scripted", client=ScriptedClient(["plain", "searchable"]))
            conversation = await tk.conversation(agent)
            with pytest.raises(turnkit.Error) as refused:
                await conversation.ask("refused", wait=False)
            # Temporal names the first unknown attribute it met (map order: any of the turn's).
            assert "search attribute TurnKit" in str(refused.value), refused.value
            assert "temporal operator search-attribute create" in str(refused.value)
            [unstarted] = await store.list_turns(conversation_id=conversation.id)
            assert unstarted.status == "failed" and "search attribute TurnKit" in str(unstarted.error)

            # Opted out: no attributes are sent, none are upserted, and the turn runs.
            configure(search_attributes=False)
            async with tk.worker():
                plain = await conversation.ask("without attributes")
            assert plain.status == "completed"
            described = await client.get_workflow_handle(plain.id).describe()
            assert described.typed_search_attributes.get(CONVERSATION_ID) is None

            # Registered with the README's commands: the check passes and new turns are searchable.
            for command in create_commands("default"):
                await cli(server.address, *command.split()[1:])
            reset_settings()
            async with tk.worker():
                registered = await tk.conversation(agent)
                again = await registered.ask("with attributes")
            assert again.status == "completed"
            await found(
                client,
                f"TurnKitRootTurnId = '{again.id}'",
                {
                    again.id: {
                        CONVERSATION_ID.name: registered.id,
                        AGENT.name: "sa_plain",
                        ROOT_TURN_ID.name: again.id,
                        PARENT_TURN_ID.name: None,
                        TURN_STATUS.name: "completed",
                    }
                },
            )
        finally:
            await store.close()
