"""Agent definitions and the process-wide agent registry (behaviour §1.2 and §9).

An :class:`Agent` is an immutable, in-memory definition; only its name is persisted. Workers rebuild the agent of a
stored turn through the registry, so every process must :func:`register` the same agents at boot.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypedDict, Unpack

from turnkit._engine.builtin_tools import sub_agent_tool
from turnkit._engine.compaction_options import normalize_compaction
from turnkit._engine.current import current
from turnkit._engine.limits import check_limits
from turnkit._engine.names import check_name
from turnkit._engine.prompt_sections import check_prompt_sections
from turnkit.config import EventCallback, settings
from turnkit.cost import Cost, total_usage
from turnkit.kernel.errors import ConfigError
from turnkit.mcp import MCPServer
from turnkit.model import Client, ToolSpec, Usage
from turnkit.output_policy import OUTPUT_POLICY_MODES, Constraint, OutputPolicyMode, normalize_output_policy
from turnkit.skills import LoadSkillTool, Skill, check_skills, dedupe_skills
from turnkit.tools import TOOLS_TYPE_ERROR, Tool, as_tool, is_valid_tool_name

if TYPE_CHECKING:
    from turnkit.handles import Conversation
    from turnkit.run import Run

__all__ = [
    "ORCHESTRATOR_PREAMBLE",
    "PROMPT_MODES",
    "Agent",
    "AgentDefinition",
    "AgentOptions",
    "SpecialistOptions",
    "normalize_thinking",
    "register",
    "registered_agents",
    "resolve_agent",
    "unregister_all",
]

#: Prepended to the instructions of ``orchestrator=True`` agents, separated by a blank line.
ORCHESTRATOR_PREAMBLE: Final = (
    "You are an autonomous task orchestrator. Drive the task to a final output without asking follow-up "
    "questions. Use your tools and any loaded skills to gather what you need, and prefer batch tools when many "
    "items need the same action. Check intermediate results and iterate when they are incomplete, stop as soon as "
    "the task is done, and stay within the runtime, cost and iteration limits you are given."
)

#: Valid system-prompt modes (behaviour §3.4).
PROMPT_MODES: Final = ("full", "minimal", "task", "none")

_THINKING_KEYS: Final = ("effort", "budget")


def normalize_thinking(thinking: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Validate and normalise a thinking option (behaviour §1.2).

    Args:
        thinking: None, or a mapping with ``effort`` and/or ``budget`` (an int) and no other keys.

    Returns:
        None, or a dict with string keys and the None values dropped.

    Raises:
        ValueError: ``"thinking requires :effort or :budget"`` when empty (or only None values); unknown keys.
        TypeError: ``thinking`` is not a mapping, or ``budget`` is not an int.
    """
    if thinking is None:
        return None
    if not isinstance(thinking, Mapping):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError("thinking must be a mapping with effort and/or budget")
    unknown = [str(key) for key in thinking if str(key) not in _THINKING_KEYS]
    if unknown:
        raise ValueError(f"unknown thinking keys: {', '.join(unknown)}")
    normalized = {str(key): value for key, value in thinking.items() if value is not None}
    if not normalized:
        raise ValueError("thinking requires :effort or :budget")
    budget = normalized.get("budget")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)):
        raise TypeError("thinking budget must be an integer")
    return normalized


class SpecialistOptions(TypedDict, total=False):
    """The :class:`AgentOptions` a specialist (:mod:`turnkit.specialists`) takes besides its own model, client,
    instructions and tools."""

    description: str
    skills: Iterable[Skill]
    available_skills: Iterable[Skill]
    sub_agents: Iterable[Agent]
    mcp_servers: Iterable[MCPServer]
    max_iterations: int | None
    max_tool_executions: int | None
    max_tool_executions_by_name: Mapping[str, int | None] | None
    timeout: float | None
    max_depth: int | None
    max_spend: float | None
    thinking: Mapping[str, Any] | None
    output_schema: Mapping[str, Any] | None
    input_schema: Mapping[str, Any] | None
    orchestrator: bool
    prompt_mode: str | None
    compaction: Mapping[str, Any] | bool | None
    system_prompt: str | Callable[[Any], Any] | None
    prompt_sections: Iterable[str] | None
    context_contributors: Iterable[Callable[..., Any]]
    inherit_globals: bool
    output_policy: Any
    output_policy_mode: str
    output_policy_model: str | None
    output_policy_thinking: Mapping[str, Any] | None
    output_retries: int | None
    on_event: EventCallback | Iterable[EventCallback] | None
    validate: bool


