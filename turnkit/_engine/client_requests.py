"""The client's side of a request that runs as a workflow of its own (docs/design.md, "No side doors"): start it
under an id that derives from the request, wait for its result, raise the TurnKit error it failed with. A cancel and a
manual compaction are such requests here; a standalone media call is in :mod:`turnkit._engine.standalone_requests`.

A start that is repeated (the server was away, and the first may have been accepted) finds the first: a running
request by its id (``USE_EXISTING``), or, where the id must never run twice (a standalone call: workflow id = turn
id), by the request key in its memo.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError

import turnkit.kernel.errors as errors
from turnkit._engine.dispatch import model_policy
from turnkit._engine.ids import new_id
from turnkit._engine.server_away import while_server_away
from turnkit._temporal.search_attributes import registration_hint
from turnkit.kernel.names import CANCEL_WORKFLOW, COMPACTION_WORKFLOW
from turnkit.kernel.records import MessageRecord
from turnkit.kernel.requests import CancelPlan, CancelRequest, CompactRequest, Descendants
from turnkit.store.patience import patiently
from turnkit.store.rows import canonical_json

if TYPE_CHECKING:
    from turnkit.runtime import TurnKit

__all__ = [
    "REQUEST_KEY",
    "REQUEST_WINDOW",
    "AlreadyRequested",
    "cancel_workflow_id",
    "compaction_message_id",
    "request_cancel",
    "request_compaction",
    "run_request",
    "turnkit_error",
]

T = TypeVar("T")

#: How long a request's start, and the wait for its result, ride out a Temporal server that is away.
REQUEST_WINDOW: Final = 60.0
#: The memo key under which a request that must run once per workflow id names the call that started it.
REQUEST_KEY: Final = "turnkit_request"


class AlreadyRequested(errors.Error):
    """A request that may run once per workflow id was started by another call."""


async def run_request(
    client: Client,
    workflow: str,
    arg: Any,
    *,
    id: str,
    task_queue: str,
    result_type: type[T],
    what: str,
    once_key: str | None = None,
    summary: str | None = None,
) -> T:
    """Start the request's workflow (or find it started) and return its result.

    ``once_key``: the id may run once ever (``REJECT_DUPLICATE``); a workflow already there is this call's own only
    when its memo names this key, and otherwise raises :class:`AlreadyRequested`. Without it, a running request
    of the same id is joined and a closed one is started again.

    Raises:
        Error: The TurnKit error the workflow failed with (its class: ``AuthorizationError``, ``CompactionError``…), or
            the server stayed away longer than :data:`REQUEST_WINDOW`.
    """

    async def start() -> WorkflowHandle[Any, T]:
        try:
            return await client.start_workflow(
                workflow,
                arg,
                id=id,
                task_queue=task_queue,
                result_type=result_type,
                id_reuse_policy=(
                    WorkflowIDReusePolicy.REJECT_DUPLICATE if once_key else WorkflowIDReusePolicy.ALLOW_DUPLICATE
                ),
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL if once_key else WorkflowIDConflictPolicy.USE_EXISTING,
                memo={REQUEST_KEY: once_key} if once_key else None,
                static_summary=summary,
            )
        except WorkflowAlreadyStartedError:
            existing = client.get_workflow_handle(id, result_type=result_type)
            memo: Mapping[str, Any] = await (await existing.describe()).memo()
            if memo.get(REQUEST_KEY) != once_key:
                raise AlreadyRequested(f"{what}: already requested") from None
            return existing  # an earlier try of this very call was accepted

    try:
        started = await while_server_away(start, window=REQUEST_WINDOW)

        async def result() -> T:
            return await started.result()

        return await while_server_away(result, window=REQUEST_WINDOW)
    except WorkflowFailureError as err:
        raise turnkit_error(err.cause) from err
    except RPCError as err:
        raise errors.Error(f"{what} failed: {err.message}{registration_hint(err.message)}") from err


def turnkit_error(cause: BaseException | None) -> errors.Error:
    """The TurnKit error a request's workflow failed with (its failure type is the error's class name)."""
    if isinstance(cause, ApplicationError):
        cls = getattr(errors, (cause.type or "").removeprefix("TurnKit::"), None)
        if isinstance(cls, type) and issubclass(cls, errors.Error):
            return cls(cause.message)
        return errors.Error(cause.message)
    return errors.Error(str(cause))


async def request_cancel(tk: TurnKit, turn_id: str, descendants: Descendants, principal: Any) -> CancelPlan:
    """``Turn.cancel`` as one durable request: the cancel workflow of this turn, scope and principal (a running one is
    joined, so a caller that asks again while it runs waits for the same request)."""
    principal = canonical_json(principal)  # as the store and the worker's hook will see it
    request = CancelRequest(turn_id=turn_id, descendants=descendants, principal=principal)
    return await run_request(
        tk.client,
        CANCEL_WORKFLOW,
        request,
        id=cancel_workflow_id(turn_id, descendants, principal),
        task_queue=tk.task_queue,
        result_type=CancelPlan,
        what=f"cancelling turn {turn_id}",
        summary=f"cancel · {turn_id} · {descendants}",
    )


def cancel_workflow_id(turn_id: str, descendants: Descendants, principal: Any) -> str:
    """The cancel workflow's id: the turn, the scope and the principal (as JSON) of the request."""
    who = json.dumps(canonical_json(principal), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(f"{descendants}\x1f{who}".encode()).hexdigest()[:16]
    return f"cancel-{turn_id}-{digest}"


def compaction_message_id(conversation_id: str, key: str) -> str:
    """The summary's id for a compaction asked with ``key`` (its workflow's id is ``compact-<message id>``)."""
    return "msg_" + hashlib.sha256(f"compact\x1f{conversation_id}\x1f{key}".encode()).hexdigest()[:24]


async def request_compaction(
    tk: TurnKit, conversation_id: str, *, focus: str | None, model: str | None, key: str | None
) -> MessageRecord:
    """``Conversation.compact`` as one durable request: the summary's id is the request's, chosen here (derived from
    ``key`` when given, so the same key finds the same summary)."""
    message_id = new_id("message") if key is None else compaction_message_id(conversation_id, key)
    request = CompactRequest(
        conversation_id=conversation_id, message_id=message_id, focus=focus, model=model, policy=model_policy()
    )
    stored = await run_request(
        tk.client,
        COMPACTION_WORKFLOW,
        request,
        id=f"compact-{message_id}",
        task_queue=tk.task_queue,
        result_type=str,
        what=f"compacting conversation {conversation_id}",
        summary=f"compact · {conversation_id}",
    )

    async def load() -> MessageRecord:
        async with tk.store.reads() as tx:
            return await tx.load_message(stored)

    return await patiently(load, what=f"return the summary of conversation {conversation_id}")
