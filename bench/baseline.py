"""The baseline of ``bench.turn_latency``: a bare Temporal workflow running N no-op activities one after another.

It does what a TurnKit turn does minus TurnKit (no store, no lane, no child workflow, default data converter), so
the ratio TurnKit / baseline is the cost of the store writes and the engine on top of Temporal itself. Workflows
must live in an importable module: the workflow sandbox re-imports the module that defines them.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow

__all__ = ["BaselineWorkflow", "noop"]


@activity.defn(name="bench.noop")
async def noop(index: int) -> int:
    """Do nothing (the stand-in for a model call, a tool call or a store write)."""
    return index


@workflow.defn(name="BenchBaselineWorkflow")
class BaselineWorkflow:
    """Run ``count`` no-op activities sequentially."""

    @workflow.run
    async def run(self, count: int) -> int:
        for index in range(count):
            await workflow.execute_activity(noop, index, start_to_close_timeout=timedelta(seconds=30))
        return count
