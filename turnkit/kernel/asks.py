"""What a team's workflow and TurnKit exchange when it asks an agent (:mod:`turnkit.workflow`): the activities' inputs
and results, and the :class:`TurnResult` the workflow gets back.

Pure, like the rest of the kernel: workflow code builds these, the activities in ``activities/asks.py`` read them. A
result is bounded (:data:`DEFAULT_OUTPUT_LIMIT`), because it lands in the caller's history; the whole record stays in
the store.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, Field

from turnkit.kernel import errors
from turnkit.kernel.records import TerminalTurnStatus

__all__ = [
    "DEFAULT_OUTPUT_LIMIT",
    "ERROR_MESSAGE_LIMIT",
    "MAX_CALLER_WORKFLOW_ID",
    "AskReceipt",
    "AskTurn",
    "ControlAction",
    "ControlReceipt",
    "ControlTurn",
    "FollowAsk",
    "TokenUsage",
    "TurnResult",
]

#: How many bytes (UTF-8) of a turn's output text, and of its structured output as JSON, a result carries by default.
#: Each result is an activity result in the caller's history (Temporal: 2 MB per payload, 50 MB per history), so the
#: default keeps dozens of asks well inside it; ``output_limit=`` raises or lowers it per ask.
DEFAULT_OUTPUT_LIMIT: Final = 64 * 1024
#: How many characters of a failed turn's error message a result carries.
ERROR_MESSAGE_LIMIT: Final = 4096
#: The longest workflow id that may ask: the turn's end signals its caller by id, named in a wait row. Temporal's
#: own default limit on ids (``limit.maxIDLength``), so that any workflow of a default cluster can ask an agent.
MAX_CALLER_WORKFLOW_ID: Final = 1000

ControlAction = Literal["pause", "resume", "steer", "cancel"]


class TokenUsage(BaseModel):
    """Tokens used, in the exclusive buckets of :class:`turnkit.Usage` (they do not overlap)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    thinking_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """The sum of the five buckets."""
        return (
            self.input_tokens + self.output_tokens + self.cached_tokens + self.cache_write_tokens + self.thinking_tokens
        )


class TurnResult(BaseModel):
    """How a turn asked from a workflow ended: its terminal status, its (bounded) output, its error, what it used.

    ``output_text`` holds at most ``output_limit`` bytes of the answer (cut at a character boundary) and
    ``output_data`` is left out when its JSON is larger; ``output_truncated`` says so, and ``output_bytes`` gives the
    full answer's size. The complete record is in the store (``tk.turn(turn_id)`` from an activity or a client).
    """

    turn_id: str
    conversation_id: str
    agent_name: str
    status: TerminalTurnStatus
    output_text: str = ""
    #: Structured output, when the turn asked for an ``output_schema`` (None when larger than the limit).
    output_data: Any = None
    output_truncated: bool = False
    #: The size of the whole output text in UTF-8 bytes.
    output_bytes: int = 0
    #: ``TurnKit::ModelError``, ``TurnKit::BudgetError``…, for a failed or cancelled turn.
    error_class: str | None = None
    error_message: str | None = None
    #: Tokens this turn used (its sub-agents' turns excluded) and its observed cost in USD (None when unknown).
    usage: TokenUsage = Field(default_factory=TokenUsage)
    cost: float | None = None
    #: The same for its whole tree: its root turn and every turn under it (sub-agents, launched agents).
    tree_usage: TokenUsage = Field(default_factory=TokenUsage)
    tree_cost: float | None = None

    @property
    def completed(self) -> bool:
        """Whether the turn completed (not failed, not cancelled)."""
        return self.status == "completed"

    def raise_for_status(self) -> TurnResult:
        """Return the result if the turn completed; raise its TurnKit error otherwise (e.g. ``BudgetError`` for a
        turn over budget, :class:`~turnkit.kernel.errors.Error` for a cancelled one). Raised in workflow code, a
        TurnKit error fails the workflow (``TurnKitPlugin`` declares it a workflow failure)."""
        if self.completed:
            return self
        name = (self.error_class or "").removeprefix("TurnKit::")
        cls = getattr(errors, name, None)
        if not (isinstance(cls, type) and issubclass(cls, errors.Error)):
            cls = errors.Error
        raise cls(f"turn {self.turn_id} {self.status}: {self.error_message or self.status}")


class AskTurn(BaseModel):
    """Input of ``turnkit.ask_from_workflow``: submit one turn for a workflow, as ``Conversation.ask`` would.

    Every id is chosen in the workflow (from its deterministic random source), so a retried activity, or a replay of
    the workflow, finds the conversation, the message and the turn the first attempt wrote.
    """

    #: The calling workflow: its id names it as the turn's waiter (the turn's end signals it), its run id is recorded.
    caller_workflow_id: str
    caller_run_id: str
    turn_id: str
    message_id: str
    conversation_id: str
    #: Create the conversation (bound to ``agent_name``) under ``conversation_id`` if it does not exist yet.
    new_conversation: bool = False
    agent_name: str | None = None
    text: str
    #: ``run``: ``text`` is a task and ``task_input`` its input (checked against the agent's ``input_schema``).
    task: bool = False
    task_input: Any = None
    model: str | None = None
    thinking: dict[str, Any] | None = None
    thinking_set: bool = False
    output_schema: dict[str, Any] | None = None
    prompt_mode: str | None = None
    context: dict[str, Any] | None = None
    principal: Any = None
    message_metadata: dict[str, Any] | None = None
    #: Metadata of a new conversation (``run``'s ``metadata``).
    conversation_metadata: dict[str, Any] | None = None
    callback_conversation_id: str | None = None
    wait_for: list[str] = Field(default_factory=list)
    paused: bool = False
    compact: bool | None = None
    budget: dict[str, Any] | None = None
    root_turn_id: str | None = None
    #: Where the turn (and its conversation's lane) runs.
    task_queue: str
    output_limit: int = DEFAULT_OUTPUT_LIMIT


class AskReceipt(BaseModel):
    """Result of ``turnkit.ask_from_workflow``: the submitted turn, and its result if it had ended already."""

    turn_id: str
    conversation_id: str
    result: TurnResult | None = None


class FollowAsk(BaseModel):
    """Input of ``turnkit.follow_asked_turn``: the turn's result if it ended, else keep ``waiter_id`` its waiter."""

    turn_id: str
    waiter_id: str
    task_queue: str
    output_limit: int = DEFAULT_OUTPUT_LIMIT


class ControlTurn(BaseModel):
    """Input of ``turnkit.control_asked_turn``: a human control on a turn, as ``Turn.pause`` … ``Turn.cancel`` do."""

    turn_id: str
    action: ControlAction
    principal: Any = None
    descendants: str = "retain"
    #: ``steer`` only: the input, and its idempotency key.
    text: str = ""
    key: str = ""
    task_queue: str


class ControlReceipt(BaseModel):
    """Result of ``turnkit.control_asked_turn``: the turn's status after the control, and a steer's receipts."""

    turn_id: str
    status: str
    receipts: list[dict[str, Any]] = Field(default_factory=list)
