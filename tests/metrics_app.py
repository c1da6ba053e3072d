"""Application module for the metrics and logs tests (``--app tests.metrics_app``): an agent that calls a tool, then
answers, on the scripted offline model.

The tool ``gauge`` fails its first attempt (a replay-safe tool: Temporal retries it, and the SDK logs the failure),
logs a warning of its own, and then, when ``$TURNKIT_METRICS_GATE`` names a directory, says it runs (file
``running``) and waits for the test to let it finish (file ``go``): the test scrapes the worker during the turn.
"""

from __future__ import annotations

import asyncio
import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow

import turnkit
from turnkit._activities.store_retry import retry_store
from turnkit.model import Usage
from turnkit.testing import ScriptedClient, call_tools

USAGE = Usage(input_tokens=120, output_tokens=30, cached_tokens=40)

log = logging.getLogger("tests.metrics_app")
_attempts: dict[str, int] = {}


@turnkit.tool(recovery="replay_safe", max_attempts=3, initial_retry_interval=0.1)
async def gauge(reading: str, call: turnkit.ToolContext) -> dict[str, Any]:
    """Read a gauge.

    Args:
        reading: Which gauge.
    """
    _attempts[call.execution_id] = _attempts.get(call.execution_id, 0) + 1
    if _attempts[call.execution_id] == 1:
        raise RuntimeError("the gauge is stuck")  # a replay-safe tool: retried
    log.warning("gauge %s read on attempt %d", reading, call.attempt)
    gate = os.environ.get("TURNKIT_METRICS_GATE")
    if gate:
        (Path(gate) / "running").touch()
        async with asyncio.timeout(60):
            while not (Path(gate) / "go").exists():
                await asyncio.sleep(0.02)
    return {"reading": reading, "value": 42}


def _answer(request: turnkit.ModelRequest) -> turnkit.Result:
    if request.messages[-1]["role"] != "tool":  # each turn: the tool first, then the answer
        return call_tools(("gauge", {"reading": "pressure"}), usage=USAGE)
    return turnkit.Result.build(text="pressure is 42", usage=USAGE)


metered = turnkit.register(turnkit.Agent("metered", model="gpt-4o", tools=[gauge], client=ScriptedClient(_answer)))


def _refuse(request: turnkit.ModelRequest) -> turnkit.Result:
    raise turnkit.ModelError("the provider said no")


refused = turnkit.register(turnkit.Agent("refused", model="gpt-4o", client=ScriptedClient(_refuse)))


# A store that blinks under an activity (tests/test_metrics.py): its transaction fails twice with a lost connection,
# and retry_store waits it out, as the model and tool activities do.
@activity.defn(name="metrics_app.wait_out_store")
async def wait_out_store() -> int:
    """Run a store operation that fails twice, inside retry_store; returns the tries it took."""
    tries: list[int] = []

    async def blinking() -> int:
        tries.append(1)
        if len(tries) < 3:
            raise ConnectionRefusedError(111, "Connect call failed")
        return len(tries)

    return await retry_store(blinking, what="metrics test")


@workflow.defn(name="metrics_app.StoreBlink")
class StoreBlink:
    """Runs :func:`wait_out_store` once."""

    @workflow.run
    async def run(self) -> int:
        return await workflow.execute_activity(
            wait_out_store, start_to_close_timeout=timedelta(seconds=30), heartbeat_timeout=timedelta(seconds=30)
        )
