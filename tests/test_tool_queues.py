"""Task queues per tool (issue 11): ``@tool(task_queue="gpu")`` runs the tool's activity on its own queue, served by a
tools-only worker process (``worker.py --queue gpu --only tools``), while the turn runs on the main worker.

Every case runs two real worker processes on different queues: a main worker that does not serve the tool's queue,
and a tools-only worker on it; the tool records the pid of the process that ran it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

import turnkit
from tests import tool_queue_app
from tests.engine import Engine, eventually
from tests.workers import WorkerProcess
from turnkit._engine.dispatch import call_policy
from turnkit._engine.tool_queues import misrouted
from turnkit.agent import register
from turnkit.kernel.payloads import CallPolicy
from turnkit.kernel.records import INTERRUPTED_MESSAGE
from turnkit.testing import ScriptedClient, call_tools

pytestmark = pytest.mark.crash


@dataclass
class Queues:
    """A test's two queues, its trace directory, and how to start a worker on each queue."""

    engine: Engine
    gpu: str
    trace_dir: Path

    def env(self, **extra: str) -> dict[str, str]:
        return {"TURNKIT_GPU_QUEUE": self.gpu, "TURNKIT_TRACE_DIR": str(self.trace_dir), **extra}

    async def main_worker(self) -> WorkerProcess:
        """A full worker on the turns' queue only (it does not poll the gpu queue)."""
        return await WorkerProcess.for_engine(self.engine, app="tests.tool_queue_app", env=self.env())

    async def gpu_worker(self, **env: str) -> WorkerProcess:
        """A tools-only worker on the gpu queue."""
        return await WorkerProcess.for_engine(
            self.engine,
            app="tests.tool_queue_app",
            task_queue=self.gpu,
            env=self.env(**env),
            extra_args=("--only", "tools"),
        )


@pytest_asyncio.fixture
async def queues(engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Queues]:
    monkeypatch.setenv("TURNKIT_TRACE_DIR", str(tmp_path))  # tool_queue_app.lines() reads it in this process
    yield Queues(engine=engine, gpu=f"gpu-{uuid.uuid4().hex[:12]}", trace_dir=tmp_path)


async def test_tool_runs_in_the_worker_of_its_queue(queues: Queues) -> None:
    """The tool's activity runs in the tools-only worker of its queue, the turn in the main worker."""
    main, gpu = await queues.main_worker(), await queues.gpu_worker()
    try:
        assert "tools only: embed, render" in gpu.ready_line
        register(tool_queue_app.embedder)
        conversation = await queues.engine.tk.conversation(tool_queue_app.embedder)
        turn = await (await conversation.ask("embed hello", wait=False)).result(timeout=60)
        assert turn.status == "completed", turn.record.error
        [execution] = await turn.tool_executions()
        assert execution.status == "completed"
        assert execution.result is not None and execution.result["pid"] == gpu.pid
        assert tool_queue_app.lines("embed") == [str(gpu.pid)]  # once, in the gpu worker, never in main or here
        assert gpu.pid != main.pid != os.getpid()
    finally:
        assert await gpu.stop() == 0
        assert await main.stop() == 0


async def test_replay_safe_tool_finishes_on_a_new_worker_of_its_queue(queues: Queues) -> None:
    """The gpu worker is SIGKILLed inside a replay-safe tool; a new gpu worker runs it again (same key) and the turn
    completes on the main worker, which stayed up."""
    main = await queues.main_worker()
    first = await queues.gpu_worker(TURNKIT_HANG_FIRST="1")
    second: WorkerProcess | None = None
    try:
        register(tool_queue_app.embedder)
        conversation = await queues.engine.tk.conversation(tool_queue_app.embedder)
        turn = await conversation.ask("embed hello", wait=False)

        async def inside_the_tool() -> bool:
            return bool(tool_queue_app.lines("embed"))

        await eventually(inside_the_tool, what="embed running on the first gpu worker")
        await first.kill()
        second = await queues.gpu_worker()
        done = await turn.result(timeout=90)
        assert done.status == "completed", done.record.error
        assert tool_queue_app.lines("embed") == [str(first.pid), str(second.pid)]
        [execution] = await done.tool_executions()
        assert execution.status == "completed"
        assert execution.result == {"pid": second.pid, "key": f"turnkit:tool:{execution.id}", "dims": 5}
    finally:
        if second is not None:
            assert await second.stop() == 0
        assert await main.stop() == 0


