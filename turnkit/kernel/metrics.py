"""TurnKit's own metrics: their names, and the one function that records each fact (README, "Metrics").

They are recorded through Temporal's metric meter, so they come out of the same Prometheus endpoint as the SDK's
(``turnkit worker --metrics-port``, ``connect(metrics_port=...)``), with the meter's own attributes (namespace, task
queue, workflow or activity type) and TurnKit's (agent, status, tool, model). Without metrics configured the meter is
Temporal's no-op meter and recording costs next to nothing.

This module is in the kernel because workflow code records through it (``workflow.metric_meter()``, which records
nothing while a workflow replays); activities pass ``activity_meter()``.

Each fact is recorded at the one place where it becomes final, and what a retry does to it is said there:

* turns finished, tool executions, lane queue depth: in the workflow that receives the outcome. Activity retries
  never reach them and replays record nothing; only a workflow task that fails after recording and runs again (not
  a replay: a new attempt) can record twice.
* model calls (iterations), tokens and cost: by the model activity attempt whose transaction committed the response.
  A retried attempt that finds the response committed records nothing, so a call is never counted twice; one whose
  commit landed but whose acknowledgement was lost (the store's retry then finds it) is not counted at all.
* store retries: each failed try of a store transaction inside an activity, in the process where it failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from temporalio import activity
from temporalio.common import MetricMeter

__all__ = [
    "BUCKETS",
    "ITERATIONS",
    "LANE_QUEUE_DEPTH",
    "METRICS",
    "MODEL_COST",
    "MODEL_TOKENS",
    "STORE_RETRIES",
    "STORE_RETRY_SECONDS",
    "TOKEN_KINDS",
    "TOOL_EXECUTIONS",
    "TURNS_FINISHED",
    "activity_meter",
    "lane_queued",
    "model_call_committed",
    "store_retried",
    "tool_executed",
    "turn_finished",
]

TURNS_FINISHED: Final = "turnkit_turns_finished"
ITERATIONS: Final = "turnkit_iterations"
MODEL_TOKENS: Final = "turnkit_model_tokens"
MODEL_COST: Final = "turnkit_model_cost_usd"
TOOL_EXECUTIONS: Final = "turnkit_tool_executions"
LANE_QUEUE_DEPTH: Final = "turnkit_lane_queue_depth"
STORE_RETRIES: Final = "turnkit_store_retries"
STORE_RETRY_SECONDS: Final = "turnkit_store_retry_seconds"

#: Every TurnKit metric: name -> (kind, attributes, description). The README's table says the same.
METRICS: Final[Mapping[str, tuple[str, str, str]]] = {
    TURNS_FINISHED: ("counter", "agent, status", "turns that reached a terminal status"),
    ITERATIONS: ("counter", "agent, model", "model calls of turns (one per iteration) whose response was stored"),
    MODEL_TOKENS: ("counter", "agent, model, kind", "tokens of those calls; kind: input, output, cached, ..."),
    MODEL_COST: ("histogram", "agent, model", "cost of each of those calls in USD (its _sum is the spend)"),
    TOOL_EXECUTIONS: ("counter", "tool, status", "tool calls settled: completed, failed, interrupted, ..."),
    LANE_QUEUE_DEPTH: ("histogram", "", "turns waiting in a conversation's lane, each time the lane queues one"),
    STORE_RETRIES: ("counter", "operation", "failed tries of a store transaction that an activity retried"),
    STORE_RETRY_SECONDS: ("histogram", "operation, outcome", "time an activity spent waiting out the store"),
}

#: Histogram buckets of TurnKit's histograms (Temporal's defaults are for milliseconds), given to the Prometheus
#: exporter the process's runtime is built with (turnkit._temporal.telemetry).
BUCKETS: Final[Mapping[str, tuple[float, ...]]] = {
    MODEL_COST: (0.0001, 0.001, 0.01, 0.1, 1.0, 10.0),
    LANE_QUEUE_DEPTH: (0, 1, 2, 5, 10, 25, 50, 100),
    STORE_RETRY_SECONDS: (0.5, 1, 5, 15, 60, 300, 900),
}

#: The usage buckets reported as ``kind`` of ``turnkit_model_tokens`` (turnkit.model.Usage's fields).
TOKEN_KINDS: Final = {
    "input_tokens": "input",
    "output_tokens": "output",
    "cached_tokens": "cached",
    "cache_write_tokens": "cache_write",
    "thinking_tokens": "thinking",
}


def activity_meter() -> MetricMeter:
    """The current activity's meter; the no-op meter outside an activity (a direct call in a test)."""
    return activity.metric_meter() if activity.in_activity() else MetricMeter.noop


def turn_finished(meter: MetricMeter, *, agent: str, status: str) -> None:
    """A turn ended with ``status`` (recorded by its workflow)."""
    meter.create_counter(TURNS_FINISHED, METRICS[TURNS_FINISHED][2]).add(1, {"agent": agent, "status": status})


def tool_executed(meter: MetricMeter, *, tool: str, status: str) -> None:
    """A tool call settled with ``status`` (recorded by its turn's workflow)."""
    meter.create_counter(TOOL_EXECUTIONS, METRICS[TOOL_EXECUTIONS][2]).add(1, {"tool": tool, "status": status})


def lane_queued(meter: MetricMeter, depth: int) -> None:
    """A lane queued a turn; ``depth`` turns now wait in it to start (recorded by the lane's workflow)."""
    meter.create_histogram(LANE_QUEUE_DEPTH, METRICS[LANE_QUEUE_DEPTH][2]).record(depth)


def model_call_committed(
    meter: MetricMeter, *, agent: str, model: str, tokens: Mapping[str, int], cost: float | None
) -> None:
    """A model call's response and charge committed: one iteration, its tokens (by usage field) and its cost."""
    if meter is MetricMeter.noop:  # no metrics configured: nothing to build
        return
    attributes = {"agent": agent, "model": model}
    meter.create_counter(ITERATIONS, METRICS[ITERATIONS][2]).add(1, attributes)
    counter = meter.create_counter(MODEL_TOKENS, METRICS[MODEL_TOKENS][2])
    for field, count in tokens.items():
        kind = TOKEN_KINDS.get(field)
        if kind is not None and count > 0:
            counter.add(count, {**attributes, "kind": kind})
    if cost is not None:
        meter.create_histogram_float(MODEL_COST, METRICS[MODEL_COST][2], "USD").record(cost, attributes)


def store_retried(meter: MetricMeter, *, operation: str, failures: int, seconds: float, outcome: str) -> None:
    """An activity's store transaction failed ``failures`` times and was tried again, for ``seconds`` in all, then
    ``outcome``: ``succeeded`` or ``gave_up`` (a non-transient error, or the attempt ended)."""
    if meter is MetricMeter.noop:
        return
    meter.create_counter(STORE_RETRIES, METRICS[STORE_RETRIES][2]).add(failures, {"operation": operation})
    histogram = meter.create_histogram_float(STORE_RETRY_SECONDS, METRICS[STORE_RETRY_SECONDS][2], "s")
    histogram.record(seconds, {"operation": operation, "outcome": outcome})
