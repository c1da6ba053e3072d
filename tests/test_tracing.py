"""Tracing with OpenTelemetry on temporalio's ``OpenTelemetryPlugin`` (issues 11, 38): one trace per turn, a turn span
as long as the turn and written once, GenAI-convention spans for its model and tool calls.

On the session's real dev server. The plugin traces into the global tracer provider, which can be set once per
process: the tests share one replay-safe provider (``create_tracer_provider``) with an in-memory exporter, and each
looks only at the traces of its own turns.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.opentelemetry import ReplaySafeTracerProvider, create_tracer_provider
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

import turnkit
from tests.engine import eventually
from tests.faults import dev_server
from tests.history_scenarios import TEAM_WORKFLOWS, register_scenario_agents
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
HISTORIES = sorted(Path(__file__).parent.glob("histories/*.json"))

_EXPORTER = InMemorySpanExporter()
_installed: list[ReplaySafeTracerProvider] = []


def _exporter() -> InMemorySpanExporter:
    """The in-memory exporter of the process's global, replay-safe tracer provider (installed on first use)."""
    if not _installed:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, ReplaySafeTracerProvider):
            provider = create_tracer_provider()
            trace.set_tracer_provider(provider)
        assert trace.get_tracer_provider() is provider, "another global tracer provider was set in this process"
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        _installed.append(provider)
    return _EXPORTER


@turnkit.tool
def lookup(sku: str) -> dict[str, Any]:
    """Look up a SKU."""
    return {"sku": sku, "stock": 3}


_held: list[asyncio.Event] = []  # the test's: set when `hold` runs the first time (its worker may be stopped)


@turnkit.tool(recovery="replay_safe")
async def hold() -> str:
    """Wait, on its first call, until its worker is stopped (a replay-safe tool: the next worker runs it again)."""
    if not _held[0].is_set():
        _held[0].set()
        await asyncio.Event().wait()  # cancelled when the worker stops
    return "held"


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
async def traced(temporal: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[TurnKit]:
    """A traced TurnKit connection (its workers are the test's: ``tk.worker(...)``)."""
    _exporter()
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'traced.db'}")
    address = temporal.client.service_client.config.target_host
    client = await Client.connect(address, plugins=[TurnKitPlugin(store, tracing=True)])
    try:
        yield TurnKit(client, store, task_queue=f"tq-{uuid.uuid4().hex[:12]}")
    finally:
        await store.close()


def _named(spans: Sequence[ReadableSpan], name: str, **attributes: Any) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name and all((s.attributes or {}).get(k) == v for k, v in attributes.items())]


def _trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id


def _span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def _parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def _turn_span(spans: Sequence[ReadableSpan], agent: str, turn_id: str) -> ReadableSpan:
    [span] = _named(spans, f"invoke_agent {agent}", **{"turnkit.turn_id": turn_id})
    return span


async def _spans_once(check: Any, what: str) -> Sequence[ReadableSpan]:
    # A turn span is exported by the workflow task that ends the turn, which may follow the ask's result by a moment.
    async def ready() -> bool:
        return bool(check(_exporter().get_finished_spans()))

    await eventually(ready, timeout=30, what=what)
    return _exporter().get_finished_spans()


def _covers(parent: ReadableSpan, child: ReadableSpan) -> bool:
    assert parent.start_time is not None and parent.end_time is not None
    assert child.start_time is not None and child.end_time is not None
    return parent.start_time <= child.start_time and child.end_time <= parent.end_time


