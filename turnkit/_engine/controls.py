"""Human controls (behaviour §5.9, §5.10): pause, resume, steer, cancel — store side.

``options.controls`` is the durable source of truth; every control write takes the root turn's lock, the same lock
the model and tool activities take at their **control boundary**, which is where a running turn acknowledges a
pause or applies steering. Signals to the turn workflow are only wake-ups (``resume``) and cancellation is Temporal
cancellation, issued by the client after the record was written.
"""

from __future__ import annotations

import uuid
from typing import Any, Final, Literal

from turnkit._engine.transcript import repair_transcript
from turnkit.events import announce_message
from turnkit.kernel.errors import Error, ToolError
from turnkit.kernel.records import (
    CANCELLABLE_TURN_STATUSES,
    CANCELLED_CLASS,
    CANCELLED_MESSAGE,
    TERMINAL_TURN_STATUSES,
    UNPAUSED_TURN_STATUSES,
    TurnRecord,
)
from turnkit.kernel.turn_state import SteeringInput, TurnControls, changeable_copy
from turnkit.store.rows import canonical_json
from turnkit.store.store import StoreTx, utcnow

__all__ = [
    "CANCELLED_ERROR",
    "STEERING_SKIP",
    "Boundary",
    "apply_cancel",
    "apply_pause",
    "apply_resume",
    "apply_steer",
    "control_boundary",
    "has_pending_controls",
    "selected_turns",
    "stamp_request",
]

CANCELLED_ERROR: Final = {"class": CANCELLED_CLASS, "message": CANCELLED_MESSAGE}
STEERING_SKIP: Final = "not executed: superseded by human steering"
FINISHED: Final = (*TERMINAL_TURN_STATUSES, "stale")

Boundary = Literal["paused", "steered"] | None


def controls_of(turn: TurnRecord) -> TurnControls:
    """A copy of ``options.controls`` (none requested when absent), to change and write back."""
    return changeable_copy(turn.options.controls_or_default)


async def selected_turns(tx: StoreTx, turn: TurnRecord, descendants: str) -> list[TurnRecord]:
    """The turn, plus its descendants (through ``parent_turn_id``, within the root tree) when cascading."""
    if descendants not in ("retain", "cascade"):
        raise ValueError(f"descendants must be 'retain' or 'cascade', not {descendants!r}")
    if descendants == "retain":
        return [turn]
    tree = await tx.list_turns(root_turn_id=turn.root_turn_id)
    children: dict[str, list[TurnRecord]] = {}
    for each in tree:
        if each.parent_turn_id:
            children.setdefault(each.parent_turn_id, []).append(each)
    selected: list[TurnRecord] = []
    frontier = [turn]
    while frontier:
        current = frontier.pop(0)
        selected.append(current)
        frontier.extend(children.get(current.id, []))
    return selected


async def _write_controls(tx: StoreTx, turn: TurnRecord, controls: TurnControls, **attrs: Any) -> TurnRecord:
    return await tx.update_turn(turn.id, options=turn.options.with_controls(controls), **attrs)


async def apply_pause(tx: StoreTx, turn: TurnRecord) -> TurnRecord:
    """Request a pause; a turn that is not running is paused at once (behaviour §5.10)."""
    if turn.status in FINISHED:
        return turn
    controls = controls_of(turn).model_copy(update={"pause_requested": True})
    status = turn.status if turn.status == "running" else "paused"
    return await _write_controls(tx, turn, controls, status=status)


async def apply_resume(tx: StoreTx, turn: TurnRecord) -> TurnRecord:
    """Withdraw the pause; a paused turn becomes pending again, or waiting if it still waits on other turns.

    Its workflow is woken by a signal.
    """
    if turn.status in FINISHED:
        return turn
    controls = controls_of(turn).model_copy(update={"pause_requested": False})
    status = turn.status
    if status == "paused":
        status = "waiting" if turn.options.state.waiting_on else "pending"
    return await _write_controls(tx, turn, controls, status=status)


