"""Activities behind the client's requests that run as workflows of their own (``workflows/requests.py``;
docs/design.md, "No side doors"). Each runs an engine function and is idempotent by the request's ids.

* ``turnkit.cancel_turns`` / ``turnkit.announce_cancel``: a cancel's writes, then its workflows cancelled and ends
  announced (:mod:`turnkit._engine.control_writes`).
* ``turnkit.compact``: a manual compaction (:mod:`turnkit._engine.manual_compaction`).
* ``turnkit.standalone_media`` / ``turnkit.end_standalone``: a prepared turn painted or shown media
  (:mod:`turnkit._engine.media_standalone`), and its failure once the attempts ran out.

A TurnKit error that no retry mends is raised non-retryable, typed with its class name; a provider that may answer
when asked again (``TransientModelError``) is left to the activity's retry policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, cast

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from turnkit._engine.control_writes import announce_cancel, cancel_turns
from turnkit._engine.lent_clients import borrow
from turnkit._engine.manual_compaction import compact_conversation
from turnkit._engine.media_standalone import paint_turn, view_media_turn
from turnkit._engine.turn_end import fail_unfinished_turn
from turnkit._temporal.heartbeats import heartbeating
from turnkit.kernel import errors
from turnkit.kernel.activities import RequestCalls, implements
from turnkit.kernel.requests import (
    CancelPlan,
    CancelRequest,
    CompactRequest,
    StandaloneEnd,
    StandaloneMedia,
    StandaloneOutcome,
)
from turnkit.media import MediaInput
from turnkit.model import Client as ModelClient
from turnkit.store.store import Store

if TYPE_CHECKING:
    from turnkit.runtime import TurnKit

__all__ = ["RequestActivities"]


@dataclass(frozen=True)
class _Connection:
    """What the engine's media functions use of a :class:`~turnkit.runtime.TurnKit`: the worker's client, its store
    and task queue."""

    client: Client
    store: Store
    task_queue: str


class RequestActivities(RequestCalls):
    """The request activities, bound to a store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @implements(RequestCalls.cancel_turns)
    async def cancel_turns(self, request: CancelRequest) -> CancelPlan:
        """End the selected turns ``cancelled`` (all authorised first); the ones cancelled now, to announce."""
        try:
            turns = await cancel_turns(self.store, request.turn_id, request.descendants, request.principal)
        except (ValueError, errors.Error) as err:
            if _store_away(err):
                raise
            raise _final(err) from err
        return CancelPlan(turn_ids=[turn.id for turn in turns])

    @implements(RequestCalls.announce_cancel)
    async def announce_cancel(self, plan: CancelPlan) -> None:
        """Cancel the turns' workflows and announce their ends (callbacks, waiters, lanes)."""
        await announce_cancel(self.store, activity.client(), activity.info().task_queue, plan.turn_ids)

    @implements(RequestCalls.compact)
    async def compact(self, request: CompactRequest) -> str:
        """The summary's id, once appended (an attempt that finds it appended returns it)."""
        async with heartbeating():
            try:
                message = await compact_conversation(
                    self.store,
                    request.conversation_id,
                    message_id=request.message_id,
                    focus=request.focus,
                    model=request.model,
                )
            except errors.TransientModelError as err:
                raise _transient(err) from err
            except (ValueError, errors.Error) as err:
                if _store_away(err):
                    raise
                raise _final(err) from err
        return message.id

    @implements(RequestCalls.standalone_media)
    async def standalone_media(self, request: StandaloneMedia) -> StandaloneOutcome:
        """Run the call under the request's claim; the turn as the call left it."""
        turn = await self.store.load_turn(request.turn_id)
        if turn.terminal and turn.started_at is not None:
            # Only this workflow can have started the turn (its id is the turn's): an earlier attempt ended it, or a
            # cancel did meanwhile. Either way there is nothing left to do.
            return StandaloneOutcome(turn_id=turn.id, status=turn.status)
        tk = cast("TurnKit", _Connection(activity.client(), self.store, activity.info().task_queue))
        async with heartbeating():
            try:
                client = None if request.client_key is None else borrow(request.client_key)
                await _run(tk, request, client)
            except errors.TransientModelError as err:
                raise _transient(err) from err
            except errors.Error as err:
                turn = await self.store.load_turn(request.turn_id)
                if not turn.terminal:  # refused before the claim: the workflow records the turn failed
                    raise _final(err) from err
        turn = await self.store.load_turn(request.turn_id)
        return StandaloneOutcome(turn_id=turn.id, status=turn.status)

    @implements(RequestCalls.end_standalone)
    async def end_standalone(self, end: StandaloneEnd) -> StandaloneOutcome:
        """Record the turn ``failed`` with the call's last error (a no-op on a terminal turn)."""
        turn, _ = await fail_unfinished_turn(
            self.store,
            activity.client(),
            activity.info().task_queue,
            end.turn_id,
            end.error_message,
            error_class=end.error_class,
        )
        return StandaloneOutcome(turn_id=turn.id, status=turn.status)


async def _run(tk: TurnKit, request: StandaloneMedia, client: ModelClient | None) -> None:
    """The engine's call for ``request``: errors other than TurnKit's own (a provider that may answer later, a store
    that is away) leave the turn running under its claim for the next attempt."""

    def ends_turn(err: BaseException) -> bool:
        return isinstance(err, errors.Error)

    if request.operation == "paint":
        await paint_turn(
            tk,
            request.turn_id,
            request.text,
            model=request.model or "",
            client=client,
            claim_token=request.claim_token,
            ends_turn=ends_turn,
            **request.options,
        )
        return
    media: MediaInput | str = request.media_id or ""
    if request.media_given:
        # The caller's own bytes (stored by the client, as ask's media are): given again as bytes, not as a stored
        # item's id, as the caller gave them.
        async with tk.store.reads() as tx:
            record = await tx.load_media(str(media))
            data = await tx.load_media_data(record.id)
        media = MediaInput.bytes(data, mime_type=record.mime_type, filename=record.filename)
    await view_media_turn(
        tk,
        request.turn_id,
        media,
        objective=request.text,
        model=request.model,
        client=client,
        claim_token=request.claim_token,
        ends_turn=ends_turn,
        **request.options,
    )


def _transient(err: errors.TransientModelError) -> ApplicationError:
    """Retried under the activity's policy, after the provider's ``retry-after`` when it gave one."""
    delay = None if err.retry_after is None else timedelta(seconds=err.retry_after)
    return ApplicationError(str(err), type="TransientModelError", next_retry_delay=delay)


def _final(err: Exception) -> ApplicationError:
    name = errors.error_class_name(err) if isinstance(err, errors.Error) else "TurnKit::InputError"
    return ApplicationError(str(err), type=name, non_retryable=True)


def _store_away(err: Exception) -> bool:
    """A store error other than a missing record is worth waiting for; a refusal (a denial, a bad argument, a
    missing record) is refused again on every retry."""
    return isinstance(err, errors.StoreError) and not isinstance(err, errors.RecordNotFound)
