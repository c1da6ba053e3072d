"""How a turn's failures are named: the error class and message a record gets when an activity, a child or a whole
turn workflow failed, and the failure types the workflows decide by.

Pure (temporalio's exception classes only), so the turn workflow, the lane and the client that records an abnormal
end (``Turn.result()``, ``turnkit repair``) name a failure the same way.
"""

from __future__ import annotations

from typing import Final

from temporalio.exceptions import ApplicationError, CancelledError, TerminatedError, TimeoutError

__all__ = [
    "MODEL_NON_RETRYABLE",
    "TIMED_OUT",
    "TOOL_RAISED",
    "ended_reason",
    "failure_of",
    "final_model_failure",
]

#: The error message of a turn whose root deadline passed (behaviour §6: ``TurnKit::BudgetError``).
TIMED_OUT: Final = "turn timed out"
#: Failure type of an at-most-once tool attempt whose body raised: the only failure of such an attempt whose outcome
#: is known (anything else may have come after the body ran, so the call is settled ``interrupted``).
TOOL_RAISED: Final = "TurnKit::ToolRaised"
#: The model activity's failure types that end the turn at once (the rest are retried until the attempts run out).
MODEL_NON_RETRYABLE: Final = ("ModelError", "ConfigError", "ModelAccessError")
#: Failure types that name TurnKit errors without the ``TurnKit::`` prefix (an activity raised the Python class).
_TURNKIT_NAMES: Final = frozenset(
    {"ModelError", "ConfigError", "ModelAccessError", "BudgetError", "ToolError", "Error", "InputError"}
)


def ended_reason(cause: BaseException | None) -> str:
    """How a turn workflow ended, for the error message of its record."""
    if isinstance(cause, TerminatedError):
        return "turn workflow terminated"
    if isinstance(cause, TimeoutError):
        return "turn workflow timed out"
    if isinstance(cause, CancelledError):
        return "turn workflow cancelled"
    return f"turn workflow failed: {cause}" if cause is not None else "turn workflow failed"


def final_model_failure(failure: BaseException | None) -> bool:
    """Whether a local model attempt's failure ends the turn, as the regular activity's retry policy would decide."""
    return isinstance(failure, ApplicationError) and (failure.non_retryable or failure.type in MODEL_NON_RETRYABLE)


def failure_of(cause: BaseException | None, err: BaseException | None = None) -> tuple[str, str]:
    """The TurnKit error class and message of a failed attempt's ``cause`` (``err``: what wrapped it, if anything)."""
    if isinstance(cause, ApplicationError):
        name = cause.type or "Error"
        if name == "TransientModelError":  # retried until the attempts ran out: the provider failed the turn
            return "TurnKit::ModelError", cause.message
        if not name.startswith("TurnKit::") and name in _TURNKIT_NAMES:
            name = f"TurnKit::{name}"
        return name, cause.message
    if isinstance(cause, TimeoutError):
        return "TurnKit::ModelError", f"activity timed out ({cause.type.name if cause.type else 'unknown'})"
    return type(cause).__name__ if cause else "Error", str(cause or err or "")
