"""Application module for the tool-queue tests: imported by a main worker process and by a tools-only worker process
(``worker.py --app tests.tool_queue_app --queue <gpu> --only tools``).

The tools run on the queue named by ``$TURNKIT_GPU_QUEUE`` (each test picks its own). Each call appends the pid of the
process that ran it to ``$TURNKIT_TRACE_DIR/<tool>``, so the test can tell which worker ran it; with
``$TURNKIT_HANG_FIRST`` set, the first call hangs until its worker is killed.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import turnkit
from turnkit.testing import ScriptedClient, call_tools

# A killed tools worker must be noticed quickly (its tool stops heartbeating).
turnkit.configure(tool_heartbeat_timeout=2.0)

GPU_QUEUE = os.environ.get("TURNKIT_GPU_QUEUE", "gpu")


def lines(name: str) -> list[str]:
    """The pids that ran ``name``, one per call, in order."""
    path = Path(os.environ["TURNKIT_TRACE_DIR"]) / name
    return path.read_text().splitlines() if path.exists() else []


async def _trace(name: str) -> None:
    path = Path(os.environ["TURNKIT_TRACE_DIR"]) / name
    with path.open("a") as handle:
        handle.write(f"{os.getpid()}\n")
    if os.environ.get("TURNKIT_HANG_FIRST") and len(lines(name)) == 1:
        await asyncio.sleep(3600)


@turnkit.tool(recovery="replay_safe", timeout=30, max_attempts=5, initial_retry_interval=0.2, task_queue=GPU_QUEUE)
async def embed(text: str, context: turnkit.ToolContext) -> dict[str, Any]:
    """Embed a text on the GPU box (replay-safe: a retry with the same idempotency key is harmless).

    Args:
        text: The text.
    """
    await _trace("embed")
    return {"pid": os.getpid(), "key": context.idempotency_key, "dims": len(text)}


@turnkit.tool(timeout=30, task_queue=GPU_QUEUE)
async def render(scene: str) -> dict[str, Any]:
    """Render a scene on the GPU box (at most once: never run twice).

    Args:
        scene: What to render.
    """
    await _trace("render")
    return {"pid": os.getpid(), "rendered": scene}


def _scripted(call: tuple[str, dict[str, Any]]) -> ScriptedClient:
    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        results = [m for m in request.messages if m["role"] == "tool"]
        if results:
            return turnkit.Result.build(text=f"done: {results[-1]['content']}")
        return call_tools(call)

    return ScriptedClient(script)


embedder = turnkit.register(
    turnkit.Agent("embedder", model="scripted", tools=[embed], client=_scripted(("embed", {"text": "hello"})))
)
renderer = turnkit.register(
    turnkit.Agent("renderer", model="scripted", tools=[render], client=_scripted(("render", {"scene": "teapot"})))
)