class AgentOptions(SpecialistOptions, total=False):
    """The options ``Agent(name, **options)`` takes, as a typed model: the type checker follows each one through
    code that passes them on (``**options: Unpack[AgentOptions]``). What each means, and its default, is on
    :class:`Agent`."""

    instructions: str
    model: str | None
    tools: Iterable[Tool | type[Tool]]
    client: Client | None


_OPTION_NAMES: Final = frozenset(AgentOptions.__optional_keys__)


@dataclass(frozen=True, kw_only=True, eq=False, repr=False)
class AgentDefinition:
    """What an :class:`Agent` holds once its options are checked and normalised: every field typed, written once by
    the dataclass's own ``__init__`` (so the type checker checks each value against its field)."""

    name: str
    description: str
    instructions: str
    """The composed instructions: stripped, with the orchestrator preamble first when ``orchestrator``."""
    model: str | None
    tools: tuple[Tool, ...]
    skills: tuple[Skill, ...]
    """Always loaded: their content is in the prompt and their tools are always offered."""
    available_skills: tuple[Skill, ...]
    """Listed in the prompt and loadable with ``load_skill``: ``settings.available_skills`` first (copied at
    construction, unless ``inherit_globals=False``), then the agent's own, de-duplicated by key."""
    load_skill_tool: LoadSkillTool | None
    """The ``load_skill`` tool over :attr:`available_skills`; None when there are none."""
    sub_agents: tuple[Agent, ...]
    mcp_servers: tuple[MCPServer, ...]
    """MCP servers whose tools the agent offers (each turn records the list it saw: :mod:`turnkit.mcp`)."""
    client: Client | None
    max_iterations: int | None
    max_tool_executions: int | None
    max_tool_executions_by_name: dict[str, int | None] | None
    timeout: float | None
    max_depth: int | None
    max_spend: float | None
    thinking: dict[str, Any] | None
    output_schema: dict[str, Any] | None
    input_schema: dict[str, Any] | None
    orchestrator: bool
    prompt_mode: str | None
    """The agent's prompt mode; ``"task"`` by default for orchestrators, else None (chosen per turn)."""
    compaction: dict[str, Any] | bool | None
    """Compaction options merged over ``settings.compaction`` (behaviour §3.10); False disables, None inherits."""
    system_prompt: str | Callable[[Any], Any] | None
    """None: the generated prompt. A string replaces it. A callable gets the built
    :class:`~turnkit.prompt.SystemPrompt` and returns the final text (no dynamic part then)."""
    prompt_sections: tuple[str, ...] | None
    """The agent's own section list (any mode), or None for the mode's (see :func:`turnkit.prompt.resolve_sections`)."""
    context_contributors: tuple[Callable[..., Any], ...]
    """Live-context contributors: the global ones copied at construction (unless ``inherit_globals=False``), then
    the agent's."""
    inherit_globals: bool
    """Whether ``settings.context_contributors`` were copied in."""
    output_policy: tuple[Constraint, ...]
    """The constraints that audit every final answer (behaviour §3.9), paths and skills already made judges; empty:
    no audit."""
    output_policy_mode: OutputPolicyMode
    """What a dirty audit does once no revision is left: ``fail``, ``report`` or ``revise``."""
    output_policy_model: str | None
    """Judge model of policies without their own; None falls back to ``settings.output_policy_model``."""
    output_policy_thinking: dict[str, Any] | None
    """Judge thinking of policies without their own; None falls back to ``settings.output_policy_thinking``."""
    output_retries: int
    """Revision requests allowed after dirty audits (per turn)."""
    on_event: EventCallback | tuple[EventCallback, ...] | None
    """The agent's event callback(s) (behaviour §3.11); None falls back to ``settings.on_event``."""
    validate: bool
    """Validate the agent's client and model when a worker starts (:mod:`turnkit.model_access`)."""


