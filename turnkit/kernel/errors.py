"""TurnKit's error hierarchy (behaviour §8).

Every error TurnKit raises on purpose derives from :class:`Error`. Each class carries TurnKit's Ruby-style name in
``qualified_name`` because that string is what gets persisted in error records (``{"class": "TurnKit::BudgetError",
...}``), and applications written against the gem's records compare against those literals.

Definition-time and API misuse (the gem's Ruby ``ArgumentError``) is raised as Python's ``ValueError``, or
``TypeError`` when a value has the wrong type, with TurnKit's message.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "AuthorizationError",
    "BudgetError",
    "CompactionError",
    "ConfigError",
    "Error",
    "InputError",
    "LostClaim",
    "ModelAccessError",
    "ModelError",
    "OutputAudit",
    "RecordNotFound",
    "StoreError",
    "ToolError",
    "ToolOutcomeUnknown",
    "ToolValidationError",
    "TransientModelError",
    "error_class_name",
]


class Error(Exception):
    """Base class of every TurnKit error (``TurnKit::Error``).

    A TurnKit error raised inside a turn fails the turn durably, for inline and background turns alike.
    """

    qualified_name: ClassVar[str] = "TurnKit::Error"


class AuthorizationError(Error):
    """The authorization policy denied an action (``"not authorized to <action>"``, behaviour §7)."""

    qualified_name: ClassVar[str] = "TurnKit::AuthorizationError"


class BudgetError(Error):
    """A budget limit of behaviour §6 was reached (iterations, tool executions, depth, timeout or spend)."""

    qualified_name: ClassVar[str] = "TurnKit::BudgetError"


class ConfigError(Error):
    """TurnKit is configured wrongly: an unregistered agent, unknown settings or cost-rate keys, a missing client."""

    qualified_name: ClassVar[str] = "TurnKit::ConfigError"


class ModelAccessError(ConfigError):
    """A model client cannot reach the requested model: no model name, the provider's API key is missing, or (from
    ``client.validate(model=...)``) the provider refused the key or does not know the model. The message names the
    model."""

    qualified_name: ClassVar[str] = "TurnKit::ModelAccessError"


class ModelError(Error):
    """A provider or SDK failure normalised by a client. It fails the turn; it is not a worker crash."""

    qualified_name: ClassVar[str] = "TurnKit::ModelError"


class TransientModelError(Exception):
    """A provider failure that may succeed when retried: rate limits, overload, 5xx answers, lost connections.

    It is deliberately *not* a :class:`~turnkit.kernel.errors.ModelError`: the model activity turns every ``ModelError``
    into a non-retryable failure that fails the turn, while any other exception is retried by Temporal under the
    model activity's retry policy. The message has the same ``"<SDK class>: <message>"`` form as a ``ModelError``.
    ``retry_after`` is the delay the provider asked for (its ``retry-after`` header): the model activity's next
    attempt waits that long instead of its retry policy's backoff.
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        """Create the error; ``retry_after`` in seconds, None when the provider asked for no delay."""
        super().__init__(message)
        self.retry_after = retry_after


class CompactionError(Error):
    """A manual compaction failed (behaviour §3.10)."""

    qualified_name: ClassVar[str] = "TurnKit::CompactionError"


class InputError(Error, ValueError):
    """Input the API cannot accept: ``Agent.run`` input that fails the agent's ``input_schema``, or a value the store
    cannot hold (NUL, a lone surrogate, NaN, a name or key too long, text over ``max_input_bytes``), an empty text or
    key, a malformed id. The message names the field. Nothing is sent or written when it is raised.

    It is also a ``ValueError``: TurnKit's API misuse (Ruby ``ArgumentError``) is ``ValueError`` in Python.
    """

    qualified_name: ClassVar[str] = "TurnKit::InputError"


class OutputAudit(Error):
    """A final answer failed the agent's output policies in ``fail`` mode (behaviour §3.9).

    The turn is recorded ``failed`` with this class, the violation messages joined by ``"; "`` and the audit
    (``{"class", "message", "policy_audit"}``); the answer is still recorded as the turn's output.
    """

    qualified_name: ClassVar[str] = "TurnKit::OutputAudit"

    def __init__(self, message: str, policy_audit: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.policy_audit = policy_audit


class StoreError(Error):
    """A store operation failed."""

    qualified_name: ClassVar[str] = "TurnKit::StoreError"


class RecordNotFound(StoreError, LookupError):
    """A record looked up by id does not exist, e.g. ``"turn not found: turn_…"``.

    It is also a ``LookupError`` so callers that treat "missing" generically can catch it without importing TurnKit.
    """

    qualified_name: ClassVar[str] = "TurnKit::RecordNotFound"

    @classmethod
    def of(cls, kind: str, record_id: str) -> RecordNotFound:
        """Build the standard message for a missing record.

        Args:
            kind: The record type, e.g. ``"turn"`` or ``"conversation"``.
            record_id: The id that was looked up.

        Returns:
            An error whose message is ``"<kind> not found: <record_id>"``.
        """
        return cls(f"{kind} not found: {record_id}")


class LostClaim(Error):
    """A fenced write happened after this worker lost ownership of the turn or tool execution (behaviour §5.4)."""

    qualified_name: ClassVar[str] = "TurnKit::LostClaim"


class ToolError(Error):
    """A tool-level failure reported to the model.

    A tool body raises it to fail its execution on purpose: the model sees the message and the turn continues.
    """

    qualified_name: ClassVar[str] = "TurnKit::ToolError"


class ToolValidationError(ToolError):
    """The model's arguments for a tool are invalid (behaviour §4.1 ``validate_arguments``)."""

    qualified_name: ClassVar[str] = "TurnKit::ToolValidationError"


class ToolOutcomeUnknown(Exception):
    """A tool body lost its call midway (the connection to the system that runs it dropped after the request went
    out): whether it had its effect is unknown.

    Never recorded as the tool failing: a replay-safe tool is retried (same idempotency key), and an at-most-once
    call is settled ``interrupted``, as when its worker dies.
    """


def error_class_name(exc: BaseException) -> str:
    """The class name to persist for an error.

    Args:
        exc: Any exception.

    Returns:
        The spec name (``"TurnKit::BudgetError"``) for TurnKit's own error classes; otherwise the Python class name,
        which also covers application subclasses of TurnKit errors.
    """
    cls = type(exc)
    # Only classes that declare their own qualified_name get it; an application's `class Oops(ToolError)` would
    # otherwise be recorded as "TurnKit::ToolError" and lose its identity.
    if issubclass(cls, Error) and "qualified_name" in cls.__dict__:
        return cls.qualified_name
    return cls.__name__
