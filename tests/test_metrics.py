"""Metrics and logs of a worker (issue 38): the SDK's Prometheus metrics and TurnKit's own on one endpoint, JSON log
lines that name their turn and workflow, and a worker start without Alembic's INFO lines.

On the session's real dev server: an in-process worker built on a client connected with ``metrics_port``, and a
``turnkit worker`` process with ``--metrics-port`` and ``--log-format json``, scraped while its turn runs.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

import tests.metrics_app as app
from tests.engine import Engine, eventually
from tests.workers import WorkerProcess
from turnkit._activities import store_retry
from turnkit._temporal.telemetry import metrics_address
from turnkit.agent import register
from turnkit.cost import cost_from_usage
from turnkit.kernel.errors import ConfigError
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit, connect
from turnkit.store import Store

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _scrape(port: int) -> Samples:
    """The endpoint's samples: (name, labels) -> value (Prometheus' text format)."""
    async with httpx.AsyncClient() as http:
        response = await http.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    response.raise_for_status()
    samples: Samples = {}
    for line in response.text.splitlines():
        found = _SAMPLE.match(line)
        if found and not line.startswith("#"):
            labels = frozenset(_LABEL.findall(found.group(2) or ""))
            samples[(found.group(1), labels)] = float(found.group(3))
    return samples


def _value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples that carry ``labels`` (whatever their other labels: namespace, task queue...)."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and wanted <= have)


def _names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


def _tokens(kind: str) -> Mapping[str, str]:
    return {"agent": "metered", "model": "gpt-4o", "kind": kind}


@pytest.mark.usefixtures("through_lanes")
async def test_turns_show_in_the_sdk_and_turnkit_metrics(
    temporal: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client connected with ``metrics_port`` serves the SDK's metrics and TurnKit's: after two turns through their
    lane, each with one tool call (which failed once and was retried), the turns by agent and status, their model
    calls with tokens and cost by model, the tool executions by tool and status, the lane's queue depth; a third turn
    whose model refused, failed; and an activity that waited out two failed store transactions, its retries and their
    time."""
    monkeypatch.setattr(store_retry, "INITIAL_DELAY", 0.01)
    port = _free_port()
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'metrics.db'}")
    address = temporal.client.service_client.config.target_host
    plugin = TurnKitPlugin(store, metrics_port=port, metrics_bind="127.0.0.1")
    client = await Client.connect(address, plugins=[plugin])
    tk = TurnKit(client, store, task_queue=f"tq-{uuid.uuid4().hex[:12]}")
    register(app.metered)
    register(app.refused)
    # A plain client on the same runtime (its metrics endpoint) for the store-blink workflow: not TurnKit's plugin.
    plain = await Client.connect(address, runtime=client.service_client.config.runtime)
    blink_queue = f"tq-{uuid.uuid4().hex[:12]}"
    blinks = Worker(
        plain,
        task_queue=blink_queue,
        workflows=[app.StoreBlink],
        activities=[app.wait_out_store],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    try:
        async with tk.worker(), blinks:
            conversation = await tk.conversation(app.metered)
            first = await conversation.ask("read the pressure")
            second = await conversation.ask("again")
            assert (first.status, second.status) == ("completed", "completed")
            failed = await (await tk.conversation(app.refused)).ask("hello")
            assert failed.status == "failed"
            tries = await plain.execute_workflow(app.StoreBlink.run, id=f"blink-{uuid.uuid4()}", task_queue=blink_queue)
            assert tries == 3

            async def recorded() -> bool:  # the workflow's last task may be recorded a moment after the result
                return _value(await _scrape(port), "turnkit_turns_finished") == 3

            await eventually(recorded, what="the three turns in turnkit_turns_finished")
            samples = await _scrape(port)
    finally:
        await store.close()

    # The SDK's own metrics, from the same endpoint.
    assert {"temporal_workflow_completed", "temporal_activity_execution_latency"} <= _names(samples) or {
        "temporal_workflow_completed",
        "temporal_activity_execution_latency_bucket",
    } <= _names(samples), sorted(_names(samples))
    # Three turn workflows completed: a failed turn is a result, not a failed workflow (so TurnKit's own counter).
    assert _value(samples, "temporal_workflow_completed", workflow_type="TurnWorkflow", task_queue=tk.task_queue) == 3

    assert _value(samples, "turnkit_turns_finished", agent="metered", status="completed") == 2
    assert _value(samples, "turnkit_turns_finished", agent="metered", status="failed") == 0
    assert _value(samples, "turnkit_turns_finished", agent="refused", status="failed") == 1
    assert _value(samples, "turnkit_iterations", agent="refused") == 0  # its model call stored no response
    assert _value(samples, "turnkit_iterations", agent="metered", model="gpt-4o") == 4  # two model calls a turn
    usage = app.USAGE
    assert _value(samples, "turnkit_model_tokens", **_tokens("input")) == 4 * usage.input_tokens
    assert _value(samples, "turnkit_model_tokens", **_tokens("output")) == 4 * usage.output_tokens
    assert _value(samples, "turnkit_model_tokens", **_tokens("cached")) == 4 * usage.cached_tokens
    cost = cost_from_usage(usage, "gpt-4o").total
    assert cost is not None and cost > 0
    spent = _value(samples, "turnkit_model_cost_usd_sum", agent="metered", model="gpt-4o")
    assert spent == pytest.approx(4 * cost)
    assert _value(samples, "turnkit_model_cost_usd_count", agent="metered", model="gpt-4o") == 4
    # One execution per call, counted once although its first attempt failed (the retry is the SDK's to count).
    assert _value(samples, "turnkit_tool_executions", tool="gauge", status="completed") == 2
    assert _value(samples, "turnkit_tool_executions", tool="gauge", status="failed") == 0
    assert _value(samples, "temporal_activity_execution_failed", activity_type="tool:gauge") == 2
    # Each turn was queued in an idle lane: one turn waiting, each time (buckets for small counts).
    assert _value(samples, "turnkit_lane_queue_depth_count", workflow_type="ConversationWorkflow") == 3
    assert _value(samples, "turnkit_lane_queue_depth_sum") == 3
    assert _value(samples, "turnkit_lane_queue_depth_bucket", le="1") == 3
    assert _value(samples, "turnkit_model_cost_usd_bucket", le="0.001") == 4  # buckets for dollars, not milliseconds
    assert _value(samples, "turnkit_store_retries", operation="metrics test") == 2
    waited = {"operation": "metrics test", "outcome": "succeeded"}
    assert _value(samples, "turnkit_store_retry_seconds_count", **waited) == 1
    assert 0.01 < _value(samples, "turnkit_store_retry_seconds_sum", **waited) < 5
    assert _value(samples, "turnkit_store_retry_seconds_bucket", le="0.5", **waited) == 1


async def test_metrics_options_are_checked(tmp_path: Path) -> None:
    """A metrics port that is no port, or one already taken, is a ConfigError naming it."""
    with pytest.raises(ConfigError, match="metrics port must be a port number"):
        TurnKitPlugin(metrics_port=70000)
    assert metrics_address(9464, "::") == "[::]:9464"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        plugin = TurnKitPlugin(metrics_port=port, metrics_bind="127.0.0.1")
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            await Client.connect("127.0.0.1:1", plugins=[plugin], lazy=True)


def _json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as a JSON object (fails on a line that is not one)."""
    lines: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"not a JSON line: {line!r}\n{text}")
    return lines


@sqlite_only
async def test_turnkit_worker_serves_metrics_and_logs_json(engine: Engine, tmp_path: Path) -> None:
    """``turnkit worker --metrics-port P --log-format json``: scraped while its turn runs, the endpoint shows the turn's
    first model call; once it ended, the turn and its tool. Every line it wrote is a JSON object; the tool's warning and
    the SDK's warning about its failed attempt name the turn, the workflow and the activity; and its start printed
    none of Alembic's INFO lines (a fresh database: every migration ran)."""
    port = _free_port()
    gate = tmp_path / "gate"
    gate.mkdir()
    database = f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}"  # migrated by the worker, not by this test
    worker = await WorkerProcess.start(
        app="tests.metrics_app",
        address=engine.temporal_address,
        task_queue=engine.tk.task_queue,
        database_url=database,
        env={"TURNKIT_METRICS_GATE": str(gate), "TURNKIT_LOG_LEVEL": "INFO"},
        extra_args=("--metrics-port", str(port), "--metrics-bind", "127.0.0.1", "--log-format", "json"),
        stderr=True,
        program=("-m", "turnkit.cli", "worker"),  # the console script's code: the Docker image's entry point
    )
    store = await Store.open(database)
    tk = TurnKit(engine.tk.client, store, task_queue=engine.tk.task_queue)
    try:
        register(app.metered)
        conversation = await tk.conversation(app.metered)
        asked = asyncio.create_task(conversation.ask("read the pressure"))

        async def tool_running() -> bool:
            assert not asked.done(), asked
            return (gate / "running").exists()

        await eventually(tool_running, what="the tool running in the worker process")
        during = await _scrape(port)
        assert _value(during, "turnkit_iterations", agent="metered", model="gpt-4o") == 1
        assert _value(during, "turnkit_turns_finished", agent="metered") == 0
        assert _value(during, "temporal_activity_execution_failed", activity_type="tool:gauge") == 1
        (gate / "go").touch()
        turn = await asked
        assert turn.status == "completed"

        async def recorded() -> bool:
            return _value(await _scrape(port), "turnkit_turns_finished", agent="metered", status="completed") == 1

        await eventually(recorded, what="the turn in turnkit_turns_finished")
        after = await _scrape(port)
        assert _value(after, "turnkit_tool_executions", tool="gauge", status="completed") == 1
        assert _value(after, "turnkit_iterations", agent="metered", model="gpt-4o") == 2
    finally:
        assert await worker.stop() == 0
        await store.close()
    out, err = await worker.output()
    lines = _json_lines(out) + _json_lines(err)
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines), lines
    assert _json_lines(out)[0]["message"].startswith("worker ready: ")
    assert not [line for line in lines if line["logger"].startswith("alembic")], lines
    assert [line for line in lines if line["message"].startswith("store schema upgraded from an empty database")]

    [tool_line] = [line for line in lines if line["logger"] == "tests.metrics_app"]
    assert tool_line["message"] == "gauge pressure read on attempt 2"
    assert tool_line["turn_id"] == turn.id and tool_line["workflow_id"] == turn.id
    assert tool_line["conversation_id"] == conversation.id
    assert (tool_line["activity"], tool_line["attempt"], tool_line["level"]) == ("tool:gauge", 2, "WARNING")
    [failed] = [line for line in lines if line["logger"] == "temporalio.activity"]
    assert failed["message"] == "Completing activity as failed"  # no dict of details appended: they are fields
    assert (failed["turn_id"], failed["activity"], failed["attempt"]) == (turn.id, "tool:gauge", 1)
    assert failed["conversation_id"] == conversation.id
    assert "RuntimeError: the gauge is stuck" in failed["exception"]


