"""The base class of the specialists' tools: read-only, hence safe to run again (behaviour §1.8)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from turnkit.skills import Skill
from turnkit.tools import Recovery, Tool, as_tool

__all__ = ["ReadOnlyTool", "check_read_only"]


class ReadOnlyTool(Tool):
    """A tool with no effect outside TurnKit: ``read_only`` is True, and a lost attempt is simply retried."""

    read_only: ClassVar[bool] = True
    recovery: ClassVar[Recovery] = "replay_safe"


def check_read_only(specialist: str, tools: Iterable[object], skills: Iterable[Skill]) -> None:
    """Refuse any tool, given or owned by a skill, that is not read-only (``tool.read_only is True``).

    Raises:
        ValueError: ``"<specialist> tools must be read-only: <name>"``.
        TypeError: An entry is not a TurnKit tool.
    """
    every = [as_tool(each) for each in tools] + [each for skill in skills for each in skill.tools]
    for each in every:
        if each.read_only is not True:
            raise ValueError(f"{specialist} tools must be read-only: {each.name}")
