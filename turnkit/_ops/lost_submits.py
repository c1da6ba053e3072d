"""Lost submissions, found and run by the workers: no operator needed.

A submission can be lost after its turn was written: the lane's submit commits the turn inside the workflow task
that accepts the update, and ``ask`` commits a fresh conversation's first turn before it starts its workflow. When the
caller, the worker and the Temporal server go down together in that window (one ``kill -9`` of a program that embeds
all three), the turn stays ``pending`` with no workflow and no place in its lane. The lane's next submission queues it
first (:mod:`turnkit._engine.lane_order`); this module covers the turn that nothing follows.

Every worker with a store runs :class:`SubmitSearch` beside its pollers. Every ``settings.lost_submit_grace`` seconds
it reads the submitted root turns of its own task queue (``options.task_queue``) that have not started and were
submitted longer ago than that, asks Temporal which of them have no workflow and no place in their lane (what
``turnkit check`` calls ``turn_without_workflow``), and submits each to its lane again (:func:`resubmit`): oldest first,
so each takes its place in its conversation's order. A turn its lane holds (queued behind a long turn) is looked at
again only after a while, so a deep queue costs one store read per pass, not a Temporal call per turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncGenerator, Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError

from turnkit._engine.lane_submit import resubmit
from turnkit._ops.check import UNANSWERED, held_by_lane, lane_statuses, workflow_states
from turnkit.config import settings, using_settings
from turnkit.kernel.records import TurnRecord
from turnkit.store.store import Store, utcnow

__all__ = ["SubmitSearch", "resubmit_lost"]

log = logging.getLogger("turnkit.worker")

#: How long one resubmission may take (a lane that no worker serves cannot take it now; the next pass tries again).
RESUBMIT_TIMEOUT: Final = 15.0
#: A turn its lane holds is looked at again after this long, doubling up to ``_HELD_MAX``.
_HELD_FIRST: Final = 30.0
_HELD_MAX: Final = 600.0


async def resubmit_lost(
    store: Store,
    client: Client,
    task_queue: str,
    *,
    older_than: float,
    held: dict[str, tuple[float, float]] | None = None,
    page: int = 100,
) -> list[str]:
    """One search: submit to its lane again every lost submission of ``task_queue`` older than ``older_than`` s;
    return their ids, oldest first. ``held`` remembers turns found in their lane (id → when to look again, the wait
    after that), across searches."""
    held = {} if held is None else held
    now = asyncio.get_running_loop().time()
    before = utcnow() - timedelta(seconds=older_than)
    after: tuple[datetime, str] | None = None
    done: list[str] = []
    while True:
        async with store.reads() as tx:
            turns = await tx.unstarted_turns(before=before, after=after, limit=page)
        if not turns:
            return done
        last = turns[-1]
        after = (last.submitted_at or before, last.id)
        mine = [t for t in turns if t.options.task_queue == task_queue and held.get(t.id, (0.0, 0.0))[0] <= now]
        for turn in await _lost(client, mine, held, now):
            try:
                async with asyncio.timeout(RESUBMIT_TIMEOUT):
                    await resubmit(client, turn, task_queue)
            except (WorkflowUpdateFailedError, RPCError, TimeoutError) as err:
                log.warning("could not submit lost turn %s to its lane again: %s", turn.id, err)
                continue
            log.warning("submitted turn %s to its lane again: its submission was lost", turn.id)
            done.append(turn.id)
        if len(turns) < page:
            return done


async def _lost(
    client: Client, turns: list[TurnRecord], held: dict[str, tuple[float, float]], now: float
) -> list[TurnRecord]:
    """Those of ``turns`` that have no workflow and that their lane does not hold (or may not hold: a lane whose
    workflow task is in flight, or that does not answer, is asked again next time)."""
    if not turns:
        return []
    states = await workflow_states(client, [t.id for t in turns])
    missing = [t for t in turns if states[t.id] == "missing"]
    lanes = await lane_statuses(client, [t.conversation_id for t in missing])
    lost: list[TurnRecord] = []
    for turn in missing:
        if held_by_lane(turn, lanes) or lanes.get(turn.conversation_id) == UNANSWERED:
            wait = min(held.get(turn.id, (0.0, _HELD_FIRST / 2))[1] * 2, _HELD_MAX)
            held[turn.id] = (now + wait, wait)
            continue
        held.pop(turn.id, None)
        lost.append(turn)
    for turn in turns:
        if states[turn.id] != "missing":
            held.pop(turn.id, None)  # started since: nothing to remember
    return lost


class SubmitSearch:
    """The workers' search for lost submissions, run beside a worker's pollers (``TurnKitPlugin`` starts it)."""

    def __init__(self, store: Store, client: Client, task_queue: str, overrides: Mapping[str, Any]) -> None:
        self.store, self.client, self.task_queue = store, client, task_queue
        self._overrides = overrides
        self._held: dict[str, tuple[float, float]] = {}
        #: Turns this search submitted again, oldest first (what tests and logs look at).
        self.resubmitted: list[str] = []

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncGenerator[None]:
        """Search in the background while the block runs."""
        task = asyncio.create_task(self._run(), name=f"turnkit lost-submission search ({self.task_queue})")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        with using_settings(self._overrides):  # the plugin's settings, as its activities read them
            delay = 1.0  # the first search soon after start: a crash may have left lost turns behind
            while True:
                await asyncio.sleep(delay)
                grace = settings.lost_submit_grace
                if grace is None:
                    delay = 60.0  # turned off: look at the setting again later
                    continue
                try:
                    found = await resubmit_lost(
                        self.store, self.client, self.task_queue, older_than=grace, held=self._held
                    )
                    self.resubmitted += found
                except Exception as err:  # the store or the server away: the next search tries again
                    log.info("search for lost submissions failed: %s", err)
                # A little jitter: the workers of one queue do not all search at the same moment.
                delay = max(grace / 2, 0.5) * random.uniform(0.8, 1.2)
