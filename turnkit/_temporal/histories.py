"""Fetching Temporal workflow histories of a run: every run of a workflow, the workflows of a TurnKit tree, the
closed workflows a visibility query matches.

A workflow's runs are found by walking its continue-as-new chain backwards from the latest run (each run's first
event names the run it continued), so nothing depends on visibility being up to date. Used by ``turnkit replay`` and
``turnkit history``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory
from temporalio.service import RPCError, RPCStatusCode

from turnkit._ops.tree import load_trees
from turnkit.store.store import Store

__all__ = ["Run", "matching_runs", "run_from_file", "run_history", "runs_of", "tree_workflow_ids"]

_CLOSING_EVENTS = frozenset(
    {
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
    }
)


@dataclass(frozen=True)
class Run:
    """One run of a workflow and its history."""

    workflow_id: str
    run_id: str
    history: WorkflowHistory

    @property
    def workflow_type(self) -> str:
        """The workflow type, from the run's first event."""
        if not self.history.events:
            return "?"
        return self.history.events[0].workflow_execution_started_event_attributes.workflow_type.name

    @property
    def closed(self) -> bool:
        """Whether the history ends with the run's close (completed, failed, continued as new, ...)."""
        return bool(self.history.events) and self.history.events[-1].event_type in _CLOSING_EVENTS

    @property
    def replayable(self) -> bool:
        """Closed, or at least one workflow task completed: a run that has just continued as new shows a one-event
        history for a moment, and a replayer waits forever on a history without a workflow task."""
        return self.closed or any(
            event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for event in self.history.events
        )


def run_from_file(path: Path) -> Run:
    """The run a history JSON file holds (``turnkit history -o``, ``temporal workflow show --output json``), named by
    the workflow id its first event records; a history without one (an older server) by the file's name."""
    history = WorkflowHistory.from_json(path.stem, path.read_text(encoding="utf-8"))
    workflow_id = path.stem
    if history.events:
        workflow_id = history.events[0].workflow_execution_started_event_attributes.workflow_id or workflow_id
    return Run(workflow_id, history.run_id, history)


async def run_history(client: Client, workflow_id: str, run_id: str | None = None) -> Run:
    """The history of one run (the latest when ``run_id`` is None)."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    if run_id is None:
        run_id = (await handle.describe()).run_id
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    return Run(workflow_id, run_id, await handle.fetch_history())


async def runs_of(client: Client, workflow_id: str, *, missing_ok: bool = False) -> list[Run]:
    """Every run of ``workflow_id``'s latest execution chain, oldest first (continued-as-new runs included).

    With ``missing_ok`` a workflow that does not exist gives [] (a conversation whose lane never started).
    """
    try:
        latest = await run_history(client, workflow_id)
    except RPCError as err:
        if missing_ok and err.status == RPCStatusCode.NOT_FOUND:
            return []
        raise
    runs = [latest]
    while runs[-1].history.events:
        started = runs[-1].history.events[0].workflow_execution_started_event_attributes
        previous = started.continued_execution_run_id
        if not previous or any(run.run_id == previous for run in runs):
            break
        runs.append(await run_history(client, workflow_id, previous))
    return runs[::-1]


async def tree_workflow_ids(store: Store, ident: str) -> list[str]:
    """The workflows behind a turn or conversation id: the lane of every conversation in its trees (the named
    conversation first), then every turn of the trees (root first, sub-agent turns after their parents)."""
    trees = await load_trees(store, ident)
    nodes = [node for tree in trees for node in tree.walk()]
    lanes: Iterable[str] = dict.fromkeys(
        ([ident] if ident.startswith("conv_") else []) + [node.turn.conversation_id for node in nodes]
    )
    return [*lanes, *dict.fromkeys(node.turn.id for node in nodes)]


async def matching_runs(client: Client, query: str) -> list[Run]:
    """The histories of every closed workflow run a visibility ``query`` matches (e.g. ``WorkflowType = "..."``)."""
    runs: list[Run] = []
    async for execution in client.list_workflows(query):
        if execution.status in (None, WorkflowExecutionStatus.RUNNING):
            continue
        runs.append(await run_history(client, execution.id, execution.run_id))
    return runs
