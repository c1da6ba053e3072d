"""Agent options and validation (behaviour §1.2; T07, T09, T20, T23), the registry, and the system prompt (§3.4)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from pydantic import BaseModel

from turnkit.agent import (
    ORCHESTRATOR_PREAMBLE,
    Agent,
    AgentDefinition,
    AgentOptions,
    register,
    registered_agents,
    resolve_agent,
    unregister_all,
)
from turnkit.config import configure, reset_settings
from turnkit.kernel.errors import ConfigError
from turnkit.prompt import NONE_MODE_PROMPT, build_instructions, xml_escape
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, call_tools
from turnkit.tools import Tool, ToolContext, tool


@pytest.fixture(autouse=True)
def _isolated() -> Iterator[None]:
    unregister_all()
    reset_settings()
    yield
    unregister_all()
    reset_settings()


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return q


class StatusTool(Tool):
    description = "Status."

    class Arguments(BaseModel):
        id: str

    def call(self, context: ToolContext, *, id: str) -> str:
        return id


class NeedsArgs(Tool):
    def __init__(self, token: str) -> None:
        self.token = token

    def call(self, context: ToolContext) -> str:
        return self.token


# -- construction -----------------------------------------------------------------------------------------------------


def test_name_is_required() -> None:
    for name in ("", "   "):
        with pytest.raises(ValueError, match=r"^name is required$"):
            Agent(name)


def test_tools_accept_instances_classes_and_decorated_functions() -> None:
    agent = Agent("helper", tools=[lookup, StatusTool, NeedsArgs("t")])
    assert [t.name for t in agent.tools] == ["lookup", "status_tool", "needs_args"]
    assert isinstance(agent.tool("status_tool"), StatusTool)
    assert agent.tool("missing") is None
    assert [s.name for s in agent.tool_specs()] == ["lookup", "status_tool", "needs_args"]


def test_invalid_tool_lists() -> None:
    """T23: an agent whose tools are ``[object()]``, a plain function, ``[42]`` or a bare string fails with a
    ``TypeError`` saying tools must be TurnKit tools."""
    message = "tools must be TurnKit tools (Tool instances, Tool subclasses or @tool functions)"

    def plain(q: str) -> str:
        return q

    for bad in ([object()], [plain], [42], "lookup"):
        with pytest.raises(TypeError) as info:
            Agent("a", tools=bad)  # type: ignore[arg-type]
        assert str(info.value) == message


def test_duplicate_tool_names() -> None:
    """T23: two tools sharing a name, or a tool and a sub-agent sharing one, fail with ``ValueError`` "duplicate tool
    name: <name>"."""
    with pytest.raises(ValueError, match=r"^duplicate tool name: lookup$"):
        Agent("a", tools=[lookup, lookup])
    writer = Agent("status_tool")
    with pytest.raises(ValueError, match=r"^duplicate tool name: status_tool$"):
        Agent("a", tools=[StatusTool], sub_agents=[writer])


def test_tool_class_with_constructor_arguments() -> None:
    """T20: a tool class whose constructor needs arguments, registered as a class, fails with "register an instance
    instead"; a registered instance of it works."""
    with pytest.raises(ValueError, match="register an instance instead"):
        Agent("a", tools=[NeedsArgs])
    assert Agent("a", tools=[NeedsArgs("secret")]).tools[0].name == "needs_args"


def test_tool_definitions_are_validated() -> None:
    class Unfinished(Tool):
        pass

    with pytest.raises(ValueError, match="must implement call"):
        Agent("a", tools=[Unfinished])