class Agent(AgentDefinition):
    """An immutable agent definition.

    Mapping options (thinking, schemas, per-tool limits) are deep-copied at construction; treat the attributes as
    read-only. Agents compare by identity.
    """

    def __init__(self, name: str, /, **options: Unpack[AgentOptions]) -> None:
        """Define an agent.

        Args:
            name: Registry key, persisted as ``agent_name``, and the tool name when used as a sub-agent.
            description: Shown in the prompt's ``<agent>`` section and used as the sub-agent tool description.
            instructions: The agent's instructions (stripped).
            model: Model name; falls back to ``settings.default_model``.
            tools: Tool instances, Tool subclasses (instantiated with no arguments) or ``@tool`` functions.
            skills: Skills always loaded (their content in the prompt, their tools always offered).
            available_skills: Skills listed in the prompt and loaded by the model with ``load_skill``; their tools
                join the turn's tool set once loaded.
            sub_agents: Agents exposed as delegation tools named after them.
            mcp_servers: :class:`~turnkit.mcp.MCPServer` s whose tools the model may call, each with the recovery
                it declares; a turn lists them at its first model call and keeps that list.
            client: Model client; falls back to ``settings.client``.
            max_iterations: Budget limit (behaviour §6); None falls back to the setting of the same name.
            max_tool_executions: Budget limit; None falls back to the setting.
            max_tool_executions_by_name: Per-tool budget limits; None falls back to the setting.
            timeout: Seconds; None falls back to the setting.
            max_depth: Sub-agent depth limit; None falls back to the setting.
            max_spend: USD limit; None falls back to the setting.
            thinking: ``{"effort": ..., "budget": int}`` (either or both).
            output_schema: JSON schema for structured output.
            input_schema: JSON schema that ``run`` inputs must satisfy.
            orchestrator: Prepend the orchestrator preamble and default the prompt mode to ``"task"``.
            prompt_mode: ``"full"``, ``"minimal"``, ``"task"`` or ``"none"`` (behaviour §3.4).
            compaction: None or True (inherit ``settings.compaction``), False (disable) or a mapping of compaction
                options (behaviour §3.10).
            system_prompt: None (the generated prompt), a string that replaces it, or a callable that receives the
                built :class:`~turnkit.prompt.SystemPrompt` and returns the final text.
            prompt_sections: Overrides the prompt's section list (names from
                :data:`turnkit._engine.prompt_sections.PROMPT_SECTIONS`).
            context_contributors: Callables adding live context to the prompt, each called with a
                :class:`~turnkit.live_context.PromptBuildContext` (sync or ``async def``).
            inherit_globals: Copy ``settings.context_contributors`` and ``settings.available_skills`` in front of the
                agent's own (at construction).
            output_policy: A constraint or a list of them auditing every final answer (behaviour §3.9): policy file
                paths (``.md``/``.markdown``/``.txt``), :class:`~turnkit.output_policy.OutputPolicy` judges,
                callables or objects with a ``check`` method.
            output_policy_mode: ``"fail"`` (default: a dirty audit fails the turn with ``TurnKit::OutputAudit``),
                ``"report"`` (the turn completes with the audit recorded) or ``"revise"`` (revision requests, then
                as ``report``; ``output_retries`` defaults to 1).
            output_policy_model: Judge model for policies without their own.
            output_policy_thinking: Judge thinking for policies without their own.
            output_retries: Revision requests allowed after dirty audits (default 0, or 1 in ``revise`` mode).
            on_event: Event callback (or a list of them) for this agent's turns without a per-turn one, and for its
                sub-agents' turns (they inherit it); None falls back to ``settings.on_event`` (behaviour §3.11).
                Called in the worker that runs the turn, so every worker must define the agent with it.
            validate: Check the agent's client and model (``client.validate(model=...)``, one cheap provider call)
                when a worker starts, so a missing key or an unknown model stops the start with a
                ``ModelAccessError`` naming the model instead of failing the first turn (:mod:`turnkit.model_access`).

        Raises:
            ValueError: ``"name is required"``, ``"duplicate tool name: X"``, ``"duplicate MCP server name: X"``, a
                thinking or tool definition error, an unknown prompt mode or an unknown prompt section; an
                ``InputError`` (a ``ValueError``) for a name that is too long or holds a control character, as for any
                other name.
            ConfigError: ``compaction`` has the wrong type or an unknown option.
            TypeError: A tools entry is not a TurnKit tool, a skill is not a Skill, a sub-agent is not an Agent, an
                MCP server is not an MCPServer, ``system_prompt`` is neither a string nor a callable, a context
                contributor is not callable, or ``prompt_sections`` is a string.
        """
        unknown = sorted(set(options) - _OPTION_NAMES)
        if unknown:  # what the type checker sees statically, said at run time too
            raise TypeError(f"Agent() got an unexpected keyword argument {unknown[0]!r}")
        o = options
        description = o.get("description", "")
        instructions = o.get("instructions", "")
        model = o.get("model", None)
        tools = o.get("tools", ())
        skills = o.get("skills", ())
        available_skills = o.get("available_skills", ())
        sub_agents = o.get("sub_agents", ())
        mcp_servers = o.get("mcp_servers", ())
        client = o.get("client", None)
        max_iterations = o.get("max_iterations", None)
        max_tool_executions = o.get("max_tool_executions", None)
        max_tool_executions_by_name = o.get("max_tool_executions_by_name", None)
        timeout = o.get("timeout", None)
        max_depth = o.get("max_depth", None)
        max_spend = o.get("max_spend", None)
        thinking = o.get("thinking", None)
        output_schema = o.get("output_schema", None)
        input_schema = o.get("input_schema", None)
        orchestrator = o.get("orchestrator", False)
        prompt_mode = o.get("prompt_mode", None)
        compaction = o.get("compaction", None)
        system_prompt = o.get("system_prompt", None)
        prompt_sections = o.get("prompt_sections", None)
        context_contributors = o.get("context_contributors", ())
        inherit_globals = o.get("inherit_globals", True)
        output_policy = o.get("output_policy", None)
        output_policy_mode = o.get("output_policy_mode", "fail")
        output_policy_model = o.get("output_policy_model", None)
        output_policy_thinking = o.get("output_policy_thinking", None)
        output_retries = o.get("output_retries", None)
        on_event = o.get("on_event", None)
        validate = o.get("validate", False)
        if not isinstance(name, str) or not name.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError("name is required")
        # Persisted as agent_name and printed by the operator's tools: the rule of every other name.
        check_name("agent name", name, optional=False)
        if prompt_mode is not None and prompt_mode not in PROMPT_MODES:
            raise ValueError(f"unknown prompt mode: {prompt_mode}")
        check_limits(
            {
                "max_iterations": max_iterations,
                "max_tool_executions": max_tool_executions,
                "max_tool_executions_by_name": max_tool_executions_by_name,
                "timeout": timeout,
                "max_depth": max_depth,
                "max_spend": max_spend,
            }
        )
        compaction_options = normalize_compaction(compaction)
        if system_prompt is not None and not isinstance(system_prompt, str) and not callable(system_prompt):
            raise TypeError("system_prompt must be a string or a callable")
        sections = None if prompt_sections is None else check_prompt_sections(prompt_sections)
        contributors = tuple(context_contributors)
        if any(not callable(each) for each in contributors):
            raise TypeError("context_contributors must be callables")
        if inherit_globals:
            # Copied now (behaviour §1.2): a later change of the setting does not reach agents already defined.
            contributors = tuple(settings.context_contributors) + contributors
        constraints = normalize_output_policy(output_policy)
        policy_mode, retries = _check_output_options(output_policy_mode, output_retries)
        resolved_tools = _resolve_tools(tools)
        resolved_sub_agents = _resolve_sub_agents(sub_agents)
        servers = _resolve_mcp_servers(mcp_servers)
        preloaded = check_skills(skills, "skills")
        loadable = check_skills(available_skills, "available_skills")
        if inherit_globals:
            loadable = tuple(settings.available_skills) + loadable
        loadable = dedupe_skills(loadable)
        load_skill = LoadSkillTool(loadable) if loadable else None
        # Every tool the agent could ever offer (behaviour §1.2): its own, the skills', the sub-agents', load_skill.
        every_tool = (
            *resolved_tools,
            *(each for skill in (*preloaded, *loadable) for each in skill.tools),
            *((load_skill,) if load_skill is not None else ()),
        )
        _check_unique_names(every_tool, resolved_sub_agents)
        for each in every_tool:
            each.validate_definition()

        text = (instructions or "").strip()
        if orchestrator:
            text = f"{ORCHESTRATOR_PREAMBLE}\n\n{text}" if text else ORCHESTRATOR_PREAMBLE

        by_name = None
        if max_tool_executions_by_name is not None:
            by_name = {str(key): limit for key, limit in max_tool_executions_by_name.items()}

        super().__init__(
            name=name,
            description=description or "",
            instructions=text,
            model=model or None,
            tools=resolved_tools,
            skills=preloaded,
            available_skills=loadable,
            load_skill_tool=load_skill,
            sub_agents=resolved_sub_agents,
            mcp_servers=servers,
            client=client,
            max_iterations=max_iterations,
            max_tool_executions=max_tool_executions,
            max_tool_executions_by_name=by_name,
            timeout=timeout,
            max_depth=max_depth,
            max_spend=max_spend,
            thinking=normalize_thinking(thinking),
            output_schema=None if output_schema is None else copy.deepcopy(dict(output_schema)),
            input_schema=None if input_schema is None else copy.deepcopy(dict(input_schema)),
            orchestrator=bool(orchestrator),
            prompt_mode=prompt_mode or ("task" if orchestrator else None),
            compaction=compaction_options,
            system_prompt=system_prompt,
            prompt_sections=sections,
            context_contributors=contributors,
            inherit_globals=bool(inherit_globals),
            output_policy=constraints,
            output_policy_mode=policy_mode,
            output_policy_model=output_policy_model or None,
            output_policy_thinking=normalize_thinking(output_policy_thinking),
            output_retries=retries,
            on_event=_check_on_event(on_event),
            validate=bool(validate),
        )

    @property
    def effective_on_event(self) -> EventCallback | tuple[EventCallback, ...] | list[EventCallback] | None:
        """The agent's ``on_event``, else ``settings.on_event`` (behaviour §1.2)."""
        return self.on_event if self.on_event is not None else settings.on_event

    # -- tools ------------------------------------------------------------------------------------------------------

    def effective_tools(self, loaded_skills: Iterable[str] = ()) -> list[Tool]:
        """The tools of a turn that loaded ``loaded_skills`` (behaviour §4.2), sub-agents aside: the agent's own, the
        preloaded skills' tools, the tools of the available skills the turn loaded, then ``load_skill``."""
        loaded = set(loaded_skills)
        found = [*self.tools, *(each for skill in self.skills for each in skill.tools)]
        found += [each for skill in self.available_skills if skill.key in loaded for each in skill.tools]
        if self.load_skill_tool is not None:
            found.append(self.load_skill_tool)
        return found

    def tool(self, name: str, loaded_skills: Iterable[str] = ()) -> Tool | None:
        """The tool with this name in the effective set of a turn that loaded ``loaded_skills`` (sub-agents are not
        included), or None."""
        return next((each for each in self.effective_tools(loaded_skills) if each.name == name), None)

    def skill_owning(self, name: str) -> Skill | None:
        """The available skill that owns the tool ``name``, or None."""
        return next((skill for skill in self.available_skills if any(t.name == name for t in skill.tools)), None)

    def sub_agent(self, name: str) -> Agent | None:
        """The sub-agent with this name, or None."""
        return next((each for each in self.sub_agents if each.name == name), None)

    def mcp_server(self, name: str) -> MCPServer | None:
        """The MCP server with this name, or None."""
        return next((each for each in self.mcp_servers if each.name == name), None)

    def tool_specs(self, loaded_skills: Iterable[str] = ()) -> list[ToolSpec]:
        """The specs of every tool the model may call in a turn that loaded ``loaded_skills``, in the order of
        behaviour §4.2: the agent's own, the skills' (preloaded, then loaded), one per sub-agent, ``load_skill``."""
        tools = self.effective_tools(loaded_skills)
        own = [each.spec() for each in tools if each is not self.load_skill_tool]
        delegation = [sub_agent_tool(each.name, each.description).spec() for each in self.sub_agents]
        last = [self.load_skill_tool.spec()] if self.load_skill_tool is not None else []
        return own + delegation + last

    # -- effective values --------------------------------------------------------------------------------------------

    @property
    def effective_model(self) -> str:
        """The agent's model, else ``settings.default_model``."""
        return self.model or settings.default_model

    @property
    def effective_thinking(self) -> dict[str, Any] | None:
        """The agent's thinking (``{"effort": ..., "budget": ...}``, a copy), or None: a turn's own ``thinking``
        replaces it, and ``thinking=None`` on a turn turns it off (behaviour §1.4)."""
        return dict(self.thinking) if self.thinking is not None else None

    @property
    def effective_output_policy(self) -> list[Constraint]:
        """The constraints every final answer is audited against (behaviour §3.9), in order; empty when none."""
        return list(self.output_policy)

    def effective_prompt_mode(self, *, depth: int = 0, prompt_mode: str | None = None) -> str:
        """The prompt mode of a turn at ``depth`` (0 for a root turn) asking for ``prompt_mode``: the turn's, else the
        agent's (``"task"`` for orchestrators), else ``"minimal"`` for sub-agents and ``"full"`` for roots (§3.4).

        Raises:
            ValueError: The mode is unknown (``"unknown prompt mode: x"``).
        """
        mode = prompt_mode or self.prompt_mode or ("minimal" if depth > 0 else "full")
        if mode not in PROMPT_MODES:
            raise ValueError(f"unknown prompt mode: {mode}")
        return mode

    @property
    def effective_client(self) -> Client:
        """The agent's client, else ``settings.client``.

        Raises:
            ConfigError: Neither is set.
        """
        client = self.client if self.client is not None else settings.client
        if client is None:
            raise ConfigError(f'no model client configured for agent "{self.name}"')
        return client

    def budget_limits(self) -> dict[str, Any]:
        """The agent's budget limits, each falling back to the setting of the same name (behaviour §6.1).

        Returns:
            ``max_iterations``, ``timeout``, ``max_depth``, ``max_tool_executions``,
            ``max_tool_executions_by_name`` (a fresh dict) and ``max_spend``.
        """
        by_name = self.max_tool_executions_by_name
        if by_name is None:
            by_name = settings.max_tool_executions_by_name
        return {
            "max_iterations": settings.max_iterations if self.max_iterations is None else self.max_iterations,
            "timeout": settings.timeout if self.timeout is None else self.timeout,
            "max_depth": settings.max_depth if self.max_depth is None else self.max_depth,
            "max_tool_executions": (
                settings.max_tool_executions if self.max_tool_executions is None else self.max_tool_executions
            ),
            "max_tool_executions_by_name": {str(key): limit for key, limit in by_name.items()},
            "max_spend": settings.max_spend if self.max_spend is None else self.max_spend,
        }

    async def conversation(
        self,
        *,
        model: str | None = None,
        subject: Any = None,
        metadata: dict[str, Any] | None = None,
        context: dict[str, Any] | None = None,
        principal: Any = None,
    ) -> Conversation:
        """Create and persist a conversation of this agent on the current connection (``async with
        turnkit.connect()``); see :meth:`turnkit.runtime.TurnKit.conversation` (behaviour §1.2). Its turns take their
        per-turn options (``model``, ``thinking``, ``output_schema``, ``prompt_mode``, ...) from each
        :meth:`~turnkit.handles.Conversation.ask`."""
        return await current().conversation(
            self, model=model, subject=subject, metadata=metadata, context=context, principal=principal
        )

    async def run(self, task: str, *, input: Any = None, wait: bool = True, **options: Any) -> Run:
        """Run ``task`` in a new conversation on the current connection (``async with turnkit.connect()``).

        ``options`` are those of :meth:`turnkit.runtime.TurnKit.run`, which takes the per-turn options of
        :meth:`~turnkit.handles.Conversation.ask` too (``model``, ``thinking``, ``output_schema``, ``prompt_mode``,
        ``paused``, ...). Raises ``InputError`` before anything is written when ``input`` does not match
        ``input_schema``.
        """
        return await current().run(self, task, input=input, wait=wait, **options)

    async def usage(self) -> Usage:
        """Tokens used by every stored turn of this agent's name, on the current connection (behaviour §1.2)."""
        return total_usage(await current().store.list_turns(agent_name=self.name))

    async def cost(self) -> Cost:
        """The USD cost of every stored turn of this agent's name (:meth:`Cost.of_turns`)."""
        return Cost.of_turns(await current().store.list_turns(agent_name=self.name))

    def __repr__(self) -> str:
        """Show the name, model and tool names."""
        names = [each.name for each in self.effective_tools()] + [each.name for each in self.sub_agents]
        return f"Agent(name={self.name!r}, model={self.model!r}, tools={names!r})"


