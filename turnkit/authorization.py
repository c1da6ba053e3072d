"""The authorization hook (spec §7): one application callable, asked before every guarded action.

``turnkit.configure(authorize=fn)``; ``fn(action, principal=..., **resources)`` must return literally ``True``.
Anything else (including truthy values) denies. With no hook, everything is allowed (the trusted single-application
mode). The hook runs in activities and client calls, never in workflow code.
"""

from __future__ import annotations

from typing import Any, Final, Literal, get_args

from turnkit.config import settings
from turnkit.errors import AuthorizationError

__all__ = ["ACTIONS", "Action", "authorize", "is_authorized"]

Action = Literal[
    "tool",
    "launch_agent",
    "wait",
    "callback",
    "send_message",
    "cancel",
    "pause",
    "resume",
    "steer",
    "read_control",
    "read_messages",
]
#: Every guarded action, in the spec's order (spec §7.3).
ACTIONS: Final[tuple[str, ...]] = get_args(Action)


def is_authorized(action: Action, principal: Any, **resources: Any) -> bool:
    """Whether the configured hook allows ``action`` (True when no hook is configured)."""
    hook = settings.authorize
    if hook is None:
        return True
    check = getattr(hook, "authorize", hook)  # an object with .authorize(...) or a plain callable
    return check(action, principal=principal, **resources) is True


def authorize(action: Action, principal: Any, **resources: Any) -> None:
    """Raise :class:`AuthorizationError` ``"not authorized to <action>"`` unless the hook returns ``True``."""
    if not is_authorized(action, principal, **resources):
        raise AuthorizationError(f"not authorized to {action}")