async def test_a_turn_is_one_trace_under_a_span_as_long_as_the_turn_written_once(traced: TurnKit) -> None:
    """issue 38: the turn's ``invoke_agent`` span covers its ``chat {model}`` and ``execute_tool {name}`` spans and its
    sub-agent's turn, all one trace rooted at it, with the GenAI attributes. The worker keeps no workflow in its cache,
    so every workflow task replays the turn from its start, as after a worker restart: each turn span is still
    exported once, and so it stays when the histories are replayed again, traced, with the Replayer."""
    tk = traced
    conversation = await tk.conversation(_agents())
    async with tk.worker(max_cached_workflows=0):
        turn = await conversation.ask("check S-1")
        assert turn.status == "completed" and turn.output_text == "all done"
        child = next(t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id)

        def complete(spans: Sequence[ReadableSpan]) -> bool:
            return bool(_named(spans, "invoke_agent lead", **{"turnkit.turn_id": turn.id}))

        await _spans_once(complete, "the turn's span")
    [execution] = [e for e in await turn.tool_executions() if e.tool_name == "lookup"]
    root = _turn_span(_exporter().get_finished_spans(), "lead", turn.id)
    spans = [s for s in _exporter().get_finished_spans() if _trace_id(s) == _trace_id(root)]

    # The tree: the turn is the root (no span was current at the ask); its calls and its sub-agent's turn under it.
    helper_turn = _turn_span(spans, "helper", child.id)
    lead_calls = _named(spans, f"chat {LEAD_MODEL}")
    [helper_call] = _named(spans, f"chat {HELPER_MODEL}")
    [tool_span] = _named(spans, "execute_tool lookup")
    assert root.parent is None
    assert len(lead_calls) == 3 and len(spans) == 7  # written once each, though every workflow task replayed
    assert {_parent_id(s) for s in [*lead_calls, tool_span, helper_turn]} == {_span_id(root)}
    assert _parent_id(helper_call) == _span_id(helper_turn)
    assert root.start_time is not None and root.end_time is not None and root.end_time > root.start_time
    assert all(_covers(root, s) for s in spans) and _covers(helper_turn, helper_call)

    assert dict(root.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "lead",
        "gen_ai.conversation.id": conversation.id,
        "turnkit.turn_id": turn.id,
        "turnkit.conversation_id": conversation.id,
        "turnkit.agent": "lead",
        "turnkit.root_turn_id": turn.id,
        "turnkit.turn.status": "completed",
    }
    assert (helper_turn.attributes or {})["turnkit.root_turn_id"] == turn.id

    lead_cost = cost_from_usage(LEAD_USAGE, LEAD_MODEL).total
    assert lead_cost == pytest.approx((1_000 * 2.5 + 200 * 1.25 + 50 * 10) / 1e6)  # genai-prices' gpt-4o prices
    for span in lead_calls:
        assert span.kind == trace.SpanKind.CLIENT
        assert dict(span.attributes or {}) == {
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
    helper = dict(helper_call.attributes or {})
    assert helper["gen_ai.request.model"] == HELPER_MODEL and helper["turnkit.agent"] == "helper"
    assert helper["turnkit.conversation_id"] == child.conversation_id != conversation.id
    assert helper["gen_ai.usage.input_tokens"] == 800 and helper["gen_ai.usage.output_tokens"] == 50
    assert helper["gen_ai.usage.cache_creation.input_tokens"] == 300
    assert helper["turnkit.cost.usd"] == pytest.approx((400 * 3 + 100 * 0.3 + 300 * 3.75 + 50 * 15) / 1e6)
    assert sum(float((s.attributes or {})["turnkit.cost.usd"]) for s in [*lead_calls, helper_call]) == pytest.approx(
        (await tk.store.load_turn(turn.id)).cost + (child.cost or 0.0)
    )
    assert dict(tool_span.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "lookup",
        "gen_ai.tool.call.id": execution.tool_call_id,
        "turnkit.turn_id": turn.id,
        "turnkit.conversation_id": conversation.id,
        "turnkit.agent": "lead",
    }

    # Replayed, traced or not, the histories replay and write no span (the turn span never ends while replaying).
    histories = [await tk.client.get_workflow_handle(w).fetch_history() for w in (turn.id, child.id)]
    exported = len(_exporter().get_finished_spans())
    for plugin in (TurnKitPlugin(tracing=True), TurnKitPlugin()):
        for history in histories:
            await Replayer(workflows=[], plugins=[plugin]).replay_workflow(history)
    assert len(_exporter().get_finished_spans()) == exported


async def test_a_turn_whose_worker_is_restarted_mid_turn_has_one_span(traced: TurnKit) -> None:
    """issue 38: the worker running a turn stops while a tool call runs; the next worker replays the turn and finishes
    it. The turn's span is written once, by that worker, and still starts before the first worker's model call."""
    tk = traced
    _held[:] = [asyncio.Event()]
    script = [call_tools(("hold", {})), say("done")]
    conversation = await tk.conversation(
        turnkit.Agent("holder", model="scripted", tools=[hold], client=ScriptedClient(script))
    )
    async with tk.worker(graceful_shutdown_timeout=timedelta(0)):
        asking = asyncio.create_task(conversation.ask("hold on"))
        await asyncio.wait_for(_held[0].wait(), timeout=30)
    async with tk.worker():
        turn = await asyncio.wait_for(asking, timeout=60)
        assert turn.status == "completed" and turn.output_text == "done"
        spans = await _spans_once(lambda s: _named(s, "invoke_agent holder", **{"turnkit.turn_id": turn.id}), "span")
    root = _turn_span(spans, "holder", turn.id)
    calls = _named(spans, "chat scripted", **{"turnkit.turn_id": turn.id})
    tools = _named(spans, "execute_tool hold", **{"turnkit.turn_id": turn.id})
    assert len(calls) == 2 and len(tools) == 2  # the stopped worker's attempt of the tool, and the next worker's
    assert all(_parent_id(s) == _span_id(root) and _covers(root, s) for s in [*calls, *tools])


@turnkit.tool(recovery="replay_safe")
def step(n: int) -> int:
    """One small step.

    Args:
        n: The step number.
    """
    return n


async def test_a_turn_that_continues_as_new_is_one_span_per_run_in_one_trace(tmp_path: Path) -> None:
    """issue 38: on a private dev server that suggests continue-as-new early, a long turn runs in several workflow
    runs: each run's span ends as it continues as new and is the parent of the next run's, all in the turn's trace,
    and each model call is under the span of the run that made it."""
    _exporter()
    limits = [f"limit.historyCount.{key}=60" for key in ("warn", "suggestContinueAsNew")]
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'long.db'}")
    script = [*(call_tools(("step", {"n": n})) for n in range(1, 11)), say("10 steps")]
    agent = turnkit.Agent("long", model="scripted", tools=[step], client=ScriptedClient(script), max_iterations=20)
    try:
        async with dev_server(*(f for limit in limits for f in ("--dynamic-config-value", limit))) as server:
            client = await Client.connect(server.address, plugins=[TurnKitPlugin(store, tracing=True)])
            tk = TurnKit(client, store, task_queue=f"tq-{uuid.uuid4().hex[:12]}")
            async with tk.worker():
                turn = await (await tk.conversation(agent)).ask("go")
                assert turn.status == "completed" and turn.output_text == "10 steps", turn.error

                def last(spans: Sequence[ReadableSpan]) -> bool:
                    return any(
                        "turnkit.turn.status" in (s.attributes or {}) for s in _named(spans, "invoke_agent long")
                    )

                spans = await _spans_once(last, "the last run's span")
    finally:
        await store.close()
    runs = sorted(_named(spans, "invoke_agent long", **{"turnkit.turn_id": turn.id}), key=lambda s: s.start_time or 0)
    assert len(runs) >= 2 and runs[0].parent is None and len({_trace_id(r) for r in runs}) == 1
    assert [(r.attributes or {}).get("turnkit.continued_as_new") for r in runs] == [True] * (len(runs) - 1) + [None]
    assert [_parent_id(r) for r in runs[1:]] == [_span_id(r) for r in runs[:-1]]
    assert (runs[-1].attributes or {})["turnkit.turn.status"] == "completed"
    calls = _named(spans, "chat scripted", **{"turnkit.turn_id": turn.id})
    assert len(calls) == 11
    by_id = {_span_id(r): r for r in runs}
    assert all(_parent_id(c) in by_id and _covers(by_id[_parent_id(c) or 0], c) for c in calls)