def _check_output_options(mode: str, retries: int | None) -> tuple[OutputPolicyMode, int]:
    """The agent's ``output_policy_mode`` and ``output_retries``, checked (behaviour §1.2)."""
    if mode not in OUTPUT_POLICY_MODES:
        raise ValueError(f"output_policy_mode must be one of {', '.join(OUTPUT_POLICY_MODES)}, not {mode!r}")
    if retries is None:
        return mode, 1 if mode == "revise" else 0
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"output_retries must be an integer >= 0, not {retries!r}")
    if mode == "revise" and retries == 0:
        raise ValueError('output_policy_mode "revise" needs output_retries >= 1')
    return mode, retries


def _resolve_tools(tools: Iterable[Any]) -> tuple[Tool, ...]:
    if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Iterable):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(TOOLS_TYPE_ERROR)
    return tuple(as_tool(each) for each in tools)


def _resolve_sub_agents(sub_agents: Iterable[Any]) -> tuple[Agent, ...]:
    resolved: list[Agent] = []
    for each in sub_agents:
        if not isinstance(each, Agent):
            raise TypeError("sub_agents must be Agent instances")
        if not is_valid_tool_name(each.name):
            # A sub-agent is offered to the model as a tool named after it.
            raise ValueError(f"invalid sub-agent name: {each.name!r} (must match [a-zA-Z_][a-zA-Z0-9_]*)")
        resolved.append(each)
    return tuple(resolved)


