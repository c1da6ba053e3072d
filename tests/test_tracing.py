"""Tracing with OpenTelemetry (issue 11): one trace per turn, GenAI attributes on the model and tool activities.

On the session's real dev server, with an in-memory span exporter on a tracer provider of the test's own (not the
global one), so nothing else the test process runs lands in it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

import turnkit
from tests.engine import eventually
from turnkit._temporal import worker as worker_main
from turnkit.cli import build_parser
from turnkit.config import configure
from turnkit.cost import cost_from_usage
from turnkit.kernel.errors import InputError
from turnkit.model import Usage
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit
from turnkit.store import Store
from turnkit.testing import ScriptedClient, call_tools, say

LEAD_MODEL = "gpt-4o"
HELPER_MODEL = "claude-sonnet-4-20250514"
LEAD_USAGE = Usage(input_tokens=1_000, cached_tokens=200, output_tokens=50)
HELPER_USAGE = Usage(input_tokens=400, cached_tokens=100, cache_write_tokens=300, output_tokens=20, thinking_tokens=30)


@turnkit.tool
def lookup(sku: str) -> dict[str, Any]:
    """Look up a SKU."""
    return {"sku": sku, "stock": 3}


def _agents() -> turnkit.Agent:
    helper = turnkit.Agent(
        "helper",
        description="Helps.",
        model=HELPER_MODEL,
        client=ScriptedClient(lambda request: say("helped", usage=HELPER_USAGE)),
    )
    lead_script = [
        call_tools(("lookup", {"sku": "S-1"}), usage=LEAD_USAGE),
        call_tools(("helper", {"task": "check"}), usage=LEAD_USAGE),
        say("all done", usage=LEAD_USAGE),
    ]
    return turnkit.Agent(
        "lead", model=LEAD_MODEL, tools=[lookup], sub_agents=[helper], client=ScriptedClient(lead_script)
    )


@pytest_asyncio.fixture
async def traced(temporal: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[tuple[TurnKit, InMemorySpanExporter]]:
    """A TurnKit connection traced into an in-memory exporter, with an in-process worker built on its client."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'traced.db'}")
    address = temporal.client.service_client.config.target_host
    client = await Client.connect(address, plugins=[TurnKitPlugin(store, tracing=provider)])
    tk = TurnKit(client, store, task_queue=f"tq-{uuid.uuid4().hex[:12]}")
    try:
        async with tk.worker():
            yield tk, exporter
    finally:
        await store.close()
        provider.shutdown()


def _named(spans: Sequence[ReadableSpan], name: str, **attributes: Any) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name and all((s.attributes or {}).get(k) == v for k, v in attributes.items())]


def _trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id


async def _spans_once(exporter: InMemorySpanExporter, check: Any, what: str) -> Sequence[ReadableSpan]:
    # Workflow spans are written when the worker handles each task; the last ones may follow the result by a moment.
    async def ready() -> bool:
        return bool(check(exporter.get_finished_spans()))

    await eventually(ready, timeout=30, what=what)
    return exporter.get_finished_spans()


