"""Validation of budget limits (behaviour §6; issue 8 item 13): pure, so settings, agents and turns check limits
the same way without importing the budget checks that read the store's records."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from turnkit.kernel.errors import ConfigError

__all__ = ["check_limits"]


#: The smallest value each limit accepts (issue 8 item 13). A limit of 0 is meaningful where it forbids something
#: (no sub-agents, no tools, no paid calls); a turn with no model iteration or no time could never run.
_MINIMUM: Final = {
    "max_iterations": 1,
    "max_tool_executions": 0,
    "max_depth": 0,
    "max_spend": 0,
}


def check_limits(limits: Mapping[str, Any]) -> None:
    """Reject budget limits a turn cannot run under: negatives, a zero ``max_iterations`` or ``timeout``, non-numbers.

    None (fall back to the setting, or no limit) is always accepted; names not listed are ignored.

    Raises:
        ConfigError: naming the limit, e.g. ``"timeout must be a positive number of seconds, not 0"``.
    """
    for name, value in limits.items():
        if value is None:
            continue
        if name == "timeout":
            if not _number(value) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"timeout must be a positive number of seconds, not {value!r}")
        elif name == "max_spend":
            if not _number(value) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"max_spend must be a number of USD >= 0, not {value!r}")
        elif name in _MINIMUM:
            if not _integer(value) or value < _MINIMUM[name]:
                raise ConfigError(f"{name} must be an integer >= {_MINIMUM[name]}, not {value!r}")
        elif name == "max_tool_executions_by_name":
            for tool_name, limit in dict(value).items():
                if limit is not None and (not _integer(limit) or limit < 0):
                    field = f"max_tool_executions_by_name[{tool_name!r}]"
                    raise ConfigError(f"{field} must be an integer >= 0, not {limit!r}")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