def test_turnkit_worker_takes_the_same_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """``turnkit worker`` and ``worker.py`` share the options (defaults from the environment); a bad port or format
    is a usage error naming it."""
    from turnkit._temporal.worker import parse_args
    from turnkit.cli import build_parser

    options = ["--metrics-port", "9464", "--metrics-bind", "127.0.0.1", "--log-format", "JSON"]
    for args in (build_parser().parse_args(["worker", *options]), parse_args(options)):
        assert (args.metrics_port, args.metrics_bind, args.log_format) == (9464, "127.0.0.1", "json")
    monkeypatch.setenv("TURNKIT_METRICS_PORT", "9465")
    monkeypatch.setenv("TURNKIT_LOG_FORMAT", "json")
    args = build_parser().parse_args(["worker"])
    assert (args.metrics_port, args.metrics_bind, args.log_format) == (9465, None, "json")
    monkeypatch.setenv("TURNKIT_METRICS_PORT", "metrics")
    with pytest.raises(SystemExit):
        parse_args([])
    monkeypatch.delenv("TURNKIT_METRICS_PORT")
    with pytest.raises(SystemExit):
        parse_args(["--log-format", "xml"])


async def test_connect_serves_metrics(temporal_address: str, tmp_path: Path) -> None:
    """``turnkit.connect(metrics_port=...)``: the client's runtime serves the endpoint while the connection is open
    (the SDK's request counter shows the connection's own calls)."""
    port = _free_port()
    database = f"sqlite+aiosqlite:///{tmp_path / 'connect.db'}"
    async with connect(
        temporal_address=temporal_address, database_url=database, metrics_port=port, metrics_bind="127.0.0.1"
    ) as tk:
        await tk.client.count_workflows()
        samples = await _scrape(port)
    assert _value(samples, "temporal_request", operation="CountWorkflowExecutions") >= 1