async def test_one_turn_with_a_tool_and_a_sub_agent_is_one_trace(
    traced: tuple[TurnKit, InMemorySpanExporter],
) -> None:
    """issue 11: the ask, the turn, its model and tool activities and its sub-agent's turn share one trace; model
    spans carry the GenAI attributes (model, tokens, cost), tool spans the tool's. (A fresh conversation's first
    turn: ``ask`` starts its workflow, issue 9; the lane's part is in the next test.)"""
    tk, exporter = traced
    conversation = await tk.conversation(_agents())
    turn = await conversation.ask("check S-1")
    assert turn.status == "completed" and turn.output_text == "all done"
    child = next(t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id)
    [execution] = [e for e in await turn.tool_executions() if e.tool_name == "lookup"]

    def complete(spans: Sequence[ReadableSpan]) -> bool:
        return len(_named(spans, "RunActivity:turnkit.model")) == 4 and bool(
            _named(spans, "RunWorkflow:TurnWorkflow", temporalWorkflowID=child.id)
        )

    spans = await _spans_once(exporter, complete, "the turn's spans")
    [ask] = _named(spans, "StartWorkflow:TurnWorkflow", temporalWorkflowID=turn.id)
    assert ask.parent is None  # the client's ask is the root ...
    assert {_trace_id(s) for s in spans} == {_trace_id(ask)}  # ... of the one trace every span is in
    ids = {s.context.span_id for s in spans if s.context is not None}
    assert all(s.parent is not None and s.parent.span_id in ids for s in spans if s is not ask)  # one tree

    # No lane: the turn and the sub-agent's.
    assert not _named(spans, "RunWorkflow:ConversationWorkflow")
    assert _named(spans, "RunWorkflow:TurnWorkflow", temporalWorkflowID=turn.id)
    assert _named(spans, "StartChildWorkflow:TurnWorkflow", temporalWorkflowID=turn.id)  # the sub-agent's start

    lead_calls = _named(spans, "RunActivity:turnkit.model", **{"turnkit.turn_id": turn.id})
    assert len(lead_calls) == 3
    lead_cost = cost_from_usage(LEAD_USAGE, LEAD_MODEL).total
    assert lead_cost == pytest.approx((1_000 * 2.5 + 200 * 1.25 + 50 * 10) / 1e6)  # genai-prices' gpt-4o prices
    for span in lead_calls:
        assert dict(span.attributes or {}) == {
            "temporalActivityID": (span.attributes or {})["temporalActivityID"],
            "temporalWorkflowID": turn.id,
            "temporalRunID": (span.attributes or {})["temporalRunID"],
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": LEAD_MODEL,
            "gen_ai.response.model": LEAD_MODEL,
            "gen_ai.provider.name": "ScriptedClient",
            "gen_ai.system": "ScriptedClient",
            "gen_ai.agent.name": "lead",
            "gen_ai.conversation.id": conversation.id,
            "gen_ai.usage.input_tokens": 1_200,  # cached tokens are input tokens in the conventions
            "gen_ai.usage.output_tokens": 50,
            "gen_ai.usage.cache_read.input_tokens": 200,
            "gen_ai.usage.cache_creation.input_tokens": 0,
            "gen_ai.usage.reasoning.output_tokens": 0,
            "turnkit.cost.usd": pytest.approx(lead_cost),
            "turnkit.turn_id": turn.id,
            "turnkit.conversation_id": conversation.id,
            "turnkit.agent": "lead",
        }

    [helper_call] = _named(spans, "RunActivity:turnkit.model", **{"turnkit.turn_id": child.id})
    helper = dict(helper_call.attributes or {})
    assert helper["gen_ai.request.model"] == HELPER_MODEL and helper["turnkit.agent"] == "helper"
    assert helper["turnkit.conversation_id"] == child.conversation_id != conversation.id
    assert helper["gen_ai.usage.input_tokens"] == 800 and helper["gen_ai.usage.output_tokens"] == 50
    assert helper["gen_ai.usage.cache_creation.input_tokens"] == 300
    assert helper["turnkit.cost.usd"] == pytest.approx((400 * 3 + 100 * 0.3 + 300 * 3.75 + 50 * 15) / 1e6)
    assert sum(float((s.attributes or {})["turnkit.cost.usd"]) for s in [*lead_calls, helper_call]) == pytest.approx(
        (await tk.store.load_turn(turn.id)).cost + (child.cost or 0.0)
    )

    [tool_span] = _named(spans, "RunActivity:tool:lookup")
    assert {k: v for k, v in (tool_span.attributes or {}).items() if not k.startswith("temporal")} == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "lookup",
        "gen_ai.tool.call.id": execution.tool_call_id,
        "turnkit.turn_id": turn.id,
        "turnkit.conversation_id": conversation.id,
        "turnkit.agent": "lead",
    }

    # Tracing adds no workflow command: the traced histories replay on the untraced plugin.
    replayer = Replayer(workflows=[], plugins=[TurnKitPlugin()])
    for workflow_id in (turn.id, child.id):
        history = await tk.client.get_workflow_handle(workflow_id).fetch_history()
        await replayer.replay_workflow(history)