async def test_each_turn_of_a_conversation_is_the_trace_of_its_own_ask(traced: TurnKit) -> None:
    """issues 11, 38: a lane outlives many asks; each turn is in the trace of its own ask, not the lane's first. The
    first ``ask`` starts its turn (issue 9), a root span; the second, on the idle conversation (issue 37), and the
    third, through the lane (``direct_idle_turns`` off), are asked under spans of the caller's: each turn's span is a
    child of its ask's caller span (the lane's submit carries it to the turn's start), its model call its child."""
    tk = traced
    tracer = trace.get_tracer("test")
    agent = turnkit.Agent("echo", model="scripted", client=ScriptedClient(["first", "second", "third"]))
    conversation = await tk.conversation(agent)
    async with tk.worker():
        first = await conversation.ask("one")
        with tracer.start_as_current_span("request two") as request_two:
            second = await conversation.ask("two")
        configure(direct_idle_turns=False)
        with tracer.start_as_current_span("request three") as request_three:
            third = await conversation.ask("three")
        assert (first.output_text, second.output_text, third.output_text) == ("first", "second", "third")
        turns = (first, second, third)

        def every(spans: Sequence[ReadableSpan]) -> bool:
            return all(_named(spans, "invoke_agent echo", **{"turnkit.turn_id": t.id}) for t in turns)

        spans = await _spans_once(every, "every turn's span")
    runs = [_turn_span(spans, "echo", t.id) for t in turns]
    callers = [None, request_two.get_span_context(), request_three.get_span_context()]
    assert len({_trace_id(r) for r in runs}) == 3
    for run, caller, turn in zip(runs, callers, turns, strict=True):
        if caller is None:
            assert run.parent is None
        else:
            assert run.parent is not None and run.parent.span_id == caller.span_id
            assert _trace_id(run) == caller.trace_id
        [model] = _named(spans, "chat scripted", **{"turnkit.turn_id": turn.id})
        assert _parent_id(model) == _span_id(run) and _covers(run, model)


