"""The control boundary between building a model request and sending it (behaviour §5.10).

The model activity reserves its request at the top of the iteration, then may compact the history (a summariser's
call), list MCP tools and read media bytes before it asks the model: seconds, sometimes. A pause, steering or a
cancel that lands meanwhile must not pay for the call, so the boundary runs once more right before it. The reserved
iteration stays spent, as in the seed: steering asks again with a new request, a resume reserves a new one.

Nothing pending is the common case and costs one read of the turn; the root's lock is taken only to apply a control.
"""

from __future__ import annotations

from typing import Literal

from turnkit._engine.controls import control_boundary, has_pending_controls
from turnkit.store.store import Store

__all__ = ["LateBoundary", "boundary_before_call"]

#: What stops a built request from being sent: the turn paused, steered, or no longer running (cancelled, ended).
LateBoundary = Literal["paused", "steered", "stopped"] | None


async def boundary_before_call(store: Store, turn_id: str, root_turn_id: str) -> LateBoundary:
    """Pass the control boundary before the model call of ``turn_id``; None: send the request."""
    async with store.reads() as tx:
        turn = await tx.load_turn(turn_id)
    if turn.status == "running" and not has_pending_controls(turn):
        return None
    async with store.atomic(turn_id=root_turn_id) as tx:
        turn = await tx.load_turn(turn_id)
        if turn.status == "paused":
            return "paused"
        if turn.status != "running":
            return "stopped"
        boundary, _ = await control_boundary(tx, turn)
        return boundary