def _resolve_mcp_servers(servers: Iterable[Any]) -> tuple[MCPServer, ...]:
    resolved: list[MCPServer] = []
    for each in servers:
        if not isinstance(each, MCPServer):
            raise TypeError("mcp_servers must be MCPServer instances")
        if any(other.name == each.name for other in resolved):
            raise ValueError(f"duplicate MCP server name: {each.name}")
        resolved.append(each)
    return tuple(resolved)


def _check_unique_names(tools: tuple[Tool, ...], sub_agents: tuple[Agent, ...]) -> None:
    seen: set[str] = set()
    for name in [each.name for each in tools] + [each.name for each in sub_agents]:
        if name in seen:
            raise ValueError(f"duplicate tool name: {name}")
        seen.add(name)


def _check_on_event(value: Any) -> EventCallback | tuple[EventCallback, ...] | None:
    """An agent's ``on_event``: None, a callable, or callables (kept as a tuple)."""
    if value is None or callable(value):
        return value
    if isinstance(value, Iterable) and not isinstance(value, str | bytes):
        callbacks = tuple(value)  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]
        if all(callable(each) for each in callbacks):  # pyright: ignore[reportUnknownVariableType]
            return callbacks  # pyright: ignore[reportUnknownVariableType]
    raise TypeError("on_event must be a callable or a list of callables")


