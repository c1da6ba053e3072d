"""``Run``: a root turn and its whole tree (behaviour §1.7), what ``agent.run(task)`` returns."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from turnkit._engine.authorization import authorize
from turnkit._engine.jsonschema import schema_errors
from turnkit._engine.validation import check_text
from turnkit.cost import Cost, total_usage
from turnkit.events import check_on_event
from turnkit.handles import UNSET, Turn, joined_root
from turnkit.kernel.errors import InputError
from turnkit.kernel.records import MessageRecord, ToolExecutionRecord, TurnRecord
from turnkit.media import MediaInput, check_media
from turnkit.model import Usage

if TYPE_CHECKING:
    from turnkit.agent import Agent
    from turnkit.runtime import TurnKit

__all__ = ["Run", "start_run", "task_text"]


class Run(Turn):
    """A root turn plus aggregate views over every turn that shares its root (children, launched agents).

    ``usage`` and ``cost`` are the whole tree's (behaviour §6.4), as of the last :meth:`refresh` or :meth:`result`;
    the root turn's own are ``turn_usage`` and ``turn_cost``.
    """

    _tree: list[TurnRecord] | None = None

    async def refresh(self) -> Run:
        """Re-read the root and its tree from the store."""
        await super().refresh()
        self._tree = await self.turn_records()
        return self

    async def result(self, *, timeout: float | None = None) -> Run:
        """Wait until the root turn has finished (see :meth:`Turn.result`), then read its tree."""
        await super().result(timeout=timeout)
        self._tree = await self.turn_records()
        return self

    @property
    def usage(self) -> Usage:
        """Tokens used by the whole tree (the root alone until the tree was read)."""
        return total_usage(self._tree) if self._tree is not None else self.turn_usage

    @property
    def cost(self) -> Cost:
        """The USD cost of the whole tree (:meth:`Cost.of_turns`; the root's until the tree was read)."""
        return Cost.of_turns(self._tree) if self._tree is not None else self.turn_cost

    @property
    def turn_usage(self) -> Usage:
        """Tokens used by the root turn alone."""
        return Usage.from_dict(self.record.usage)

    @property
    def turn_cost(self) -> Cost:
        """The USD cost of the root turn alone (:meth:`Cost.from_record`)."""
        return Cost.from_record(self.record)

    @property
    def root_turn_id(self) -> str:
        """The root of the tree (this turn, for a root run)."""
        return self.record.root_turn_id

    async def turn_records(self) -> list[TurnRecord]:
        """Every turn of the root tree, oldest first."""
        return await self._tk.store.list_turns(root_turn_id=self.root_turn_id)

    async def child_turn_records(self) -> list[TurnRecord]:
        """Turns whose parent is this turn."""
        return [t for t in await self.turn_records() if t.parent_turn_id == self.id]

    async def descendant_turn_records(self) -> list[TurnRecord]:
        """The tree minus this turn."""
        return [t for t in await self.turn_records() if t.id != self.id]

    async def failed_turn_records(self) -> list[TurnRecord]:
        """Turns of the tree that failed."""
        return [t for t in await self.turn_records() if t.status == "failed"]

    async def tree_usage(self) -> Usage:
        """Tokens used by the whole tree."""
        return total_usage(await self.turn_records())

    async def tree_cost(self) -> Cost:
        """The USD cost of the whole tree, read now (:meth:`Cost.of_turns`)."""
        return Cost.of_turns(await self.turn_records())

    async def messages(self, *, principal: Any = None) -> list[MessageRecord]:  # type: ignore[override]
        """Every message of every conversation that holds a turn of the tree, conversation by conversation; asked as
        ``read_messages`` for each of those conversations (behaviour §7.3)."""
        conversations = list(dict.fromkeys(t.conversation_id for t in await self.turn_records()))
        for conversation_id in conversations:
            await authorize("read_messages", principal, destination_conversation=conversation_id)
        messages: list[MessageRecord] = []
        for conversation_id in conversations:
            messages.extend(await self._tk.store.list_messages(conversation_id))
        return messages

    async def tool_executions(self, *, principal: Any = None) -> list[ToolExecutionRecord]:
        """Every tool execution of the tree; asked as ``read_messages`` for the root turn's conversation."""
        await authorize(
            "read_messages", principal, destination_conversation=self.record.conversation_id, turn=self.record
        )
        return await self._tk.store.list_tool_executions(root_turn_id=self.root_turn_id)


def task_text(task: str, input: Any) -> str:
    """The task message (behaviour §1.2 ``run``): the task alone, or ``Task:…\\n\\nInput:…`` (JSON unless a string)."""
    if input is None:
        return task
    body = input if isinstance(input, str) else json.dumps(input, indent=2, sort_keys=True, default=str)
    return f"Task:\n{task}\n\nInput:\n{body}"


async def start_run(
    tk: TurnKit,
    agent: Agent,
    task: str,
    *,
    input: Any = None,
    wait: bool = True,
    principal: Any = None,
    context: dict[str, Any] | None = None,
    subject: Any = None,
    metadata: dict[str, Any] | None = None,
    callback: Any = None,
    prepare: bool = False,
    compact: bool | None = None,
    budget: dict[str, Any] | None = None,
    parent_run: Run | None = None,
    root_turn_id: str | None = None,
    on_event: Any = None,
    media: Sequence[MediaInput] | None = None,
    model: str | None = None,
    thinking: dict[str, Any] | None = UNSET,
    output_schema: dict[str, Any] | None = None,
    prompt_mode: str = "task",
    paused: bool = False,
) -> Run:
    """Validate, then create a conversation and submit the task turn (``prompt_mode`` task unless given); see
    ``TurnKit.run``. ``model``, ``thinking``, ``output_schema``, ``prompt_mode`` and ``paused`` are the turn's, as
    :meth:`Conversation.ask` takes them; ``model`` is the new conversation's model too.

    With ``prepare=True`` the turn is built but not submitted (spec ``run(async: true)``): the pending run is
    returned, for :meth:`Turn.preview`, :meth:`Turn.wait_for`, then :meth:`Turn.perform_later` or :meth:`Turn.run`.
    With ``parent_run`` (or ``root_turn_id``) the run's turn joins that tree instead of starting its own (T10).
    """
    if not task:
        raise ValueError("task is required")
    if parent_run is not None:
        if root_turn_id is not None and root_turn_id != parent_run.root_turn_id:
            raise InputError("give parent_run or root_turn_id, not two different trees")
        root_turn_id = parent_run.root_turn_id
    if prepare and callback is not None:
        raise InputError("a prepared run takes its callback when it is submitted: run.perform_later(callback=...)")
    if agent.input_schema is not None:
        errors = schema_errors(input, agent.input_schema)
        if errors:
            raise InputError("; ".join(errors))  # before anything is written
    text = check_text("task", task_text(task, input))  # before the conversation is written (issue 8 item 1)
    check_on_event(on_event)  # before anything is written
    check_media(media)
    root_turn_id = await joined_root(tk.store, root_turn_id)
    conversation = await tk.conversation(
        agent, subject=subject, metadata=metadata, context=context, principal=principal, model=model
    )
    metadata = {"source": "application", "task": True}
    per_turn: dict[str, Any] = {
        "model": model,
        "thinking": thinking,
        "output_schema": output_schema,
        "prompt_mode": prompt_mode,
        "paused": paused,
    }
    if prepare:
        turn = await conversation.build_turn(
            text,
            **per_turn,
            metadata=metadata,
            compact=compact,
            budget=budget,
            root_turn_id=root_turn_id,
            on_event=on_event,
            media=media,
        )
        return Run(tk, turn.id, turn.record)
    turn = await conversation.ask(
        text,
        wait=False,
        **per_turn,
        metadata=metadata,
        callback=callback,
        compact=compact,
        budget=budget,
        root_turn_id=root_turn_id,
        on_event=on_event,
        media=media,
    )
    run = Run(tk, turn.id, turn.record)
    return await run.result() if wait else run
