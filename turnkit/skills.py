"""Skills (behaviour §1.2, §4.2, §4.3): named guidance, optionally with tools, that an agent carries or loads.

An agent's ``skills`` are always loaded: their content is in the system prompt's ``<skills_loaded>`` section and
their tools are always offered. Its ``available_skills`` are only listed (``<skills_available>``); the model loads
one with the built-in ``load_skill`` tool, which returns the skill's content and makes the skill's own tools part of
the turn's tool set from the next model request on.

Which skills a turn loaded is part of the turn's stored state (``TurnState.loaded_skills``), written in the same
transaction as the ``load_skill`` call's result (see docs/design.md, "Skills"); so it survives the turn's iterations
and a worker restart, and it never carries over to another turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, Field

from turnkit._engine.names import check_name
from turnkit.kernel.errors import ToolError
from turnkit.tools import Recovery, Tool, ToolContext, as_tool

if TYPE_CHECKING:
    from turnkit.store.store import StoreTx

__all__ = ["LOAD_SKILL", "LoadSkillTool", "Skill", "check_skills", "dedupe_skills", "record_loaded_skill"]

#: The name of the built-in tool that loads an available skill.
LOAD_SKILL = "load_skill"


@dataclass(frozen=True, init=False, eq=False)
class Skill:
    """A skill: a key, a name, a description, its content (guidance for the model) and the tools it owns.

    Example::

        triage = Skill("triage", description="Sort incoming tickets.", content="Read the ticket, then ...",
                       tools=[lookup_ticket])
    """

    key: str
    """Unique among an agent's skills; what ``load_skill`` is called with."""
    name: str
    description: str
    content: str
    tools: tuple[Tool, ...]

    def __init__(
        self,
        key: str,
        *,
        name: str = "",
        description: str = "",
        content: str = "",
        tools: Iterable[Tool | type[Tool]] = (),
    ) -> None:
        """Define a skill.

        Args:
            key: The skill's key (non-empty).
            name: Display name; defaults to the key.
            description: One line shown in the ``<skills_available>`` list.
            content: The guidance itself, shown when the skill is loaded.
            tools: Tools the skill owns (instances, Tool subclasses or ``@tool`` functions).

        Raises:
            ValueError: ``"skill key is required"``; an ``InputError`` (a ``ValueError``) for a key that is too long
                or holds a control character, as for any other name.
            TypeError: A tools entry is not a TurnKit tool.
        """
        if not isinstance(key, str) or not key.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError("skill key is required")
        # Stored in a turn's state and shown in prompts: the rule of every other name.
        check_name("skill key", key.strip(), optional=False)
        object.__setattr__(self, "key", key.strip())
        object.__setattr__(self, "name", name or key.strip())
        object.__setattr__(self, "description", description or "")
        object.__setattr__(self, "content", (content or "").strip())
        object.__setattr__(self, "tools", tuple(as_tool(each) for each in tools))

    def __repr__(self) -> str:
        """Show the key and the tool names."""
        return f"Skill(key={self.key!r}, tools={[each.name for each in self.tools]!r})"


def check_skills(skills: Iterable[Any], option: str) -> tuple[Skill, ...]:
    """``skills`` as a tuple of :class:`Skill`.

    Raises:
        TypeError: ``"<option> must be Skill objects"``.
    """
    if isinstance(skills, str | bytes):
        raise TypeError(f"{option} must be Skill objects")
    resolved = tuple(skills)
    if any(not isinstance(each, Skill) for each in resolved):
        raise TypeError(f"{option} must be Skill objects")
    return resolved


def dedupe_skills(skills: Iterable[Skill]) -> tuple[Skill, ...]:
    """``skills`` without later entries whose key was seen before (behaviour §1.2: the global list comes first)."""
    seen: set[str] = set()
    kept: list[Skill] = []
    for each in skills:
        if each.key not in seen:
            seen.add(each.key)
            kept.append(each)
    return tuple(kept)


class LoadSkillTool(Tool):
    """The built-in ``load_skill`` tool (behaviour §4.3), built by an agent that has available skills.

    It returns ``{key, name, content}``; the runtime then records the key in the turn's state in the same
    transaction as the result, which adds the skill's tools to the turn's tool set.
    """

    name = LOAD_SKILL
    description = "Load one of the available skills by its key: returns its instructions and enables its tools."
    usage_hint = "Use when a skill listed in <skills_available> fits the task."
    #: No external effect: retrying it is harmless.
    recovery: ClassVar[Recovery] = "replay_safe"
    read_only: ClassVar[bool] = True
    #: Reads the skill from memory and records it in the store: quick, so it runs inside the turn's workflow task.
    local: ClassVar[bool] = True

    class Arguments(BaseModel):
        key: str = Field(description="The key of the skill to load, as listed in <skills_available>.")

    def __init__(self, skills: Sequence[Skill]) -> None:
        """Load from ``skills`` (the agent's available skills)."""
        self.skills = tuple(skills)

    def call(self, context: ToolContext, *, key: str) -> dict[str, Any]:
        """Return the skill's ``{key, name, content}``.

        Raises:
            ToolError: ``"unknown skill: <key>. Available: <keys>"``.
        """
        skill = next((each for each in self.skills if each.key == key), None)
        if skill is None:
            keys = ", ".join(each.key for each in self.skills)
            raise ToolError(f"unknown skill: {key}. Available: {keys}")
        return {"key": skill.key, "name": skill.name, "content": skill.content}


async def record_loaded_skill(tx: StoreTx, turn_id: str, key: str) -> None:
    """Add ``key`` to the turn's loaded skills (idempotent), inside the transaction that commits the load's result."""
    turn = await tx.load_turn(turn_id)
    state = turn.options.state
    if key in state.loaded_skills:
        return
    state = state.model_copy(update={"loaded_skills": [*state.loaded_skills, key]})
    await tx.update_turn(turn_id, options=turn.options.with_state(state))
