"""``agent.run`` / ``tk.run``: a root turn and its tree (behaviour §1.7)."""

from __future__ import annotations

from typing import Any

import pytest

import turnkit
from turnkit.current import current_connection
from turnkit.model import Usage
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, call_tools, say


@turnkit.tool
def lookup(q: str) -> dict[str, Any]:
    """Look up."""
    return {"q": q}


SCHEMA = {"type": "object", "properties": {"company": {"type": "string"}}, "required": ["company"]}


async def test_run_aggregates_the_tree(tk: TurnKit) -> None:
    child = turnkit.Agent(
        "child",
        model="scripted",
        tools=[lookup],
        client=ScriptedClient([call_tools(("lookup", {"q": "x"})), "child done"]),
    )
    client = ScriptedClient([call_tools(("child", {"task": "help"})), "root done"])
    root = turnkit.Agent("root", model="scripted", sub_agents=[child], client=client, input_schema=SCHEMA)
    with current_connection(tk):
        run = await root.run("Classify", input={"company": "ACME"})
    assert run.status == "completed" and run.output_text == "root done"
    first = (await run.messages())[0]
    assert first.text == 'Task:\nClassify\n\nInput:\n{\n  "company": "ACME"\n}'
    assert first.metadata == {"source": "application", "task": True}
    assert run.record.options.prompt_mode == "task"
    assert "executing an application task" in client.requests[0].instructions
    records = await run.turn_records()
    assert len(records) == 2 and len(await run.child_turn_records()) == 1
    assert [t.agent_name for t in await run.descendant_turn_records()] == ["child"]
    usage = await run.tree_usage()
    assert usage.input_tokens == 40  # two root calls + two child calls, 10 input tokens each
    assert [e.tool_name for e in await run.tool_executions()] == ["child", "lookup"]
    assert await run.failed_turn_records() == []


async def test_input_schema_is_checked_before_anything_is_written(tk: TurnKit) -> None:
    root = turnkit.Agent("root", model="scripted", client=ScriptedClient(["x"]), input_schema=SCHEMA)
    before = await tk.store.list_turns(agent_name="root")
    with pytest.raises(turnkit.InputError, match=r"input\.company must be string"):
        await tk.run(root, "Classify", input={"company": 42})
    with pytest.raises(turnkit.InputError, match=r"input\.company is required"):
        await tk.run(root, "Classify", input={})
    with pytest.raises(ValueError, match="task is required"):
        await tk.run(root, "", input={"company": "x"})
    assert await tk.store.list_turns(agent_name="root") == before


async def test_agent_run_needs_a_connection() -> None:
    agent = turnkit.Agent("lonely", model="scripted", client=ScriptedClient(["x"]))
    with pytest.raises(turnkit.ConfigError, match="no TurnKit connection"):
        await agent.run("hello")


async def test_run_usage_and_cost_are_the_whole_trees(tk: TurnKit) -> None:
    """Behaviour §6.4: ``Run.usage`` and ``Run.cost`` aggregate over the root tree (a sub-agent's tokens and cost
    included); ``turn_usage`` / ``turn_cost`` are the root turn's own."""
    child_client = ScriptedClient([say("child", usage=Usage(input_tokens=7, output_tokens=3, cost=0.5))])
    child = turnkit.Agent("tree_child", description="Helps.", model="scripted", client=child_client)
    lead_client = ScriptedClient(
        [
            call_tools(("tree_child", {"task": "help"}), usage=Usage(input_tokens=10, output_tokens=1, cost=0.25)),
            say("lead done", usage=Usage(input_tokens=20, output_tokens=2, cost=0.125)),
        ]
    )
    lead = turnkit.Agent("tree_lead", model="scripted", sub_agents=[child], client=lead_client)
    run = await tk.run(lead, "delegate")
    assert run.status == "completed", run.error
    assert run.turn_usage.total_tokens == 33 and run.turn_cost == pytest.approx(0.375)
    assert run.usage.total_tokens == 43 and run.cost == pytest.approx(0.875)
