"""The client's side of ``Turn.paint`` / ``Turn.view_media`` of a prepared turn (behaviour §3.12 standalone mode;
docs/design.md, "No side doors").

The call runs in the turn's own workflow (workflow id = turn id, so the turn runs once, and ``Turn.result()``,
``Turn.cancel()`` and ``turnkit check`` find it as they find any turn's): this checks what it can before anything is
started (the options, the turn is a prepared one), stores the caller's media bytes (they never cross Temporal), lends
a ``client=`` object to a worker in this process, starts the workflow and waits for it. The record says how it ended:
completed (returned), failed (its error raised, as the call raised it), or cancelled meanwhile.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Final

import turnkit.kernel.errors as errors
from turnkit._engine.client_requests import AlreadyRequested, run_request
from turnkit._engine.dispatch import model_policy
from turnkit._engine.lent_clients import lend
from turnkit._engine.media_standalone import check_claimable
from turnkit._engine.validation import check_json
from turnkit.kernel.names import STANDALONE_MEDIA_WORKFLOW
from turnkit.kernel.records import TurnRecord
from turnkit.kernel.requests import StandaloneMedia, StandaloneOperation, StandaloneOutcome
from turnkit.media import MediaInput, stored_media
from turnkit.store.patience import patiently

if TYPE_CHECKING:
    from turnkit.runtime import TurnKit

__all__ = ["request_standalone"]

#: The keyword options each call takes besides its prompt or objective (see the engine's ``paint_turn`` and
#: ``view_media_turn``).
_OPTIONS: Final[dict[str, frozenset[str]]] = {
    "paint": frozenset({"provider", "size", "params", "metadata", "client"}),
    "view_media": frozenset({"provider", "output_schema", "params", "metadata", "client"}),
}
_JSON_OPTIONS: Final = ("params", "metadata", "output_schema")


async def request_standalone(
    tk: TurnKit,
    turn_id: str,
    operation: StandaloneOperation,
    text: str,
    *,
    model: str | None,
    media: MediaInput | str | None = None,
    options: dict[str, Any],
) -> TurnRecord:
    """Run the standalone call on the prepared turn ``turn_id`` and return the completed record.

    Raises:
        TypeError: An option the call does not take.
        Error: ``"cannot <verb> for <status> turn"`` and the other refusals of a turn that is not a prepared one
            (nothing started); ``"turn is already running"`` (another call has it); the error the
            call failed the turn with (``ModelError``, ``BudgetError``, ``OutputAudit`` with its audit…); ``LostClaim``
            when the turn was cancelled meanwhile.
    """
    verb = "paint" if operation == "paint" else "view media"
    unknown = sorted(set(options) - _OPTIONS[operation])
    if unknown:
        raise TypeError(f"{operation}() got an unexpected keyword argument {unknown[0]!r}")
    options = dict(options)
    client = options.pop("client", None)
    for name in _JSON_OPTIONS:
        check_json(name, options.get(name))
    check_claimable(await _load(tk, turn_id), verb)
    media_id, given = None, False
    if isinstance(media, MediaInput):
        [part] = await patiently(lambda: stored_media(tk.store, [media]), what=f"store the media for turn {turn_id}")
        media_id, given = str(part["media_id"]), True
    elif media is not None:
        media_id = str(media)
    key = uuid.uuid4().hex
    request = StandaloneMedia(
        turn_id=turn_id,
        operation=operation,
        text=text,
        model=model,
        media_id=media_id,
        media_given=given,
        options=options,
        client_key=None if client is None else key,
        policy=model_policy(),
    )
    try:
        with lend(key, client):
            await run_request(
                tk.client,
                STANDALONE_MEDIA_WORKFLOW,
                request,
                id=turn_id,
                task_queue=tk.task_queue,
                result_type=StandaloneOutcome,
                what=f"{operation} for turn {turn_id}",
                once_key=key,
                summary=f"{operation} · {turn_id}",
            )
    except AlreadyRequested:
        raise errors.Error("turn is already running") from None  # another call has the turn
    except errors.Error:
        if not (await _load(tk, turn_id)).terminal:
            raise
        # The workflow was cancelled with the turn, or failed after ending it: the record says how.
    return _ended(await _load(tk, turn_id))


async def _load(tk: TurnKit, turn_id: str) -> TurnRecord:
    """The turn's record, a database blink waited out (the call itself runs on a worker; only its reads are here)."""
    return await patiently(lambda: tk.store.load_turn(turn_id), what=f"return turn {turn_id}")


def _ended(turn: TurnRecord) -> TurnRecord:
    """The record, if the call completed it; else what ended it, raised."""
    if turn.status == "completed":
        return turn
    if turn.status == "cancelled":
        raise errors.LostClaim(f"turn {turn.id} is cancelled: this call no longer holds its claim")
    error = turn.error or {}
    message = str(error.get("message") or "")
    name = str(error.get("class") or "").removeprefix("TurnKit::")
    if name == "OutputAudit":
        raise errors.OutputAudit(message, error.get("policy_audit"))
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.Error):
        raise cls(message)
    raise errors.Error(message)
