"""Skills (behaviour §1.2, §3.4, §4.2, §4.3; T24): preloaded and available skills, ``load_skill``, skill-owned tools
that join the turn's tool set once loaded, the prompt's skill sections, and loaded skills surviving the turn's
iterations and a worker restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import turnkit
from tests import crash_app, skills_app
from tests.engine import Engine, eventually
from tests.history_scenarios import history_events, local_activity_types, scheduled_activities
from tests.workers import WorkerProcess
from turnkit.agent import Agent, register
from turnkit.config import configure
from turnkit.kernel.errors import ConfigError
from turnkit.model import ModelRequest
from turnkit.runtime import TurnKit
from turnkit.skills import LoadSkillTool, Skill
from turnkit.testing import ScriptedClient, call_tools
from turnkit.tools import tool


@tool(recovery="replay_safe")
def skill_read(path: str) -> dict[str, Any]:
    """Read a document.

    Args:
        path: Which document.
    """
    return {"text": f"contents of {path}"}


@tool
def triage(ticket: str) -> str:
    """Triage a ticket.

    Args:
        ticket: The ticket id.
    """
    return f"triaged {ticket}"


@tool
def lookup(q: str) -> str:
    """Look something up.

    Args:
        q: The query.
    """
    return q


def reading_skill() -> Skill:
    return Skill(
        "reading", name="Reading", description="Read documents.", content="Read before answering.", tools=[skill_read]
    )


def tool_results(request: ModelRequest) -> list[dict[str, Any]]:
    return [m for m in request.messages if m["role"] == "tool"]


# -- T24 --------------------------------------------------------------------------------------------------------------


async def test_a_skill_tool_joins_the_tool_set_after_load_skill(tk: TurnKit) -> None:
    """T24: given an available skill that owns ``skill_read``, a call to ``skill_read`` before ``load_skill`` fails
    (unknown tool); after a successful ``load_skill`` the next request lists ``skill_read`` and the call completes; it
    stays listed for the rest of the turn's iterations; a new run does not list it."""
    client = ScriptedClient(
        [
            call_tools(("skill_read", {"path": "a.txt"})),
            call_tools(("load_skill", {"key": "reading"})),
            call_tools(("skill_read", {"path": "a.txt"})),
            call_tools(("lookup", {"q": "more"})),
            "done",
            "second run",
        ]
    )
    agent = Agent("reader", model="scripted", tools=[lookup], available_skills=[reading_skill()], client=client)
    conversation = await tk.conversation(agent)
    turn = await conversation.ask("read a.txt")
    assert turn.status == "completed" and turn.output_text == "done"

    names = [request.tool_names for request in client.requests]
    assert names[0] == ["lookup", "load_skill"]
    assert names[1] == ["lookup", "load_skill"]
    # From the request after the load on, for every later iteration of the turn: the skill's tool is offered.
    assert names[2] == names[3] == names[4] == ["lookup", "skill_read", "load_skill"]

    executions = await turn.tool_executions()
    assert [(e.tool_name, e.status) for e in executions] == [
        ("skill_read", "failed"),
        ("load_skill", "completed"),
        ("skill_read", "completed"),
        ("lookup", "completed"),
    ]
    assert executions[0].error is not None and executions[0].error["message"] == "unknown tool: skill_read"
    assert executions[1].result == {"key": "reading", "name": "Reading", "content": "Read before answering."}
    assert executions[2].result == {"text": "contents of a.txt"}
    # The load is stored with the turn (written with the load's result), never kept in workflow memory.
    assert (await tk.store.load_turn(turn.id)).options.state.loaded_skills == ["reading"]
    # load_skill is quick and runs inside the turn's workflow task (LoadSkillTool.local), a skill's tool as declared.
    events = await history_events(tk, turn.id)
    assert local_activity_types(events).count("tool:load_skill") == 1
    assert "tool:load_skill" not in scheduled_activities(events)
    assert scheduled_activities(events).count("tool:skill_read") == 2

    run = await tk.run(agent, "again")
    assert run.status == "completed"
    assert client.requests[5].tool_names == ["lookup", "load_skill"]  # a new run starts with nothing loaded
    assert (await tk.store.load_turn(run.id)).options.state.loaded_skills == []