async def test_each_turn_of_a_conversation_is_the_trace_of_its_own_ask(
    traced: tuple[TurnKit, InMemorySpanExporter],
) -> None:
    """issue 11: a lane outlives many asks; each turn joins the trace of its own ask, not the lane's first. The
    first ``ask`` starts its turn (issue 9) and so does the second, on the idle conversation (issue 37); the third,
    with ``direct_idle_turns`` off, goes through the lane: its submit and the turn's start from the lane's activity
    are in that ask's trace."""
    tk, exporter = traced
    agent = turnkit.Agent("echo", model="scripted", client=ScriptedClient(["first", "second", "third"]))
    conversation = await tk.conversation(agent)
    first = await conversation.ask("one")
    second = await conversation.ask("two")
    configure(direct_idle_turns=False)
    third = await conversation.ask("three")
    assert (first.output_text, second.output_text) == ("first", "second")
    turns = (first, second, third)

    def every(spans: Sequence[ReadableSpan]) -> bool:
        return all(_named(spans, "RunActivity:turnkit.model", **{"turnkit.turn_id": t.id}) for t in turns)

    spans = await _spans_once(exporter, every, "every turn's spans")
    directs = [_named(spans, "StartWorkflow:TurnWorkflow", temporalWorkflowID=t.id) for t in (first, second)]
    submits = _named(spans, "StartUpdateWithStartWorkflow:ConversationWorkflow")
    asks = [*(span for [span] in directs), *submits]
    assert len(asks) == 3 and len({_trace_id(a) for a in asks}) == 3 and all(a.parent is None for a in asks)
    for ask, turn in zip(asks, turns, strict=True):
        [run] = _named(spans, "RunWorkflow:TurnWorkflow", temporalWorkflowID=turn.id)
        [model] = _named(spans, "RunActivity:turnkit.model", **{"turnkit.turn_id": turn.id})
        assert _trace_id(run) == _trace_id(model) == _trace_id(ask)
    for ask in submits:  # the lane's submit activity of each later ask is in that ask's trace too
        in_trace = [s for s in _named(spans, "RunActivity:turnkit.submit_turn") if _trace_id(s) == _trace_id(ask)]
        assert len(in_trace) == 1


async def test_connect_and_the_worker_take_the_tracing_option(
    temporal: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 11: ``turnkit.connect(tracing=…)`` traces its client and in-process workers; ``worker.py --tracing``."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    address = temporal.client.service_client.config.target_host
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'connect.db'}"
    agent = turnkit.Agent("solo", model="scripted", client=ScriptedClient(["hello"]))
    queue = f"tq-{uuid.uuid4().hex[:12]}"
    connected = turnkit.connect(temporal_address=address, database_url=database_url, task_queue=queue, tracing=provider)
    async with connected as tk, tk.worker():
        turn = await (await tk.conversation(agent)).ask("hi")
    provider.shutdown()
    [ask] = _named(exporter.get_finished_spans(), "StartWorkflow:TurnWorkflow", temporalWorkflowID=turn.id)
    [model] = _named(exporter.get_finished_spans(), "RunActivity:turnkit.model", **{"turnkit.turn_id": turn.id})
    assert _trace_id(model) == _trace_id(ask)

    assert worker_main.parse_args(["--tracing"]).tracing is True
    monkeypatch.delenv("TURNKIT_TRACING", raising=False)
    assert worker_main.parse_args([]).tracing is False
    monkeypatch.setenv("TURNKIT_TRACING", "1")
    assert worker_main.parse_args([]).tracing is True
    assert build_parser().parse_args(["worker", "--app", "x"]).tracing is True  # `turnkit worker` as well
    monkeypatch.delenv("TURNKIT_TRACING")
    assert build_parser().parse_args(["worker", "--tracing"]).tracing is True


def test_tracing_is_off_by_default_and_imports_nothing() -> None:
    """issue 11: without ``tracing`` no OpenTelemetry SDK and no tracing interceptor are loaded."""
    script = textwrap.dedent(
        """
        import sys
        from turnkit.plugin import TurnKitPlugin
        from turnkit.store import Store

        plugin = TurnKitPlugin()
        watched = ("opentelemetry.sdk", "temporalio.contrib.opentelemetry")
        loaded = sorted(m for m in sys.modules if m.startswith(watched))
        print(loaded, [type(i).__name__ for i in plugin.interceptors or []])
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] ['CancelAskedTurns']"  # turnkit.workflow's, no tracing interceptor


def test_tracing_rejects_what_it_cannot_use() -> None:
    """issue 11: a ``tracing`` value that is not a bool, a TracerProvider or a Tracer is named in the error."""
    with pytest.raises(InputError, match=r"^tracing must be True, False, a TracerProvider or a Tracer, not str$"):
        TurnKitPlugin(tracing="yes")  # type: ignore[arg-type]
    names = [type(i).__name__ for i in TurnKitPlugin(tracing=TracerProvider()).interceptors or []]
    assert names == ["TracingInterceptor", "TurnTraceInterceptor", "CancelAskedTurns"]
