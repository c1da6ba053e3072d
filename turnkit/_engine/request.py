"""The model request of a turn (behaviour §3.3): one function for the model activity and for ``Turn.preview``.

Because both call :func:`build_model_request`, a preview shows exactly what the next model call would send: the same
system prompt (sections, live context, subject), the same projected messages and the same tools. Only the inputs
differ when time passes (the ``environment`` anchor of a turn that has not started is "now").
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from turnkit._engine.call_ids import provider_call_ids
from turnkit._engine.compaction import active_messages
from turnkit._engine.mcp_tools import mcp_tool_specs
from turnkit.agent import Agent
from turnkit.kernel.records import ConversationRecord, MessageRecord, TurnRecord
from turnkit.live_context import LiveContextContribution, PromptBuildContext, collect_contributions
from turnkit.model import ModelRequest
from turnkit.prompt import (
    SystemPrompt,
    build_system_prompt,
    drop_unanswered_calls,
    project_message,
    project_messages,
    resolve_prompt_mode,
    resolve_sections,
)
from turnkit.store.store import Store, utcnow

__all__ = ["build_model_request", "needs_conversation", "replay_messages", "subject_prompt_of", "turn_depth"]


def turn_depth(turn: TurnRecord) -> int:
    """The turn's sub-agent depth (0 for a root turn; children persist theirs)."""
    return turn.options.depth or 0


def subject_prompt_of(conversation: ConversationRecord) -> str:
    """The subject text snapshotted when the conversation was created (``metadata.turnkit_subject_prompt``)."""
    return str(conversation.metadata.get("turnkit_subject_prompt") or "")


def _sections(turn: TurnRecord, agent: Agent) -> tuple[str, tuple[str, ...]]:
    """The turn's prompt mode and the sections it builds."""
    mode = resolve_prompt_mode(agent, depth=turn_depth(turn), prompt_mode=turn.options.prompt_mode)
    return mode, (() if mode == "none" else resolve_sections(agent, mode))


def needs_conversation(turn: TurnRecord, agent: Agent) -> bool:
    """Whether the request of ``turn`` reads its conversation (for the subject or the contributors' live context),
    so that a caller already in a transaction can read it there and pass it to :func:`build_model_request`."""
    _, sections = _sections(turn, agent)
    return "subject" in sections or "live_context" in sections


async def build_model_request(
    store: Store,
    turn: TurnRecord,
    agent: Agent,
    messages: Sequence[MessageRecord],
    *,
    request_id: str | None,
    now: datetime | None = None,
    conversation: ConversationRecord | None = None,
    replayed: Sequence[dict[str, Any]] | None = None,
) -> ModelRequest:
    """The request the next model call of ``turn`` sends (behaviour §3.3); no model is called and nothing is written.

    Args:
        store: Read for the conversation (subject, contributors' context) when the prompt needs it and
            ``conversation`` is not given.
        turn: The turn.
        agent: Its agent.
        messages: The turn's messages (frozen context plus its own), after any compaction, in sequence order.
        request_id: The reserved request's id (``state.request_id``), for ``metadata``; None in a preview that has
            none yet.
        now: The ``environment`` anchor; default the turn's start, else the current time.
        conversation: The turn's conversation, when the caller has read it already (the model activity reads it in
            the transaction that reserves the request: see :func:`needs_conversation`).
        replayed: The request's messages, made of ``messages`` already (what :func:`replay_messages` returns) by a
            caller that keeps their projections: the model activity's, from ``Transcript.replay``.

    Raises:
        ValueError: The prompt mode or a section is unknown.
        TypeError: A context contributor returned something unusable.
    """
    model = turn.model or agent.effective_model
    state = turn.options.state
    # Loaded skills add their tools (behaviour §4.2); the agent's MCP servers the tools this turn recorded.
    specs = [*agent.tool_specs(state.loaded_skills), *mcp_tool_specs(agent, state)]
    depth = turn_depth(turn)
    mode, sections = _sections(turn, agent)
    subject = ""
    live_context: list[LiveContextContribution] = []
    if "subject" in sections or "live_context" in sections:
        if conversation is None:
            conversation = await store.load_conversation(turn.conversation_id)
        subject = subject_prompt_of(conversation) if "subject" in sections else ""
        if "live_context" in sections:
            build = PromptBuildContext(agent=agent, turn=turn, conversation=conversation, model=model)
            live_context = await collect_contributions(turn.options.context, agent.context_contributors, build)
    prompt = build_system_prompt(
        agent,
        depth=depth,
        prompt_mode=mode,
        tools=specs,
        now=now or turn.started_at or utcnow(),
        model=model,
        subject_prompt=subject,
        live_context=live_context,
    )
    if agent.system_prompt is not None:
        # A replacement has no dynamic part (behaviour §3.3); the report describes what is sent.
        text = agent.system_prompt if isinstance(agent.system_prompt, str) else await _called(agent, prompt)
        sent = {} if isinstance(agent.system_prompt, str) else prompt.sections
        prompt = SystemPrompt(mode=prompt.mode, stable=text, dynamic="", sections=sent, tool_count=len(specs))
    if replayed is None:
        replayed = replay_messages(messages)
    request = ModelRequest(
        model=model,
        tools=specs,
        instructions=prompt.stable,
        dynamic_instructions=prompt.dynamic or None,
        thinking=turn.options.thinking,
        output_schema=turn.options.output_schema,
        metadata={"turn_id": turn.id, "conversation_id": turn.conversation_id, "request_id": request_id},
        report=prompt.report(),
    )
    # Not validated again: pydantic's validation of the field copies every message, a pass over the whole transcript
    # on every call (~1 ms at 2,000 messages), and these are projections of stored messages, not an application's
    # input. The messages a worker keeps are shared, read-only (``KeptMessage``).
    request.messages = list(replayed)
    return request


def replay_messages(
    messages: Sequence[MessageRecord],
    *,
    project: Callable[[MessageRecord], list[dict[str, Any]]] = project_message,
    project_all: Callable[[Sequence[MessageRecord]], list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """The messages a model request sends for a turn's ``messages`` (behaviour §3.5): compaction's projection (each
    active summary in place of what it replaces), each message projected, the calls without a result left out (a
    frozen snapshot may hold another turn's call without its result) and the provider's own call ids put back.

    ``project`` projects one message (:func:`turnkit.prompt.project_message`, or what returns the same); ``project_all``
    all of them at once (the model activity's transcript, which takes a long conversation's kept projections whole).
    """
    active = active_messages(messages)
    projected = project_all(active) if project_all is not None else project_messages(active, project)
    return provider_call_ids(drop_unanswered_calls(projected))


async def _called(agent: Agent, prompt: SystemPrompt) -> str:
    """The text an agent's ``system_prompt`` callable makes of the built prompt (sync or ``async``)."""
    assert callable(agent.system_prompt)
    value = agent.system_prompt(prompt)
    if inspect.isawaitable(value):
        value = await value
    return str(value)
