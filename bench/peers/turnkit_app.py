"""The workload on TurnKit, built as ``bench/turn_latency.py`` builds it (the tests' ``tk`` fixture): a store (a
temporary SQLite file unless a database URL is given), a client with ``TurnKitPlugin(store)``, a ``TurnKit`` on its
own task queue with an in-process worker. Each turn is ``tk.conversation(agent)`` then ``Conversation.ask``: a
fresh conversation, as a peer runs each turn as a fresh workflow. The model is TurnKit's ``ScriptedClient`` (run by
the ``turnkit.model`` activity) with a function that follows :mod:`bench.peers.workload`; the tool is replay-safe,
so it runs as an activity, or, with ``local_tool``, declared ``@tool(local=True)``: a local activity inside the
turn's workflow task (a separate agent, ``bench_peers_local``, so both can be registered in one process). With
``local_model`` each model call's first attempt is a local activity too (``settings.model_local_activity``). With
``next_turn`` each turn is instead the next turn of a conversation that has one turn behind it and is idle (what a
chat's second message costs): :meth:`System.prime` readies those conversations before the timing starts. With
``search_attributes=False`` it runs with ``settings.search_attributes`` off: turns start without TurnKit's search
attributes and never set any.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

from temporalio.client import Client
from temporalio.client import Interceptor as ClientInterceptor
from temporalio.service import RPCError, RPCStatusCode

import turnkit
from bench.peers import workload
from bench.peers.serve import settled_events
from turnkit._temporal.search_attributes import dev_server_flags
from turnkit.config import settings
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit
from turnkit.store import Store
from turnkit.testing import ScriptedClient, call_tools

#: `temporal server start-dev` flags this system needs: TurnKit's search attributes.
SERVER_FLAGS = dev_server_flags()


@turnkit.tool(name=workload.TOOL_NAME, recovery="replay_safe")
async def lookup(q: str) -> str:
    """Look something up.

    Args:
        q: The query.
    """
    return workload.lookup_result(q)


@turnkit.tool(name=workload.TOOL_NAME, recovery="replay_safe", local=True)
async def lookup_local(q: str) -> str:
    """Look something up.

    Args:
        q: The query.
    """
    return workload.lookup_result(q)


def scripted_model(request: turnkit.ModelRequest) -> turnkit.Result:
    """The scripted model: counts the tool results after the last user message (this turn's)."""
    # The last user message by position: a conversation's next turn may repeat an earlier prompt word for word.
    at = max(i for i, m in enumerate(request.messages) if m.get("role") == "user")
    k = workload.parse_k(str(request.messages[at].get("content")))
    done = sum(1 for m in request.messages[at:] if m.get("role") == "tool")
    if done < k:
        return call_tools((workload.TOOL_NAME, {"q": workload.tool_query(done)}))
    return turnkit.Result.build(text=workload.final_answer(k), usage=turnkit.Usage(input_tokens=10, output_tokens=2))


def _agent(name: str, tool: turnkit.Tool) -> turnkit.Agent:
    return turnkit.register(
        turnkit.Agent(
            name,
            model="scripted",
            instructions=workload.INSTRUCTIONS,
            tools=[tool],
            client=ScriptedClient(scripted_model, record=False),
            max_iterations=100,
            compaction=False,  # the script counts the tool results it sees; a summary would replace them
        )
    )


AGENT = _agent("bench_peers", lookup)
#: The same agent with the tool as a local activity.
LOCAL_AGENT = _agent("bench_peers_local", lookup_local)


async def _last_event_id(client: Client, workflow_id: str) -> int:
    """The last event id of the workflow's history once it stopped growing; 0 when there is no such workflow."""
    try:
        history = await settled_events(client, workflow_id)
    except RPCError as error:
        if error.status == RPCStatusCode.NOT_FOUND:
            return 0
        raise
    return history[-1].event_id if history else 0


class System:
    """TurnKit, for :mod:`bench.peers.serve`."""

    client: Client

    def __init__(
        self,
        database_url: str | None = None,
        local_tool: bool = False,
        sandbox: bool = True,
        local_model: bool = False,
        next_turn: bool = False,
        search_attributes: bool = True,
        interceptors: Sequence[ClientInterceptor] = (),
    ) -> None:
        self.sandbox = sandbox
        #: The client's own interceptors; a worker interceptor among them wraps the worker's (``bench.cpu_profile``).
        self.interceptors = interceptors
        self.next_turn = next_turn
        #: With ``next_turn``: conversations with turns behind them and none running, ready for their next.
        self._idle: list[turnkit.Conversation] = []
        if local_model:  # read by ask, which creates each turn (this process's setting)
            turnkit.configure(model_local_activity=True)
        if not search_attributes:  # read by ask (the turn's start) and by the turn workflow's closing upsert
            turnkit.configure(search_attributes=False)
        self.agent = LOCAL_AGENT if local_tool else AGENT
        self._tmp = tempfile.TemporaryDirectory(prefix="turnkit-bench-peers-")
        self.database_url = database_url or f"sqlite+aiosqlite:///{Path(self._tmp.name) / 'store.db'}"
        self._store: Store | None = None
        self._tk: TurnKit | None = None
        self._worker = None

    async def open(self, address: str) -> None:
        self._store = await Store.open(self.database_url)
        self.client = await Client.connect(
            address, plugins=[TurnKitPlugin(self._store, sandbox=self.sandbox)], interceptors=self.interceptors
        )
        self._tk = TurnKit(self.client, self._store, task_queue=f"bench-turnkit-{uuid.uuid4().hex[:8]}")
        self._worker = self._tk.worker()
        await self._worker.__aenter__()

    @property
    def store(self) -> Store:
        """The open store (for :mod:`bench.cpu_profile`'s counts)."""
        assert self._store is not None
        return self._store

    async def prime(self, k: int, turns: int) -> None:
        """With ``next_turn``: have at least ``turns`` idle conversations, each with a K-iteration turn behind it."""
        if not self.next_turn:
            return
        assert self._tk is not None
        tk = self._tk

        async def one() -> turnkit.Conversation:
            conversation = await tk.conversation(self.agent)
            await self._ask(conversation, k)
            return conversation

        self._idle += await asyncio.gather(*(one() for _ in range(turns - len(self._idle))))

    async def _ask(self, conversation: turnkit.Conversation, k: int) -> turnkit.Turn:
        turn = await conversation.ask(workload.prompt(k))
        if turn.status != "completed":
            raise RuntimeError(f"turn {turn.id} ended {turn.status}: {turn.error}")
        workload.check(k, turn.output_text)
        return turn

    async def turn(self, k: int) -> list[str]:
        assert self._tk is not None
        if self.next_turn and self._idle:
            conversation = self._idle.pop()
        else:
            conversation = await self._tk.conversation(self.agent)
        turn = await self._ask(conversation, k)
        if self.next_turn:
            self._idle.append(conversation)
        # A fresh conversation's first turn, and an idle one's next, run without its lane.
        if settings.direct_first_turns and (not self.next_turn or settings.direct_idle_turns):
            return [turn.id]
        return [conversation.id, turn.id]  # the lane workflow and the turn workflow

    async def conversation_turns(self, k: int, turns: int) -> list[list[tuple[str, int, int | None]]]:
        """``turns`` K-iteration turns one after another in one conversation (for :mod:`bench.actions`).

        Returns:
            Per turn, the workflows it ran in, each with the ids of the last event its history had before the turn
            (0 for a workflow the turn started) and after it (None: the end): the conversation's lane outlives its
            turns.
        """
        assert self._tk is not None
        conversation = await self._tk.conversation(self.agent)
        ran: list[list[tuple[str, int, int | None]]] = []
        for _ in range(turns):
            lane = await _last_event_id(self.client, conversation.id)
            turn = await conversation.ask(workload.prompt(k))
            if turn.status != "completed":
                raise RuntimeError(f"turn {turn.id} ended {turn.status}: {turn.error}")
            workload.check(k, turn.output_text)
            workflows: list[tuple[str, int, int | None]] = [(turn.id, 0, None)]
            after = await _last_event_id(self.client, conversation.id)
            if after > lane:  # the turn went through the lane
                workflows.append((conversation.id, lane, after))
            ran.append(workflows)
        return ran

    async def close(self) -> None:
        try:
            if self._worker is not None:
                await self._worker.__aexit__(None, None, None)
        finally:
            if self._store is not None:
                await self._store.close()
            self._tmp.cleanup()