async def apply_steer(
    tx: StoreTx, turn: TurnRecord, *, text: str, key: str, principal: Any, target: bool
) -> dict[str, Any] | None:
    """Queue a steering input on ``turn`` and return its receipt (idempotent by key; behaviour §5.10 ``steer!``).

    A finished target raises; a finished descendant is skipped (None).
    """
    controls = controls_of(turn)
    principal = canonical_json(principal)
    for existing in controls.inputs:
        if existing.key == key:
            if existing.text == text and existing.principal == principal:
                return existing.receipt()
            raise ToolError("steering key is already used for a different input")
    if turn.status in FINISHED:
        if target:
            raise Error(f"cannot steer a {turn.status} turn; post next-turn input instead")
        return None
    steering = SteeringInput(
        id=str(uuid.uuid4()),
        key=key,
        text=text,
        principal=principal,
        turn_id=turn.id,
        sequence=len(controls.inputs) + 1,
    )
    controls.inputs.append(steering)
    await _write_controls(tx, turn, controls)
    return steering.receipt()


async def apply_cancel(tx: StoreTx, turn: TurnRecord) -> TurnRecord:
    """End the turn ``cancelled`` now: open executions are interrupted and every call answered (behaviour §5.9)."""
    if turn.status in TERMINAL_TURN_STATUSES:
        return turn
    await repair_transcript(tx, turn)
    cancelled = await tx.claim_turn(
        turn.id,
        from_=CANCELLABLE_TURN_STATUSES,
        to="cancelled",
        error=CANCELLED_ERROR,
        completed_at=utcnow(),
        claim_token=None,
    )
    return cancelled or await tx.load_turn(turn.id)


def has_pending_controls(turn: TurnRecord) -> bool:
    """A pause was requested, or steering waits to be applied: a boundary must run before publishing output."""
    controls = turn.options.controls
    return controls is not None and controls.pending


async def control_boundary(tx: StoreTx, turn: TurnRecord) -> tuple[Boundary, TurnRecord]:
    """Behaviour §5.10 ``control_boundary!`` (under the root lock): acknowledge a pause, or apply queued steering.

    Steering first answers every proposal of the last model response that has no result yet ("superseded by human
    steering"), then appends each input as a user message and resets the phase to ``model``.
    """
    if not has_pending_controls(turn):
        return None, turn  # the common case, read without a copy: nothing was asked since the last boundary
    controls = controls_of(turn)
    if controls.pause_requested:
        paused = await tx.claim_turn(turn.id, from_=UNPAUSED_TURN_STATUSES, to="paused")
        return "paused", paused or turn
    queued = [steering for steering in controls.inputs if steering.message_id is None]
    if not queued:
        return None, turn
    # Every proposal without a result gets one before the human's words reach the model.
    await repair_transcript(tx, turn, skip_message=STEERING_SKIP)
    for steering in queued:
        message = await tx.append_message(
            turn.conversation_id,
            role="user",
            text=steering.text,
            turn_id=turn.id,
            metadata={"steering_id": steering.id, "principal": steering.principal},
        )
        announce_message(tx, message)
        steering.message_id = message.id
    options = turn.options.with_controls(controls).with_state(turn.state.asking_again())
    turn = await tx.update_turn(turn.id, options=options)
    return "steered", turn


def stamp_request(turn: TurnRecord, request_id: str) -> TurnControls | None:
    """Steering inputs in the transcript but not yet in a request get this ``request_id`` (the first one)."""
    current = turn.options.controls
    if current is None or not any(s.message_id is not None and s.request_id is None for s in current.inputs):
        return None  # nothing to stamp, read without a copy
    controls = controls_of(turn)
    changed = False
    for steering in controls.inputs:
        if steering.message_id is not None and steering.request_id is None:
            steering.request_id = request_id
            changed = True
    return controls if changed else None