def test_sub_agents_must_be_agents_with_tool_names() -> None:
    with pytest.raises(TypeError, match="sub_agents must be Agent instances"):
        Agent("a", sub_agents=["writer"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="invalid sub-agent name"):
        Agent("a", sub_agents=[Agent("two words")])


def test_thinking_validation() -> None:
    """T07: ``thinking={}`` (or an effort of None) raises ``ValueError`` "thinking requires :effort or :budget";
    unknown keys and a non-integer budget are rejected too, and None values are dropped from a valid setting."""
    with pytest.raises(ValueError, match=r"^thinking requires :effort or :budget$"):
        Agent("a", thinking={})
    with pytest.raises(ValueError, match="thinking requires"):
        Agent("a", thinking={"effort": None})
    with pytest.raises(ValueError, match="unknown thinking keys: temperature"):
        Agent("a", thinking={"effort": "high", "temperature": 1})
    with pytest.raises(TypeError, match="budget"):
        Agent("a", thinking={"budget": "lots"})
    with pytest.raises(TypeError, match="budget"):
        Agent("a", thinking={"budget": True})
    assert Agent("a", thinking={"effort": "high", "budget": None}).thinking == {"effort": "high"}
    assert Agent("a", thinking={"budget": 4000}).thinking == {"budget": 4000}
    assert Agent("a").thinking is None


def test_instructions_are_stripped_and_orchestrator_preamble_comes_first() -> None:
    assert Agent("a", instructions="  Be brief.\n").instructions == "Be brief."
    orchestrator = Agent("o", instructions=" Plan it. ", orchestrator=True)
    assert orchestrator.instructions == f"{ORCHESTRATOR_PREAMBLE}\n\nPlan it."
    assert "autonomous task orchestrator" in orchestrator.instructions
    assert orchestrator.prompt_mode == "task"
    assert Agent("o", orchestrator=True).instructions == ORCHESTRATOR_PREAMBLE
    with pytest.raises(ValueError, match="unknown prompt mode: chatty"):
        Agent("a", prompt_mode="chatty")


def test_agent_is_immutable() -> None:
    agent = Agent("a", tools=[lookup])
    with pytest.raises(dataclasses.FrozenInstanceError):
        agent.name = "b"  # type: ignore[misc]
    assert isinstance(agent.tools, tuple)


def test_effective_model_and_client() -> None:
    agent = Agent("helper")
    assert agent.effective_model == "claude-sonnet-4-5"
    configure(default_model="gpt-x")
    assert agent.effective_model == "gpt-x"
    assert Agent("m", model="claude-opus").effective_model == "claude-opus"

    with pytest.raises(ConfigError, match=r'^no model client configured for agent "helper"$'):
        _ = agent.effective_client
    global_client = ScriptedClient(["hi"])
    configure(client=global_client)
    assert agent.effective_client is global_client
    own = ScriptedClient(["hi"])
    assert Agent("x", client=own).effective_client is own


def test_budget_limits_fall_back_to_settings() -> None:
    assert Agent("a").budget_limits() == {
        "max_iterations": 25,
        "timeout": 300.0,
        "max_depth": 3,
        "max_tool_executions": 100,
        "max_tool_executions_by_name": {},
        "max_spend": None,
    }
    configure(max_iterations=7, max_spend=1.5)
    agent = Agent("b", max_iterations=2, timeout=10, max_tool_executions_by_name={"status_tool": 1})
    limits = agent.budget_limits()
    assert limits["max_iterations"] == 2
    assert limits["timeout"] == 10
    assert limits["max_spend"] == 1.5
    assert limits["max_tool_executions_by_name"] == {"status_tool": 1}
    limits["max_tool_executions_by_name"]["x"] = 3
    assert agent.budget_limits()["max_tool_executions_by_name"] == {"status_tool": 1}


# -- registry ---------------------------------------------------------------------------------------------------------


def test_register_and_resolve() -> None:
    writer = Agent("writer")
    parent = Agent("parent", sub_agents=[writer])
    assert register(parent) is parent
    assert resolve_agent("parent") is parent
    assert resolve_agent("writer") is writer
    assert set(registered_agents()) == {"parent", "writer"}

    replacement = Agent("parent")
    register(replacement)
    assert resolve_agent("parent") is replacement  # last wins

    snapshot = registered_agents()
    snapshot.clear()
    assert resolve_agent("writer") is writer


def test_resolve_unknown_agent() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_agent("ghost")
    assert str(info.value) == 'register agent "ghost" in every worker at boot'


# -- system prompt ----------------------------------------------------------------------------------------------------

NOW = datetime(2026, 9, 10, 14, 30, tzinfo=UTC)


def test_full_prompt_sections_and_split() -> None:
    agent = Agent("helper", description="Helps <people> & teams", instructions="Be brief.", model="m-1")
    stable, dynamic = build_instructions(agent, depth=0, prompt_mode=None, tools=agent.tool_specs(), now=NOW)
    assert stable.startswith("<agent>\n- Name: helper\n- Description: Helps &lt;people&gt; &amp; teams\n- Model: m-1")
    assert "<instructions>\nBe brief.\n</instructions>" in stable
    assert "<behavior>" in stable and "environment" in stable  # the default behaviour anchors dates
    assert "<tools_available>\n(none)" in stable
    assert "<sub_agent>" not in stable
    assert dynamic == (
        "<environment>\n- Today: 2026-09-10 (Thursday)\n- Current time: 2026-09-10T14:30:00+00:00\n"
        "- Yesterday: 2026-09-09\n- Tomorrow: 2026-09-11\n</environment>"
    )


def test_tools_section_lists_parameters() -> None:
    @tool(terminal="Saved.", usage_hint="the report is final")
    def save_report(title: str, pages: int = 1) -> str:
        """Save the report.

        Args:
            title: Report title.
        """
        return title

    agent = Agent("writer", tools=[save_report])
    stable, _ = build_instructions(agent, depth=0, prompt_mode="full", tools=agent.tool_specs(), now=NOW)
    assert (
        "- save_report: Save the report.\n"
        "  Use when: the report is final\n"
        "  Parameters:\n"
        "    - title: string, required — Report title.\n"
        "    - pages: integer, default=1\n"
        "  Ends the turn."
    ) in stable


def test_task_mode_for_orchestrators_and_runs() -> None:
    """T03, T09: an orchestrator's instructions contain "autonomous task orchestrator" and the task-behaviour text
    "executing an application task"; a plain agent in ``task`` prompt mode (as a run uses) gets that text too."""
    orchestrator = Agent("o", orchestrator=True)
    stable, _ = build_instructions(orchestrator, depth=0, prompt_mode=None, tools=[], now=NOW)
    assert "autonomous task orchestrator" in stable
    assert "executing an application task" in stable
    plain = Agent("p")
    stable, _ = build_instructions(plain, depth=0, prompt_mode="task", tools=[], now=NOW)
    assert "executing an application task" in stable


async def test_sub_agents_get_minimal_mode_and_none_mode(tk: TurnKit) -> None:
    """A real sub-agent turn gets the minimal prompt (a <sub_agent> section, no subject or live context), a sub-agent
    in ``none`` mode gets the one-line prompt, and the root keeps the full prompt: the model activity passes the
    turn's own depth (it used to pass 0, so children got the root's prompt)."""
    child_client = ScriptedClient(["drafted"])
    quiet_client = ScriptedClient(["quiet done"])
    child = Agent("child", instructions="Draft.", model="scripted", client=child_client)
    quiet = Agent("quiet", model="scripted", prompt_mode="none", client=quiet_client)
    boss_client = ScriptedClient([call_tools(("child", {"task": "draft it"}), ("quiet", {"task": "hush"})), "merged"])
    boss = Agent("boss", model="scripted", sub_agents=[child, quiet], client=boss_client)
    conversation = await tk.conversation(boss, context={"tenant": "acme"}, subject=_Subject())
    turn = await conversation.ask("delegate")
    assert turn.status == "completed" and turn.output_text == "merged"

    [request] = child_client.requests
    assert "<sub_agent>" in request.instructions and "You are a sub-agent" in request.instructions
    assert "<instructions>\nDraft.\n</instructions>" in request.instructions
    assert request.dynamic_instructions is not None and "<environment>" in request.dynamic_instructions
    assert "<live_context>" not in request.dynamic_instructions
    assert "<subject_context>" not in request.dynamic_instructions
    assert request.report["sections"] == ["agent", "sub_agent", "instructions", "behavior", "tools", "environment"]
    [hushed] = quiet_client.requests
    assert (hushed.instructions, hushed.dynamic_instructions) == (NONE_MODE_PROMPT, None)
    root_request = boss_client.requests[0]
    assert "<sub_agent>" not in root_request.instructions
    assert root_request.dynamic_instructions is not None
    assert "<subject_context>" in root_request.dynamic_instructions
    assert "<live_context>" in root_request.dynamic_instructions and "acme" in root_request.dynamic_instructions


def test_prompt_options_are_validated() -> None:
    with pytest.raises(TypeError, match="system_prompt must be a string or a callable"):
        Agent("a", system_prompt=42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="context_contributors must be callables"):
        Agent("a", context_contributors=["live"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="list of section names, not a string"):
        Agent("a", prompt_sections="tools")
    assert Agent("a", prompt_sections=["tools"]).prompt_sections == ("tools",)


def test_unknown_prompt_mode() -> None:
    agent = Agent("a")
    with pytest.raises(ValueError, match="unknown prompt mode: loud"):
        build_instructions(agent, depth=0, prompt_mode="loud", tools=[], now=NOW)


class _Subject:
    id = 7

    def to_prompt(self) -> str:
        return "Order 7: two lamps"


def test_naive_now_is_utc_and_prompt_is_deterministic() -> None:
    agent = Agent("a")
    first = build_instructions(agent, depth=0, prompt_mode=None, tools=[], now=datetime(2026, 1, 1))
    second = build_instructions(agent, depth=0, prompt_mode=None, tools=[], now=datetime(2026, 1, 1))
    assert first == second
    assert "2026-01-01T00:00:00+00:00" in first[1]


def test_xml_escape() -> None:
    assert xml_escape("a<b>&c\x00\x07d\ne") == "a&lt;b&gt;&amp;cd\ne"


def test_an_agents_options_are_one_typed_model() -> None:
    """``Agent(name, **options)`` takes :class:`AgentOptions` (the type checker follows them through code that passes
    them on); each option is stored under its own name, and an unknown one is refused at run time as well."""
    stored = {field.name for field in dataclasses.fields(AgentDefinition)}
    assert stored == {*AgentOptions.__optional_keys__, "name", "load_skill_tool"}
    with pytest.raises(TypeError, match="unexpected keyword argument 'modle'"):
        Agent("typo", modle="scripted")  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]
