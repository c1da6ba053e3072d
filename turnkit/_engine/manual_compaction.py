"""Manual compaction (``Conversation.compact``, behaviour §3.10) as the ``turnkit.compact`` activity runs it.

The policy is ``settings.compaction`` merged with the agent's ``compaction``. The summary is appended as an assistant
``context_summary`` message without a turn, under the id the client chose for the request: an attempt that finds it
returns it without asking the model again (docs/design.md, "No side doors"). Its model call belongs to no turn, so it
is charged to none.
"""

from __future__ import annotations

from turnkit._activities.store_retry import retry_store
from turnkit._engine.compaction import compaction_policy, summarise
from turnkit.agent import resolve_agent
from turnkit.config import settings
from turnkit.kernel.errors import CompactionError, InputError, TransientModelError
from turnkit.kernel.records import MessageRecord
from turnkit.store.store import Store

__all__ = ["compact_conversation"]


async def compact_conversation(
    store: Store, conversation_id: str, *, message_id: str, focus: str | None = None, model: str | None = None
) -> MessageRecord:
    """Summarise the middle of the conversation now and append the summary as ``message_id`` (once).

    Raises:
        CompactionError: ``"compaction is disabled"``, ``"not enough messages to compact"``, ``"compaction model
            returned an empty summary"``, or ``"compaction failed: <cause>"``.
        TransientModelError: The provider may answer when asked again (the activity's retry policy decides).
        InputError: ``message_id`` names a message that is not this conversation's summary.
    """
    existing = await _existing(store, message_id)
    if existing is not None:
        if existing.conversation_id != conversation_id or existing.kind != "context_summary":
            raise InputError(f"key is already used by message {message_id} of another request")
        return existing
    conversation = await store.load_conversation(conversation_id)
    agent = resolve_agent(conversation.agent_name)
    policy = compaction_policy(settings.compaction, agent.compaction)
    if policy is None:
        raise CompactionError("compaction is disabled")
    messages = await store.list_messages(conversation_id)  # a store failure is not a compaction failure
    try:
        summary = await summarise(
            messages,
            policy,
            agent,
            auto=False,
            model=model,
            fallback_model=conversation.model,
            focus=focus,
            metadata={"conversation_id": conversation_id},
        )
    except (CompactionError, TransientModelError):
        raise
    except Exception as err:
        raise CompactionError(f"compaction failed: {err}") from err
    if summary is None:
        raise CompactionError("not enough messages to compact")

    async def keep() -> MessageRecord:
        # Idempotent under the request's id: a try whose commit landed before its connection went away is found.
        return await _existing(store, message_id) or await store.append_message(
            conversation_id,
            id=message_id,
            role="assistant",
            kind="context_summary",
            text=summary.text,
            metadata=summary.metadata,
        )

    # The model has answered and is owed: the summary waits out a store outage rather than be lost with the attempt
    # (whose retry would ask, and pay, again).
    return await retry_store(keep, what="keeping a compaction summary")


async def _existing(store: Store, message_id: str) -> MessageRecord | None:
    async with store.reads() as tx:
        return await tx.find_message(message_id)
