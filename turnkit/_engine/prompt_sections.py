"""The names of the system prompt's sections (behaviour §3.4), pure so that settings and agents can check them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

__all__ = ["PROMPT_SECTIONS", "check_prompt_sections"]

#: Every section a system prompt may have (behaviour §3.4), in default order; ``sub_agent`` shows only at depth > 0.
PROMPT_SECTIONS: Final = (
    "agent",
    "sub_agent",
    "instructions",
    "behavior",
    "loaded_skills",
    "available_skills",
    "tools",
    "subject",
    "live_context",
    "environment",
)


def check_prompt_sections(sections: Iterable[str]) -> tuple[str, ...]:
    """``sections`` as a tuple, each a known section name.

    Raises:
        ValueError: ``"unknown prompt section: x"``.
        TypeError: ``sections`` is a single string.
    """
    if isinstance(sections, str):
        raise TypeError("prompt_sections must be a list of section names, not a string")
    resolved = tuple(sections)
    for name in resolved:
        if name not in PROMPT_SECTIONS:
            raise ValueError(f"unknown prompt section: {name}")
    return resolved
