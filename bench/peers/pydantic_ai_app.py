"""The workload on Pydantic AI's Temporal durable execution (``pydantic-ai-slim[temporal]``).

As in the integration's real use: an ``Agent`` with the ``TemporalDurability`` capability (the successor of the
deprecated ``TemporalAgent`` wrapper), listed on a ``PydanticAIWorkflow`` so that the ``PydanticAIPlugin`` registers
its activities: every model request and every call of the (plain function) tool runs as an activity. Each turn is
a fresh workflow running ``agent.run``. The model is Pydantic AI's own ``FunctionModel`` with a function that
follows :mod:`bench.peers.workload`.
"""

from __future__ import annotations

import uuid

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

from bench.peers import workload

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import Agent
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin, PydanticAIWorkflow, TemporalDurability
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel


async def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The scripted model: counts the tool results so far (a fresh workflow per turn: all are this turn's)."""
    parts = [part for message in messages if isinstance(message, ModelRequest) for part in message.parts]
    k = workload.parse_k(next(str(p.content) for p in parts if isinstance(p, UserPromptPart)))
    done = sum(1 for p in parts if isinstance(p, ToolReturnPart))
    if done < k:
        call = ToolCallPart(workload.TOOL_NAME, {"q": workload.tool_query(done)}, tool_call_id=f"call_{done}")
        return ModelResponse(parts=[call])
    return ModelResponse(parts=[TextPart(workload.final_answer(k))])


agent = Agent(
    FunctionModel(scripted_model),
    name="bench",
    instructions=workload.INSTRUCTIONS,
    capabilities=[TemporalDurability()],
)


@agent.tool_plain(name=workload.TOOL_NAME)
async def lookup(q: str) -> str:
    """Look something up."""
    return workload.lookup_result(q)


@workflow.defn
class PydanticAITurn(PydanticAIWorkflow):
    """One turn: ``agent.run`` of the durable agent."""

    __pydantic_ai_agents__ = (agent,)

    @workflow.run
    async def run(self, prompt: str) -> str:
        result = await agent.run(prompt)
        return result.output


class System:
    """Pydantic AI + Temporal, for :mod:`bench.peers.serve`."""

    client: Client

    def __init__(self) -> None:
        self.task_queue = f"bench-pydantic-ai-{uuid.uuid4().hex[:8]}"
        self._worker: Worker | None = None

    async def open(self, address: str) -> None:
        self.client = await Client.connect(address, plugins=[PydanticAIPlugin()])
        self._worker = Worker(self.client, task_queue=self.task_queue, workflows=[PydanticAITurn])
        await self._worker.__aenter__()

    async def turn(self, k: int) -> list[str]:
        workflow_id = f"pydantic-ai-{uuid.uuid4().hex}"
        output = await self.client.execute_workflow(
            PydanticAITurn.run, workload.prompt(k), id=workflow_id, task_queue=self.task_queue
        )
        workload.check(k, output)
        return [workflow_id]

    async def close(self) -> None:
        if self._worker is not None:
            await self._worker.__aexit__(None, None, None)