async def test_connect_and_the_worker_take_the_tracing_option(
    temporal: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 11: ``turnkit.connect(tracing=True)`` traces its client and in-process workers; ``worker.py --tracing``."""
    _exporter()
    address = temporal.client.service_client.config.target_host
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'connect.db'}"
    agent = turnkit.Agent("solo", model="scripted", client=ScriptedClient(["hello"]))
    queue = f"tq-{uuid.uuid4().hex[:12]}"
    connected = turnkit.connect(temporal_address=address, database_url=database_url, task_queue=queue, tracing=True)
    async with connected as tk, tk.worker():
        turn = await (await tk.conversation(agent)).ask("hi")
        spans = await _spans_once(lambda s: _named(s, "invoke_agent solo", **{"turnkit.turn_id": turn.id}), "turn")
    [model] = _named(spans, "chat scripted", **{"turnkit.turn_id": turn.id})
    assert _parent_id(model) == _span_id(_turn_span(spans, "solo", turn.id))

    assert worker_main.parse_args(["--tracing"]).tracing is True
    monkeypatch.delenv("TURNKIT_TRACING", raising=False)
    assert worker_main.parse_args([]).tracing is False
    monkeypatch.setenv("TURNKIT_TRACING", "1")
    assert worker_main.parse_args([]).tracing is True
    assert build_parser().parse_args(["worker", "--app", "x"]).tracing is True  # `turnkit worker` as well
    monkeypatch.delenv("TURNKIT_TRACING")
    assert build_parser().parse_args(["worker", "--tracing"]).tracing is True


async def test_recorded_histories_replay_traced_and_write_no_span() -> None:
    """issue 38: the plugin's interceptor only adds headers, and the turn span is started and never ended while
    replaying: every checked-in history replays with tracing on, and no span is written."""
    _exporter()
    register_scenario_agents()
    exported = len(_exporter().get_finished_spans())
    replayer = Replayer(workflows=TEAM_WORKFLOWS, plugins=[TurnKitPlugin(tracing=True, strict_sandbox=True)])
    histories = [WorkflowHistory.from_json(path.stem, path.read_text()) for path in HISTORIES]
    for history in histories:
        await replayer.replay_workflow(history)
    assert len(_exporter().get_finished_spans()) == exported


def test_tracing_is_off_by_default_and_imports_nothing() -> None:
    """issue 11: without ``tracing`` no OpenTelemetry and no tracing interceptor are loaded."""
    script = textwrap.dedent(
        """
        import sys
        from turnkit.plugin import TurnKitPlugin
        from turnkit.store import Store

        plugin = TurnKitPlugin()
        watched = ("opentelemetry", "temporalio.contrib.opentelemetry", "turnkit._temporal.turn_spans")
        loaded = sorted(m for m in sys.modules if m.startswith(watched))
        print(loaded, [type(i).__name__ for i in plugin.interceptors or []])
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] ['CancelAskedTurns']"  # turnkit.workflow's, no tracing interceptor


def test_tracing_rejects_what_it_cannot_use() -> None:
    """issue 38: ``tracing`` is a bool (the spans go to the global provider); a worker needs that provider replay-safe
    (checked in a fresh interpreter, whose global provider is OpenTelemetry's default)."""
    with pytest.raises(InputError, match=r"^tracing must be True or False, not TracerProvider: .*create_tracer_prov"):
        TurnKitPlugin(tracing=TracerProvider())  # type: ignore[arg-type]
    names = [type(i).__name__ for i in TurnKitPlugin(tracing=True).interceptors or []]
    assert names == ["OpenTelemetryInterceptor", "TurnTraceInterceptor", "CancelAskedTurns"]
    script = textwrap.dedent(
        """
        from turnkit._temporal.turn_spans import TurnTraceInterceptor
        from turnkit.kernel.errors import ConfigError

        try:
            TurnTraceInterceptor().workflow_interceptor_class(None)
        except ConfigError as err:
            print(err)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("tracing a worker needs a replay-safe global tracer provider: ")
