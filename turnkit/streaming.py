"""Streaming a turn as it runs: the events ``Turn.stream()`` and ``Conversation.stream()`` yield, and the sink a model
client writes its deltas to.

::

    turn = await conversation.ask("Summarise the report", wait=False)
    async for event in turn.stream():
        match event:
            case turnkit.TextDelta(text=text):
                print(text, end="", flush=True)
            case turnkit.Restart():
                print("\\n[the model call was retried: its text starts again]")
            case turnkit.TurnEnded(status=status):
                print(f"\\n{status}")

Two sources are merged. **Live** events (:class:`TextDelta`, :class:`ThinkingDelta`, :class:`Restart`) come from the
worker making the model call while it streams, through :mod:`turnkit.store.live`: across processes when the store is
PostgreSQL, within the process on SQLite. **Committed** events (:class:`ToolCallStarted`, :class:`ToolCallFinished`,
:class:`SubAgentStarted`, :class:`TurnEnded`) are read from the store's records, so they are never missed and never
repeated. The durable contract is the store's: the answer is :attr:`TurnEnded.output_text`, the response committed
once for its request; deltas are a preview of it. A model call retried after streaming part of an answer starts again
with a :class:`Restart` (its ``attempt``): drop the text its earlier attempts streamed.

A model client streams by writing to :func:`current_sink` while it answers; the model activity installs one around
the turn's main model call when ``settings.stream_model_calls`` is on (the default). TurnKit's OpenAI and Anthropic
clients then use their providers' streaming APIs; the scripted test client writes its answers as deltas too.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias

__all__ = [
    "DeltaSink",
    "Restart",
    "SubAgentStarted",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallFinished",
    "ToolCallStarted",
    "TurnEnded",
    "TurnStreamEvent",
    "current_sink",
    "streaming_to",
]


class DeltaSink(Protocol):
    """Where a model client writes what it receives while a call streams (see :func:`current_sink`)."""

    def text(self, delta: str) -> None:
        """A piece of the answer's text, in order."""
        ...

    def thinking(self, delta: str) -> None:
        """A piece of the model's thinking (reasoning summary), in order."""
        ...


_sink: ContextVar[DeltaSink | None] = ContextVar("turnkit_delta_sink", default=None)


def current_sink() -> DeltaSink | None:
    """The sink of the model call running in this task, or None when nobody streams it (answer without streaming)."""
    return _sink.get()


@contextmanager
def streaming_to(sink: DeltaSink | None) -> Generator[None]:
    """Make ``sink`` the :func:`current_sink` inside the block (None: no streaming)."""
    token = _sink.set(sink)
    try:
        yield
    finally:
        _sink.reset(token)


@dataclass(frozen=True)
class TextDelta:
    """A piece of a model call's answer text, as the provider streamed it (live)."""

    turn_id: str
    call_id: str
    """The model call (its request id): a turn makes one per iteration."""
    attempt: int
    """The model activity's attempt that streamed it (1, then 2 after a :class:`Restart`...)."""
    text: str
    type: Literal["text_delta"] = "text_delta"


@dataclass(frozen=True)
class ThinkingDelta:
    """A piece of a model call's thinking (reasoning summary), as the provider streamed it (live)."""

    turn_id: str
    call_id: str
    attempt: int
    text: str
    type: Literal["thinking_delta"] = "thinking_delta"


@dataclass(frozen=True)
class Restart:
    """A model call starts again (a retried attempt): the deltas earlier attempts of ``call_id`` streamed are void."""

    turn_id: str
    call_id: str
    attempt: int
    type: Literal["restart"] = "restart"


@dataclass(frozen=True)
class ToolCallStarted:
    """A tool call of the turn (or of a sub-agent's turn below it) started running (committed)."""

    turn_id: str
    tool_call_id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    type: Literal["tool_call_started"] = "tool_call_started"


@dataclass(frozen=True)
class ToolCallFinished:
    """A tool call ended: ``status`` is its execution's terminal status (``completed``, ``failed``...) (committed)."""

    turn_id: str
    tool_call_id: str
    name: str
    status: str
    result: Any = None
    error: dict[str, Any] | None = None
    type: Literal["tool_call_finished"] = "tool_call_finished"


@dataclass(frozen=True)
class SubAgentStarted:
    """A sub-agent's turn below the streamed turn was created (committed)."""

    turn_id: str
    """The sub-agent's turn."""
    parent_turn_id: str
    agent: str
    conversation_id: str
    type: Literal["sub_agent_started"] = "sub_agent_started"


@dataclass(frozen=True)
class TurnEnded:
    """A turn reached a terminal status; for the streamed turn itself, its stream's last event (committed).

    ``output_text`` is the answer the store recorded: the one to keep, whatever deltas came before.
    """

    turn_id: str
    status: str
    output_text: str = ""
    error: dict[str, Any] | None = None
    type: Literal["turn_ended"] = "turn_ended"


#: What ``Turn.stream()`` and ``Conversation.stream()`` yield.
TurnStreamEvent: TypeAlias = (
    TextDelta | ThinkingDelta | Restart | ToolCallStarted | ToolCallFinished | SubAgentStarted | TurnEnded
)