# -- registry ---------------------------------------------------------------------------------------------------------

_registry: dict[str, Agent] = {}
_registry_lock = threading.Lock()


def register(agent: Agent) -> Agent:
    """Register an agent, and recursively its sub-agents, under their names; a later registration wins.

    Every worker process must register the same agents at boot, because stored turns carry only the name.

    Args:
        agent: The agent.

    Returns:
        The same agent, so ``register`` can wrap a definition.
    """
    if not isinstance(agent, Agent):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError("register expects an Agent")
    with _registry_lock:
        pending = [agent]
        while pending:
            current = pending.pop()
            _registry[current.name] = current
            pending.extend(current.sub_agents)
        # Re-assert the top-level agent: a sub-agent sharing its name must not shadow it.
        _registry[agent.name] = agent
    return agent


def resolve_agent(name: str) -> Agent:
    """The registered agent with this name.

    Raises:
        ConfigError: ``'register agent "<name>" in every worker at boot'`` when it is not registered.
    """
    with _registry_lock:
        agent = _registry.get(name)
    if agent is None:
        raise ConfigError(f'register agent "{name}" in every worker at boot')
    return agent


def registered_agents() -> dict[str, Agent]:
    """A copy of the registry."""
    with _registry_lock:
        return dict(_registry)


def unregister_all() -> None:
    """Empty the registry (for tests)."""
    with _registry_lock:
        _registry.clear()
