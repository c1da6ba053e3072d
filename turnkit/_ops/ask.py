"""``turnkit ask --app MODULE AGENT "text"``: run one turn from the command line, watch it, print the answer.

The turn runs like any other: submitted to the agent's new conversation through its lane, on the cluster and store
the connection options name, or on the embedded defaults (a dev server and a SQLite store under ``./.turnkit/``).

Who runs it (``--worker``, :func:`choose_worker`): ``in-process`` starts a worker in this process for the app's agents,
``external`` relies on workers elsewhere, and ``auto`` (the default) decides. On the embedded dev server, which this
process has just started, nobody else can be polling, so it runs one in-process; on a configured cluster it asks
Temporal who polls the task queue for workflow tasks: if a worker was seen in the last :data:`POLLER_FRESHNESS`
seconds it uses those workers (a second, local copy of the code must not compete with a deployment's workers),
otherwise it runs one in-process. The decision is printed with the reason.

While the turn runs, its progress is printed (to stderr, so that stdout holds only the answer): each model iteration,
tool call and sub-agent turn, read from the store by :func:`turnkit._ops.event_stream.follow` (the stream of ``turnkit
events --follow``), and a summary line at the end. The model's text is printed as it streams, token by token, when
the store's live transport reaches this process (:mod:`turnkit.store.live`): always on PostgreSQL, and on SQLite
when the turn runs in this process's worker. Otherwise (SQLite, a worker elsewhere) each iteration's text shows once
it is committed, as before; the header line says which.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal, TextIO

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.service import RPCError

from turnkit._engine.turn_stream import LiveCalls
from turnkit._ops.event_stream import StreamEvent, follow
from turnkit._ops.printable import printable
from turnkit._ops.tree import TurnNode, load_trees
from turnkit.agent import Agent
from turnkit.kernel.errors import ConfigError
from turnkit.kernel.records import TurnRecord
from turnkit.runtime import TurnKit
from turnkit.store.live import Subscription, transport_for
from turnkit.streaming import Restart, TextDelta

__all__ = ["POLLER_FRESHNESS", "WorkerMode", "ask_turn", "choose_worker", "live_pollers", "summary_line"]

#: ``--worker``: who runs the turn.
WorkerMode = Literal["auto", "in-process", "external"]

#: A poller seen this recently counts as a live worker (an idle worker re-polls at least once a minute).
POLLER_FRESHNESS = 90.0

_KIND_PREFIX = re.compile(r"^\[[a-z_]+\] ")


async def live_pollers(tk: TurnKit, *, freshness: float = POLLER_FRESHNESS) -> list[str]:
    """The identities of the workers that polled ``tk``'s task queue for workflow tasks in the last ``freshness``
    seconds (Temporal lists a stopped worker for a few minutes after its last poll)."""
    response = await tk.client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=tk.client.namespace,
            task_queue=TaskQueue(name=tk.task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    cutoff = datetime.now(UTC) - timedelta(seconds=freshness)
    return [
        poller.identity
        for poller in response.pollers
        if poller.HasField("last_access_time") and poller.last_access_time.ToDatetime(tzinfo=UTC) >= cutoff
    ]


async def choose_worker(tk: TurnKit, mode: WorkerMode, *, embedded: bool) -> tuple[bool, str]:
    """Whether to run an in-process worker for this turn, and why (see the module docstring).

    Raises:
        ConfigError: ``auto`` on a cluster that will not say who polls the task queue.
    """
    if mode == "in-process":
        return True, "in-process (--worker in-process)"
    if mode == "external":
        return False, f"the workers polling task queue {tk.task_queue} (--worker external)"
    if embedded:
        return True, "in-process (embedded dev server: no other worker can poll it)"
    try:
        pollers = await live_pollers(tk)
    except RPCError as err:  # e.g. a role that may not describe task queues: let the person choose
        raise ConfigError(
            f"cannot tell whether a worker polls task queue {tk.task_queue} ({err.message}): "
            "pass --worker in-process or --worker external"
        ) from err
    if pollers:
        return False, f"{len(pollers)} worker(s) polling task queue {tk.task_queue}: {', '.join(sorted(pollers))}"
    return True, f"in-process (no worker polls task queue {tk.task_queue})"


@asynccontextmanager
async def _maybe_worker(tk: TurnKit, in_process: bool) -> AsyncGenerator[None, None]:
    if not in_process:
        yield
        return
    async with tk.worker():
        yield


async def ask_turn(
    tk: TurnKit,
    agent: Agent,
    text: str,
    *,
    worker: WorkerMode = "auto",
    embedded: bool = False,
    progress: TextIO | None = None,
    interval: float = 0.25,
) -> TurnRecord:
    """Ask ``agent`` ``text`` in a new conversation, print progress to ``progress`` (None: silent) until the turn
    ends, and return its terminal record."""
    in_process, why = await choose_worker(tk, worker, embedded=embedded)
    async with _maybe_worker(tk, in_process):
        conversation = await tk.conversation(agent)
        turn = await conversation.ask(text, wait=False)
        view = Progress(progress, root_turn_id=turn.id)
        view.say(f"turnkit ask: agent {agent.name} · turn {turn.id} · conversation {conversation.id}")
        view.say(f"worker: {why}")
        transport = transport_for(tk.store)
        if transport.cross_process:
            view.say("live text: on (PostgreSQL LISTEN/NOTIFY)")
        elif in_process:
            view.say("live text: on (in-process worker)")
        else:
            view.say("live text: off (a SQLite store reaches no other process): each iteration shows once committed")
        subscription = await transport.subscribe([conversation.id]) if progress is not None else None
        try:
            async for event in _with_live(follow(tk.store, turn.id, interval=interval), subscription, turn.id):
                view.show(event)
        finally:
            if subscription is not None:
                await subscription.close()
        view.end_live()
        done = await turn.result()
        if progress is not None:
            [tree] = await load_trees(tk.store, turn.id)
            view.say(summary_line(tree))
        return done.record


async def _with_live(
    committed: AsyncIterator[StreamEvent], subscription: Subscription | None, turn_id: str
) -> AsyncIterator[StreamEvent | TextDelta | Restart]:
    """The committed events of ``committed``, with the turn's live text deltas and restarts from ``subscription``
    merged in as they arrive; ends with ``committed``."""
    if subscription is None:
        async for event in committed:
            yield event
        return
    calls = LiveCalls()
    queue: asyncio.Queue[StreamEvent | TextDelta | Restart | None] = asyncio.Queue()

    async def read_committed() -> None:
        try:
            async for event in committed:
                await queue.put(event)
        finally:
            await queue.put(None)

    async def read_live() -> None:
        async for message in subscription:
            if message.turn_id == turn_id:
                for event in calls.events(message):
                    if isinstance(event, TextDelta | Restart):
                        await queue.put(event)

    async with asyncio.TaskGroup() as group:
        done = group.create_task(read_committed())
        live = group.create_task(read_live())
        while (event := await queue.get()) is not None:
            yield event
        live.cancel()
        await done


@dataclass
class Progress:
    """Renders the turn's stream events as progress lines: time since the start, the agent (indented per sub-agent
    level), what happened."""

    out: TextIO | None
    root_turn_id: str
    started: float = field(default_factory=time.monotonic)
    depth: dict[str, int] = field(default_factory=dict)
    iterations: dict[str, int] = field(default_factory=dict)
    live_call: str | None = None
    """The model call whose streamed text the current line shows (None: no line open)."""

    def say(self, line: str) -> None:
        """Print one line as it is (nothing when silent)."""
        self.end_live()
        if self.out is not None:
            print(line, file=self.out, flush=True)

    def end_live(self) -> None:
        """End the line of streamed text, if one is open."""
        if self.live_call is not None and self.out is not None:
            print(file=self.out, flush=True)
        self.live_call = None

    def show(self, event: StreamEvent | TextDelta | Restart) -> None:
        """Print ``event`` if it is progress a person wants to see; streamed text goes on one growing line."""
        if isinstance(event, TextDelta | Restart):
            self._live(event)
            return
        line = self._describe(event)
        if line is None:
            return
        indent = "  " * self.depth.get(event.turn_id, 0)
        self.say(f"{time.monotonic() - self.started:7.2f}s  {indent}{event.agent}: {line}")

    def _live(self, event: TextDelta | Restart) -> None:
        if self.out is None:
            return
        if isinstance(event, Restart):  # the call is retried: what it streamed so far is void
            self.say(f"{time.monotonic() - self.started:7.2f}s  [model call retried: attempt {event.attempt}]")
            return
        if self.live_call != event.call_id:
            self.end_live()
            print(f"{time.monotonic() - self.started:7.2f}s  > ", end="", file=self.out)
            self.live_call = event.call_id
        # The record's text is printed on a terminal: no escape sequence may reach it (as for committed events).
        print(printable(event.text, one_line=True), end="", file=self.out, flush=True)

    def _describe(self, event: StreamEvent) -> str | None:
        kind, _, what = event.type.partition(".")
        root = event.turn_id == self.root_turn_id
        if kind == "turn" and what == "created":
            if not root:  # "sub-agent of turn_…": one level below its parent
                parent = event.summary.removeprefix("sub-agent of ")
                self.depth[event.turn_id] = self.depth.get(parent, 0) + 1
                return f"sub-agent turn {event.turn_id} started"
            return None
        if kind == "turn" and what != "started":
            return None if root else f"sub-agent turn {what}: {event.summary}"  # the root's end: the summary line
        if event.type == "message.assistant":
            n = self.iterations[event.turn_id] = self.iterations.get(event.turn_id, 0) + 1
            return f"iteration {n}: {_KIND_PREFIX.sub('', event.summary)}"
        if kind == "tool_call" and what != "started":
            name, _, detail = event.summary.partition(" ")  # "<tool name> <arguments or result>"
            return f"calls {name} {detail}" if what == "created" else f"{name} {what}: {detail}"
        if event.type == "delivery.created":
            return f"delivery {event.summary}"
        return None  # turn.started, user and tool-result messages, tool_call.started: nothing new to say


def summary_line(tree: TurnNode) -> str:
    """One line about a finished turn and everything below it: status, duration, iterations, tool calls, sub-agents,
    tokens and cost."""
    nodes = tree.walk()
    tool_calls = sum(len(node.executions) for node in nodes)
    costs = [node.turn.cost for node in nodes if node.turn.cost is not None]
    parts = [
        f"{tree.turn.status}" + (f" in {tree.duration:.2f}s" if tree.duration is not None else ""),
        f"{tree.iterations} iteration(s)",
        f"{tool_calls} tool call(s)",
        f"{len(nodes) - 1} sub-agent turn(s)",
        f"{sum(node.tokens for node in nodes)} tokens",
    ]
    if costs:
        parts.append(f"${sum(costs):.6f}")
    return " · ".join(parts)
