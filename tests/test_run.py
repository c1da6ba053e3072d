"""``agent.run`` / ``tk.run``: a root turn and its tree (behaviour §1.7)."""

from __future__ import annotations

from typing import Any

import pytest

import turnkit
from turnkit._engine.budget import MAX_ITERATIONS
from turnkit._engine.current import current_connection
from turnkit.model import Usage
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, call_tools, say


@turnkit.tool
def lookup(q: str) -> dict[str, Any]:
    """Look up."""
    return {"q": q}


SCHEMA = {"type": "object", "properties": {"company": {"type": "string"}}, "required": ["company"]}


async def test_run_aggregates_the_tree(tk: TurnKit) -> None:
    """T03: ``run("Classify", input={"company": "ACME"})`` completes, its first user message holds the task and the
    JSON input, and the instructions are the task mode's ("executing an application task"); the run's records,
    usage and executions take in its sub-agent's turn."""
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
    assert run.turn_usage.total_tokens == 33 and run.turn_cost.total == pytest.approx(0.375)
    assert run.usage.total_tokens == 43 and run.cost.total == pytest.approx(0.875)


async def test_a_run_joins_another_runs_tree(tk: TurnKit) -> None:
    """T10: given ``root = parent.run(...)`` and ``child.run(..., parent_run=root)``, when both complete, they share
    ``root_turn_id``, ``root.turn_records`` has 2 rows and ``root.usage`` sums both; the joined run is counted
    against the root's budget, and joining a turn that is not a root is refused before anything is written."""
    parent_client = ScriptedClient([say("parent done", usage=Usage(input_tokens=5, output_tokens=1, cost=0.25))])
    parent = turnkit.Agent("t10_parent", model="scripted", client=parent_client, max_iterations=2)
    child_client = ScriptedClient(lambda r: say("child done", usage=Usage(input_tokens=3, output_tokens=2, cost=0.5)))
    child = turnkit.Agent("t10_child", model="scripted", client=child_client)

    root = await tk.run(parent, "start the tree")
    joined = await tk.run(child, "join it", parent_run=root)
    assert root.status == "completed" and joined.status == "completed", (root.error, joined.error)
    assert joined.record.root_turn_id == root.id and joined.record.parent_turn_id is None
    assert {t.id for t in await root.turn_records()} == {root.id, joined.id}
    await root.refresh()
    assert root.usage.total_tokens == 11 and root.cost.total == pytest.approx(0.75)
    async with tk.store.atomic() as tx:
        assert (await tx.tree_usage(root.id)).iterations == 2

    # The root's max_iterations (2) covers the joined runs too: a third model call in the tree is refused.
    third = await tk.run(child, "one more", root_turn_id=root.id)
    assert third.status == "failed" and third.error == {"class": "TurnKit::BudgetError", "message": MAX_ITERATIONS}

    turns = len(await tk.store.list_turns(agent_name="t10_child"))
    with pytest.raises(turnkit.InputError, match="is not a root turn"):
        await tk.run(child, "nested", root_turn_id=joined.id)
    assert len(await tk.store.list_turns(agent_name="t10_child")) == turns, "a refused join wrote a turn"


async def test_a_run_takes_the_per_turn_options_of_ask(tk: TurnKit) -> None:
    """Behaviour §1.2 ``Agent#run(..., **turn_options)``: ``model``, ``thinking``, ``output_schema`` and
    ``prompt_mode`` reach the run's turn and its model request as ``Conversation.ask`` passes them; ``thinking=None``
    turns the agent's thinking off; ``paused=True`` submits the run paused, running nothing until resumed."""
    schema = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
    client = ScriptedClient(['{"label": "ok"}', "plain", "after resume"])
    agent = turnkit.Agent("run_options", model="scripted", client=client, thinking={"effort": "high"})
    with current_connection(tk):
        run = await agent.run(
            "Classify", model="scripted-big", thinking={"budget": 512}, output_schema=schema, prompt_mode="minimal"
        )
    assert run.status == "completed", run.error
    request = client.requests[0]
    assert (request.model, request.thinking, request.output_schema) == ("scripted-big", {"budget": 512}, schema)
    assert "executing an application task" not in request.instructions  # minimal, not task
    options = run.record.options
    assert (options.prompt_mode, options.output_schema, options.thinking) == ("minimal", schema, {"budget": 512})
    assert (await tk.load_conversation(run.record.conversation_id)).record.model == "scripted-big"

    plain = await tk.run(agent, "Again", thinking=None)
    assert plain.status == "completed" and client.requests[1].thinking is None
    assert client.requests[1].model == "scripted" and plain.record.options.prompt_mode == "task"

    held = await tk.run(agent, "Held", paused=True, wait=False)
    assert held.status == "paused" and len(client.requests) == 2  # nothing ran
    await held.resume()
    assert (await held.result()).output_text == "after resume"


async def test_agent_conversation_and_effective_options(tk: TurnKit) -> None:
    """Behaviour §1.2: ``Agent#conversation`` creates a conversation on the current connection (its model the
    agent's unless given); ``effective_thinking``, ``effective_output_policy`` and ``effective_prompt_mode`` say what
    a turn would use."""
    agent = turnkit.Agent("effective", model="scripted", client=ScriptedClient(["hi"]), thinking={"effort": "low"})
    with current_connection(tk):
        default = await agent.conversation()
        chosen = await agent.conversation(model="scripted-mini", metadata={"k": "v"})
    assert default.record.model == "scripted" and default.record.agent_name == "effective"
    assert chosen.record.model == "scripted-mini" and chosen.record.metadata["k"] == "v"
    assert agent.effective_thinking == {"effort": "low"} and agent.effective_output_policy == []
    assert (agent.effective_prompt_mode(), agent.effective_prompt_mode(depth=1)) == ("full", "minimal")
    assert agent.effective_prompt_mode(prompt_mode="none") == "none"
    lead = turnkit.Agent(
        "effective_lead", model="scripted", orchestrator=True, output_policy=turnkit.OutputPolicy("Be kind.")
    )
    assert lead.effective_prompt_mode(depth=1) == "task" and lead.effective_thinking is None
    assert [type(each).__name__ for each in lead.effective_output_policy] == ["OutputPolicy"]
    with pytest.raises(ValueError, match="unknown prompt mode: loud"):
        agent.effective_prompt_mode(prompt_mode="loud")