async def test_loading_an_unknown_skill_fails_and_enables_nothing(tk: TurnKit) -> None:
    """§4.3: an unknown key fails as ``unknown skill: <key>. Available: <keys>``; the turn goes on, nothing loaded."""
    other = Skill("triage", description="Sort tickets.", tools=[triage])
    client = ScriptedClient([call_tools(("load_skill", {"key": "nope"})), "fine"])
    agent = Agent("loader", model="scripted", available_skills=[reading_skill(), other], client=client)
    turn = await (await tk.conversation(agent)).ask("go")
    assert turn.status == "completed"
    [execution] = await turn.tool_executions()
    assert execution.status == "failed"
    assert execution.error is not None
    assert execution.error["message"] == "unknown skill: nope. Available: reading, triage"
    assert client.requests[1].tool_names == ["load_skill"]
    assert (await tk.store.load_turn(turn.id)).options.state.loaded_skills == []


async def test_preloaded_skills_are_in_the_prompt_and_their_tools_always_offered(tk: TurnKit) -> None:
    """§3.4 and §4.2: a preloaded skill's content is in ``<skills_loaded>`` and its tools are offered from the first
    request; available skills are listed in ``<skills_available>``; the order is own tools, skill tools, sub-agents,
    ``load_skill``."""
    helper = Agent("helper", model="scripted", client=ScriptedClient(["ok"]))
    triaging = Skill("triage", name="Triage", content="Sort by severity & age.", tools=[triage])
    client = ScriptedClient([call_tools(("triage", {"ticket": "T-1"})), "sorted"])
    agent = Agent(
        "desk",
        model="scripted",
        tools=[lookup],
        skills=[triaging],
        available_skills=[reading_skill()],
        sub_agents=[helper],
        client=client,
    )
    turn = await (await tk.conversation(agent)).ask("sort T-1")
    assert turn.status == "completed" and turn.output_text == "sorted"
    [execution] = await turn.tool_executions()
    assert (execution.tool_name, execution.status) == ("triage", "completed")

    first = client.requests[0]
    assert first.tool_names == ["lookup", "triage", "helper", "load_skill"]
    assert "<skills_loaded>\n" in first.instructions
    assert "## Skill: triage\n\nSort by severity & age." in first.instructions  # content is the agent's own text
    assert "<skills_available>\n" in first.instructions
    assert "call load_skill with the key" in first.instructions
    assert "- reading: Reading — Read documents." in first.instructions
    sections = first.report["sections"]
    assert sections.index("loaded_skills") < sections.index("available_skills") < sections.index("tools")
    # The skill sections are part of the stable (cacheable) prompt.
    assert first.dynamic_instructions is not None and "skills_" not in first.dynamic_instructions


async def test_preview_lists_the_tools_of_skills_the_turn_loaded(tk: TurnKit) -> None:
    """``Turn.preview`` uses the model activity's request builder, so it shows the loaded skill's tools too."""
    agent = Agent(
        "previewed",
        model="scripted",
        available_skills=[reading_skill()],
        client=ScriptedClient([call_tools(("load_skill", {"key": "reading"})), "done"]),
    )
    conversation = await tk.conversation(agent)
    turn = await conversation.ask("load it")
    assert turn.status == "completed"
    assert (await turn.preview()).tool_names == ["skill_read", "load_skill"]
    prepared = await conversation.build_turn("next")
    assert (await prepared.preview()).tool_names == ["load_skill"]


# -- restart ----------------------------------------------------------------------------------------------------------