async def test_at_most_once_tool_is_interrupted_when_its_worker_dies(queues: Queues) -> None:
    """The gpu worker is SIGKILLed inside an at-most-once tool: the call is recorded interrupted (outcome unknown),
    never run again, also once a new gpu worker is up, and the turn completes with the model told so."""
    main = await queues.main_worker()
    first = await queues.gpu_worker(TURNKIT_HANG_FIRST="1")
    second: WorkerProcess | None = None
    try:
        register(tool_queue_app.renderer)
        conversation = await queues.engine.tk.conversation(tool_queue_app.renderer)
        turn = await conversation.ask("render a teapot", wait=False)

        async def inside_the_tool() -> bool:
            return bool(tool_queue_app.lines("render"))

        await eventually(inside_the_tool, what="render running on the first gpu worker")
        await first.kill()
        second = await queues.gpu_worker()
        done = await turn.result(timeout=90)
        assert done.status == "completed", done.record.error
        [execution] = await done.tool_executions()
        assert execution.status == "interrupted"
        assert execution.error == {"message": INTERRUPTED_MESSAGE}
        assert tool_queue_app.lines("render") == [str(first.pid)]  # the body ran once, never again
        assert "unknown" in done.output_text
    finally:
        if second is not None:
            assert await second.stop() == 0
        assert await main.stop() == 0


async def test_a_tools_only_worker_for_a_queue_no_tool_runs_on_fails_clearly(queues: Queues) -> None:
    """``--only tools`` on a queue that no registered tool declares is a mistake: the worker says so and exits 2."""
    with pytest.raises(RuntimeError, match="code 2"):
        await WorkerProcess.start(
            app="tests.tool_queue_app",
            address=queues.engine.temporal_address,
            task_queue="nobody-serves-this",
            database_url=queues.engine.database_url,
            env=queues.env(),
            extra_args=("--only", "tools"),
        )


@pytest.mark.parametrize("bad", ["", "   ", " gpu", 5, ["gpu"]])
def test_task_queue_must_be_a_non_empty_string(bad: object) -> None:
    """A tool's task_queue is None or a non-empty name: anything else fails when the tool is defined."""
    with pytest.raises(ValueError, match=r"tool lookup: task_queue must be a non-empty string"):

        @turnkit.tool(task_queue=bad)  # type: ignore[arg-type]
        def lookup(query: str) -> str:
            """Look up."""
            return query

    with pytest.raises(ValueError, match=r"tool search: task_queue must be a non-empty string"):

        class Search(turnkit.Tool):
            task_queue = bad  # type: ignore[assignment]

            def call(self, context: turnkit.ToolContext) -> str:
                return "x"


def test_the_queue_travels_in_the_call_policy() -> None:
    """The model activity resolves the tool's queue into the call's policy; the workflow reads only that."""
    agent = turnkit.Agent("a", model="scripted", tools=[tool_queue_app.embed])
    policy = call_policy(agent, "embed")
    assert policy.task_queue == tool_queue_app.GPU_QUEUE
    assert CallPolicy(kind="tool").task_queue is None  # older histories: the turn's own queue
    assert misrouted(tool_queue_app.embed, tool_queue_app.GPU_QUEUE) is None
    message = misrouted(tool_queue_app.embed, "turnkit")
    assert message is not None and "tool embed runs on task queue" in message


class _MovedElsewhere(Interceptor):
    """Gives the tool a queue of its own as its activity starts: the worker's definitions now disagree with those the
    call was dispatched by (as in a deploy that adds ``task_queue`` while turns run)."""

    def __init__(self, tool: turnkit.Tool, queue: str) -> None:
        self.tool, self.queue = tool, queue

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        owner = self

        class Inbound(ActivityInboundInterceptor):
            async def execute_activity(self, input: ExecuteActivityInput) -> Any:
                if activity.info().activity_type == f"tool:{owner.tool.name}":  # after the model step dispatched it
                    type(owner.tool).task_queue = owner.queue
                return await self.next.execute_activity(input)

        return Inbound(next)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_call_on_a_queue_its_tool_does_not_declare_is_failed_not_run(engine: Engine) -> None:
    """A call that arrives on the turn's queue for a tool that (by this worker's definitions) runs on another queue is
    not run there: its execution fails with a message naming both queues, the model sees it, the turn goes on."""
    runs: list[str] = []

    @turnkit.tool
    def develop(film: str) -> str:
        """Develop a film (needs the darkroom box).

        Args:
            film: Which film.
        """
        runs.append(film)
        return "developed"

    client = ScriptedClient([call_tools(("develop", {"film": "roll-1"})), "could not develop it"])
    agent = turnkit.Agent("darkroom", model="scripted", tools=[develop], client=client)
    try:
        async with engine.tk.worker(interceptors=[_MovedElsewhere(develop, "darkroom")]):
            turn = await (await engine.tk.conversation(agent)).ask("develop roll-1")
    finally:
        type(develop).task_queue = None
    assert turn.status == "completed", turn.record.error
    assert runs == []  # never run on a queue it does not belong to
    [execution] = await turn.tool_executions()
    assert execution.status == "failed"
    assert execution.error is not None
    message = str(execution.error["message"])
    assert f"tool develop runs on task queue 'darkroom', but its call arrived on '{engine.tk.task_queue}'" in message
    assert "tool develop runs on task queue 'darkroom'" in str(client.requests[-1].messages[-1]["content"])
