"""What crosses Temporal for the client's requests that run as short workflows of their own (docs/design.md, "No side
doors"): a cancel, a manual compaction, a standalone paint or view_media.

A client starts one workflow per request and waits for its result. The workflow carries the request out with
activities, so a client that dies after the start leaves all of it to be done, and one that dies before leaves
nothing. Pure, like the rest of the kernel.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from turnkit.kernel.payloads import ModelPolicy

__all__ = [
    "CancelPlan",
    "CancelRequest",
    "CompactRequest",
    "Descendants",
    "StandaloneEnd",
    "StandaloneMedia",
    "StandaloneOperation",
    "StandaloneOutcome",
]

Descendants = Literal["retain", "cascade"]
StandaloneOperation = Literal["paint", "view_media"]


class CancelRequest(BaseModel):
    """Input of the cancel workflow (``Turn.cancel``) and of its first activity, ``turnkit.cancel_turns``."""

    turn_id: str
    descendants: Descendants = "retain"
    principal: Any = None


class CancelPlan(BaseModel):
    """What ``turnkit.cancel_turns`` selected and ended: the turns whose end the workflow then carries out (their
    workflows cancelled, their callbacks, waiters and lanes told), in selection order."""

    turn_ids: list[str] = Field(default_factory=list)


class CompactRequest(BaseModel):
    """Input of the compaction workflow (``Conversation.compact``) and of ``turnkit.compact``.

    ``message_id`` is the summary's id, chosen by the client: a retried attempt, or the client asking again with the
    same ``key``, finds the summary instead of asking the model again."""

    conversation_id: str
    message_id: str
    focus: str | None = None
    model: str | None = None
    policy: ModelPolicy


class StandaloneMedia(BaseModel):
    """Input of the standalone media workflow (``Turn.paint`` / ``Turn.view_media`` of a prepared turn; workflow id =
    the turn id) and of ``turnkit.standalone_media``."""

    turn_id: str
    operation: StandaloneOperation
    #: The prompt (paint) or the objective (view_media).
    text: str
    model: str | None = None
    #: view_media: the stored media's id (bytes never cross Temporal: the client stored them first).
    media_id: str | None = None
    #: view_media: the caller gave the bytes themselves, not a stored item's id.
    media_given: bool = False
    #: The remaining keyword options of the engine's call (provider, size, params, output_schema, metadata).
    options: dict[str, Any] = Field(default_factory=dict)
    #: The key under which the caller lent its ``client=`` object, which lives in its process
    #: (``turnkit._engine.lent_clients``); None: the agent's client.
    client_key: str | None = None
    policy: ModelPolicy
    #: The claim token of this request (set by the workflow): every attempt of the call holds the same claim.
    claim_token: str = ""


class StandaloneOutcome(BaseModel):
    """How the standalone call left its turn: the record holds the rest (output, error)."""

    turn_id: str
    status: str


class StandaloneEnd(BaseModel):
    """Input of ``turnkit.end_standalone``: the call's attempts ran out (a timeout, a provider that stayed away), so
    the turn is recorded ``failed`` with this error (a no-op on a terminal turn)."""

    turn_id: str
    error_class: str
    error_message: str
