"""The authorization hook (behaviour §7): one application callable, asked before every guarded action.

``turnkit.configure(authorize=fn)``; ``fn(action, principal=..., **resources)`` (or an object with such an
``.authorize`` method), sync or ``async def``, must return literally ``True``. Anything else denies: a truthy value,
and an exception too (it is logged, and the denial records the exception's class). With no hook, everything is
allowed (the trusted single-application mode).

The hook runs in activities and client calls, never in workflow code, and never inside a store transaction: a sync
hook runs in a thread, an async one on the event loop, so a slow approval service blocks nothing but the action it
guards. It may therefore be called from several threads at once. Inside an activity it must answer within the
attempt's time (store activities: 30 s; a tool call: its timeout), or the action is denied with ``TimeoutError``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

from turnkit._engine.callbacks import call_application, require_no_transaction
from turnkit.config import settings
from turnkit.kernel.errors import AuthorizationError, error_class_name

__all__ = ["ACTIONS", "DENIAL_CLASS", "Action", "Verdict", "authorize", "check", "logger"]

logger: Final = logging.getLogger("turnkit._engine.authorization")

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
    "paint",
    "view_media",
]
#: Every guarded action, in TurnKit's order (behaviour §7.3).
ACTIONS: Final[tuple[str, ...]] = get_args(Action)

#: The error class recorded with a denial (behaviour §7.4).
DENIAL_CLASS: Final = "TurnKit::AuthorizationError"


@dataclass(frozen=True)
class Verdict:
    """The hook's answer to one question: allowed, or denied (with the exception's class when the hook raised)."""

    action: str
    allowed: bool
    hook_error: str | None = None
    """The class of the exception the hook raised (then it is a denial), e.g. ``"TimeoutError"``."""
    cause: BaseException | None = field(default=None, compare=False, repr=False)

    @property
    def message(self) -> str:
        """``"not authorized to <action>"``."""
        return f"not authorized to {self.action}"

    @property
    def details(self) -> dict[str, Any]:
        """A denied tool execution's ``error.details`` (behaviour §7.4), with ``hook_error`` when the hook raised."""
        details: dict[str, Any] = {"class": DENIAL_CLASS, "authorization_denied": True}
        if self.hook_error is not None:
            details["hook_error"] = self.hook_error
        return details

    def raise_if_denied(self) -> None:
        """Raise :class:`AuthorizationError` ``"not authorized to <action>"`` unless allowed."""
        if not self.allowed:
            raise AuthorizationError(self.message) from self.cause


async def check(action: Action, principal: Any, **resources: Any) -> Verdict:
    """Ask the configured hook about ``action`` (allowed when no hook is configured); never raises for the hook."""
    hook = settings.authorize
    if hook is None:
        return Verdict(action, True)
    require_no_transaction()
    ask = getattr(hook, "authorize", hook)  # an object with .authorize(...) or a plain callable
    try:
        answer = await call_application(ask, action, principal=principal, **resources)
    except Exception as err:  # behaviour §7.1: anything but a literal True denies, an exception included
        # A hook still thinking when the activity attempt's time is nearly up raised TimeoutError
        # (turnkit._engine.callbacks).
        logger.warning("the authorization hook raised on %r; the action is denied", action, exc_info=err)
        return Verdict(action, False, hook_error=error_class_name(err), cause=err)
    return Verdict(action, answer is True)


async def authorize(action: Action, principal: Any, **resources: Any) -> None:
    """Raise :class:`AuthorizationError` ``"not authorized to <action>"`` unless the hook returns ``True``."""
    (await check(action, principal, **resources)).raise_if_denied()