@pytest.mark.crash
async def test_a_loaded_skill_survives_a_worker_restart(engine: Engine, crash_dir: Path) -> None:
    """The worker is killed right after ``load_skill``'s result committed: the next worker's request lists the
    skill's tool (read from the turn's stored state) and the call completes."""
    register(skills_app.reader)
    first = await WorkerProcess.for_engine(
        engine, app="tests.skills_app", env={"TURNKIT_CRASH_AFTER": "tool_call.completed"}
    )
    turn = await (await engine.tk.conversation(skills_app.reader)).ask("read a.txt", wait=False)

    async def frozen() -> bool:
        return bool(crash_app.lines("hung"))

    await eventually(frozen, what="the first worker frozen after load_skill committed")
    await first.kill()
    second = await WorkerProcess.for_engine(engine, app="tests.skills_app")
    try:
        done = await turn.result(timeout=120)
    finally:
        assert await second.stop() == 0
    assert done.status == "completed" and done.output_text == "read it", done.error
    assert crash_app.lines("skill_model") == ["load_skill", "skill_read,load_skill", "skill_read,load_skill"]
    assert crash_app.lines("skill_read") == ["a.txt"]
    executions = await done.tool_executions()
    assert [(e.tool_name, e.status) for e in executions] == [("load_skill", "completed"), ("skill_read", "completed")]
    assert done.record.options.state.loaded_skills == ["reading"]


# -- definitions ------------------------------------------------------------------------------------------------------


def test_global_available_skills_come_first_and_are_deduplicated_by_key() -> None:
    """§1.2: ``settings.available_skills`` is copied in front at construction, then de-duplicated by key (the first
    wins); ``inherit_globals=False`` leaves it out."""
    shared = Skill("reading", description="global")
    configure(available_skills=[shared])
    local = Skill("reading", description="local")
    extra = Skill("triage", tools=[triage])
    agent = Agent("a", available_skills=[local, extra])
    assert agent.available_skills == (shared, extra)
    assert isinstance(agent.load_skill_tool, LoadSkillTool)
    configure(available_skills=[])
    assert agent.available_skills == (shared, extra)  # copied: a later change does not reach it
    alone = Agent("b", available_skills=[local], inherit_globals=False)
    configure(available_skills=[shared])
    assert Agent("c", available_skills=[local], inherit_globals=False).available_skills == (local,)
    assert alone.available_skills == (local,)
    assert [spec.name for spec in Agent("d").tool_specs()] == ["load_skill"]  # the global skill is loadable
    assert Agent("e", inherit_globals=False).load_skill_tool is None
    assert Agent("e", inherit_globals=False).tool_specs() == []


def test_skill_definitions_are_validated() -> None:
    """§1.2: every tool the agent could offer is checked, skills' and ``load_skill`` included."""
    with pytest.raises(ValueError, match=r"^duplicate tool name: skill_read$"):
        Agent("a", tools=[skill_read], available_skills=[reading_skill()])
    with pytest.raises(ValueError, match=r"^duplicate tool name: triage$"):
        Agent("a", skills=[Skill("one", tools=[triage])], available_skills=[Skill("two", tools=[triage])])
    with pytest.raises(ValueError, match=r"^duplicate tool name: load_skill$"):
        Agent("a", sub_agents=[Agent("load_skill")], available_skills=[reading_skill()])
    with pytest.raises(TypeError, match=r"^skills must be Skill objects$"):
        Agent("a", skills=["reading"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"^available_skills must be Skill objects$"):
        Agent("a", available_skills="reading")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^available_skills must be Skill objects$"):
        configure(available_skills=[{"key": "reading"}])
    with pytest.raises(ValueError, match=r"^skill key is required$"):
        Skill(" ")
    assert Skill("k").name == "k"


def test_load_skill_returns_the_skill_or_names_the_available_keys() -> None:
    """§4.3: ``{key, name, content}``, or ``ToolError "unknown skill: <key>. Available: <keys>"``."""
    from tests.test_tools import make_context

    loader = LoadSkillTool([reading_skill(), Skill("triage")])
    assert loader.read_only is True and loader.recovery == "replay_safe"
    assert loader.call(make_context(), key="reading") == {
        "key": "reading",
        "name": "Reading",
        "content": "Read before answering.",
    }
    with pytest.raises(turnkit.ToolError, match=r"^unknown skill: x\. Available: reading, triage$"):
        loader.call(make_context(), key="x")
