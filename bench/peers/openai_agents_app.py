"""The workload on the OpenAI Agents SDK on Temporal (``temporalio-openai-agents``, imported as
``temporalio.openai_agents``; ``temporalio.contrib.openai_agents`` is its compatibility alias).

As in the integration's real use: the ``OpenAIAgentsPlugin`` on the client runs every model call as its
``invoke_model_activity``; the tool is a Temporal activity made into an agent tool with ``activity_as_tool``; each
turn is a fresh workflow running ``Runner.run``. The model is the integration's own test double
(``temporalio.openai_agents.testing.TestModel``) with a function that follows :mod:`bench.peers.workload`.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

from bench.peers import workload

with workflow.unsafe.imports_passed_through():
    from agents import Agent, ModelResponse, Runner
    from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
    from temporalio.openai_agents import workflow as openai_workflow
    from temporalio.openai_agents.testing import ResponseBuilders, TestModel, TestModelProvider

ACTIVITY_TIMEOUT = timedelta(seconds=60)


@activity.defn(name=workload.TOOL_NAME)
async def lookup(q: str) -> str:
    """Look something up."""
    return workload.lookup_result(q)


@workflow.defn
class OpenAIAgentsTurn:
    """One turn: ``Runner.run`` of an agent with the lookup tool."""

    @workflow.run
    async def run(self, prompt: str) -> str:
        agent = Agent[None](
            name="bench",
            instructions=workload.INSTRUCTIONS,
            tools=[openai_workflow.activity_as_tool(lookup, start_to_close_timeout=ACTIVITY_TIMEOUT)],
        )
        result = await Runner.run(agent, prompt, max_turns=100)
        return str(result.final_output)


def _field(item: Any, key: str) -> Any:
    """A field of an input item, which may be a dict or a model."""
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


class ScriptedModel(TestModel):
    """The scripted model: counts the tool results in the input (a fresh workflow per turn: all are this turn's)."""

    def __init__(self) -> None:
        super().__init__(lambda: ResponseBuilders.output_message(""))  # get_response below answers instead

    async def get_response(self, system_instructions: str | None, input: Any, *args: Any, **kwargs: Any) -> Any:
        items: list[Any] = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        k = workload.parse_k(next(str(_field(i, "content")) for i in items if _field(i, "role") == "user"))
        done = sum(1 for i in items if _field(i, "type") == "function_call_output")
        if done < k:
            arguments = f'{{"q": "{workload.tool_query(done)}"}}'
            response: ModelResponse = ResponseBuilders.tool_call(
                arguments, workload.TOOL_NAME, call_id=f"call_{done}", item_id=f"fc_{done}"
            )
            return response
        return ResponseBuilders.output_message(workload.final_answer(k))


class System:
    """The OpenAI Agents SDK on Temporal, for :mod:`bench.peers.serve`."""

    client: Client

    def __init__(self, local_model: bool = False) -> None:
        self.task_queue = f"bench-openai-agents-{uuid.uuid4().hex[:8]}"
        self.local_model = local_model  # each model call as a local activity (the integration's use_local_activity)
        self._worker: Worker | None = None

    async def open(self, address: str) -> None:
        plugin = OpenAIAgentsPlugin(
            model_params=ModelActivityParameters(
                start_to_close_timeout=ACTIVITY_TIMEOUT, use_local_activity=self.local_model
            ),
            model_provider=TestModelProvider(ScriptedModel()),
        )
        self.client = await Client.connect(address, plugins=[plugin])
        self._worker = Worker(
            self.client, task_queue=self.task_queue, workflows=[OpenAIAgentsTurn], activities=[lookup]
        )
        await self._worker.__aenter__()

    async def turn(self, k: int) -> list[str]:
        workflow_id = f"openai-agents-{uuid.uuid4().hex}"
        output = await self.client.execute_workflow(
            OpenAIAgentsTurn.run, workload.prompt(k), id=workflow_id, task_queue=self.task_queue
        )
        workload.check(k, output)
        return [workflow_id]

    async def close(self) -> None:
        if self._worker is not None:
            await self._worker.__aexit__(None, None, None)
