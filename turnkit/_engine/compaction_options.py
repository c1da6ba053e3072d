"""Compaction options (behaviour §3.10): their defaults, and how the layers (``settings.compaction``, an agent's
``compaction``, a call's overrides) are validated and merged. Pure, so settings and agent definitions validate their
layer without importing the compaction machinery (which builds prompts from agents)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from turnkit.kernel.errors import ConfigError

__all__ = ["DEFAULTS", "compaction_policy", "normalize_compaction"]

#: The compaction options and their defaults (behaviour §3.10).
DEFAULTS: Final[Mapping[str, Any]] = {
    "enabled": True,
    "threshold": 0.75,
    "context_limit": 128_000,
    "reserved_tokens": 20_000,
    "head_messages": 0,
    "tail_messages": 12,
    "tail_tokens": 8_000,
    "summary_ratio": 0.20,
    "min_summary_tokens": 1_000,
    "max_summary_tokens": 12_000,
    "tool_output_max_chars": 2_000,
    "model": None,
    "client": None,
}


def normalize_compaction(value: Any) -> dict[str, Any] | Literal[False] | None:
    """Validate one compaction layer (``settings.compaction``, an agent's or a call's option).

    Args:
        value: None or True (inherit), False (disable) or a mapping of options from :data:`DEFAULTS`.

    Returns:
        None for "inherit", False, or a copy of the mapping with string keys.

    Raises:
        ConfigError: ``"compaction must be true, false or a mapping"``, or ``"unknown compaction option: x"``.
    """
    if value is None or value is True:
        return None
    if value is False:
        return False
    if not isinstance(value, Mapping):
        raise ConfigError("compaction must be true, false or a mapping")
    options = {str(key): item for key, item in value.items()}  # pyright: ignore[reportUnknownVariableType]
    for key in options:
        if key not in DEFAULTS:
            raise ConfigError(f"unknown compaction option: {key}")
    return options


def compaction_policy(*layers: Any) -> dict[str, Any] | None:
    """Merge compaction layers over :data:`DEFAULTS`, in order (later wins).

    Args:
        *layers: e.g. ``settings.compaction, agent.compaction, overrides``; each as for :func:`normalize_compaction`.

    Returns:
        The merged policy, or None when any layer is False or the merged ``enabled`` is false.

    Raises:
        ConfigError: A layer has the wrong type or an unknown key.
    """
    policy = dict(DEFAULTS)
    disabled = False
    for layer in layers:
        normalized = normalize_compaction(layer)
        if normalized is False:
            disabled = True  # keep validating the other layers
        elif normalized:
            policy.update(normalized)
    if disabled or not policy["enabled"]:
        return None
    return policy
