"""The workload on LangGraph on Temporal (``temporalio-langgraph``, imported as ``temporalio.langgraph``).

As the integration is meant to be used with the Graph API: a ``StateGraph`` with a ``model`` node and a ``tools``
node, each node run as a Temporal activity (``metadata={"execute_in": "activity", ...}``), registered with the
``LangGraphPlugin`` on the client; a workflow per turn gets the graph with ``temporalio.langgraph.graph(name)``,
compiles it and invokes it. The model node is the scripted model of :mod:`bench.peers.workload` (a tool call until K
results, then the answer), the tools node runs the ``lookup`` tool; a conditional edge after the model goes to the
tools or ends. No LLM client and no LangChain chat model: the nodes are plain functions, as the other peers' scripted
models are.

The integration is marked experimental by its authors (0.1.0); the ``bench`` extra installs it.
``python -m bench.actions`` counts its turn when it is installed.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from temporalio import workflow
from temporalio.client import Client
from temporalio.langgraph import LangGraphPlugin, graph
from temporalio.worker import Worker

from bench.peers import workload

ACTIVITY_TIMEOUT = timedelta(seconds=60)
GRAPH = "bench"


class State(TypedDict, total=False):
    """The graph's state: the prompt, the tool results so far, the pending tool query and the answer."""

    prompt: str
    results: list[str]
    query: str | None
    answer: str | None


async def model_node(state: State) -> dict[str, Any]:
    """The scripted model: another lookup until K results, then the answer."""
    k = workload.parse_k(state.get("prompt", ""))
    done = len(state.get("results") or [])
    if done < k:
        return {"query": workload.tool_query(done), "answer": None}
    return {"query": None, "answer": workload.final_answer(k)}


async def tools_node(state: State) -> dict[str, Any]:
    """Run the pending ``lookup`` call."""
    query = state.get("query")
    assert query is not None
    return {"results": [*(state.get("results") or []), workload.lookup_result(query)], "query": None}


async def _route(state: State) -> str:
    # async: LangGraph runs a sync router in an executor, which a workflow has not.
    return "tools" if state.get("query") else END


def build_graph() -> StateGraph[Any, Any, Any, Any]:
    """model -> (tools -> model)* -> end, each node an activity."""
    options = {"execute_in": "activity", "start_to_close_timeout": ACTIVITY_TIMEOUT}
    builder = StateGraph(State)
    builder.add_node("model", model_node, metadata=dict(options))
    builder.add_node("tools", tools_node, metadata=dict(options))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", _route, ["tools", END])
    builder.add_edge("tools", "model")
    return builder


@workflow.defn
class LangGraphTurn:
    """One turn: the graph, invoked once."""

    @workflow.run
    async def run(self, prompt: str) -> str:
        app = graph(GRAPH).compile()
        final = await app.ainvoke({"prompt": prompt, "results": []})
        return str(final.get("answer") or "")


class System:
    """LangGraph on Temporal, for :mod:`bench.peers.serve`."""

    client: Client

    def __init__(self) -> None:
        self.task_queue = f"bench-langgraph-{uuid.uuid4().hex[:8]}"
        self._worker: Worker | None = None

    async def open(self, address: str) -> None:
        self.client = await Client.connect(address, plugins=[LangGraphPlugin(graphs={GRAPH: build_graph()})])
        self._worker = Worker(self.client, task_queue=self.task_queue, workflows=[LangGraphTurn])
        await self._worker.__aenter__()

    async def turn(self, k: int) -> list[str]:
        workflow_id = f"langgraph-{uuid.uuid4().hex}"
        output = await self.client.execute_workflow(
            LangGraphTurn.run, workload.prompt(k), id=workflow_id, task_queue=self.task_queue
        )
        workload.check(k, output)
        return [workflow_id]

    async def close(self) -> None:
        if self._worker is not None:
            await self._worker.__aexit__(None, None, None)
