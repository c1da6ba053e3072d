"""``TurnKitPlugin``: one place for the data converter, sandbox pass-through, workflows and activities.

The worker, the tests and the replayer all use it, so replay is configured exactly like the worker.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.plugin import SimplePlugin
from temporalio.service import ConnectConfig, ServiceClient
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkerConfig, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from turnkit._activities.registry import build_activities, build_tool_activities
from turnkit._activities.store_failures import StoreFailureInterceptor
from turnkit._mcp_connections import close_kept_connections
from turnkit._ops.lost_submits import SubmitSearch
from turnkit._temporal.heartbeats import HeartbeatClock
from turnkit._temporal.logs import LogIds, json_logging
from turnkit._temporal.sandbox_runner import TurnKitSandboxRunner
from turnkit._temporal.settings_scope import SettingsScope
from turnkit._temporal.telemetry import metrics_address, telemetry_runtime
from turnkit._temporal.tracing import tracing_interceptors
from turnkit._workflows.registry import ALL_WORKFLOWS, VERSIONED_WORKFLOWS
from turnkit.config import settings_overrides
from turnkit.kernel.errors import ConfigError, Error
from turnkit.store.store import Store
from turnkit.workflow import CancelAskedTurns

if TYPE_CHECKING:
    from turnkit._temporal.tracing import Tracing

__all__ = ["PASSTHROUGH_MODULES", "WORKFLOW_MODULES", "TurnKitPlugin"]

#: Modules the workflow sandbox imports once, from the host, instead of again for every workflow run.
PASSTHROUGH_MODULES = (
    "turnkit.kernel",  # everything TurnKit's workflows import of TurnKit: pure payloads, records, names, declarations
    "turnkit.workflow",  # the API a team's workflows call (it imports only the kernel)
    "pydantic",  # the payloads' models: expensive to import, and one class per model keeps the converter's cache
    "pydantic_core",
    "annotated_types",
)

#: TurnKit's workflow code. A worker imports it once, from the host, like the modules above (``strict_sandbox=False``);
#: the strict sandbox re-imports it for every workflow run instead (docs/design.md, "Why each piece is where it is").
WORKFLOW_MODULES = ("turnkit._workflows",)


def _sandbox(*extra: str) -> Callable[[WorkflowRunner | None], WorkflowRunner]:
    """Extend the worker's runner: its sandbox restrictions gain TurnKit's pass-through modules; anything else it was
    given (restrictions, runner class, an unsandboxed runner) is kept."""

    def runner_for(runner: WorkflowRunner | None) -> WorkflowRunner:
        if runner is not None and not isinstance(runner, SandboxedWorkflowRunner):
            return runner  # the application chose an unsandboxed runner (or its own): nothing to pass through
        if runner is None:
            runner = SandboxedWorkflowRunner()
        restrictions = runner.restrictions.with_passthrough_modules(*PASSTHROUGH_MODULES, *extra)
        if type(runner) is SandboxedWorkflowRunner:
            # The SDK's own runner becomes the one that answers the converter's context questions without re-entering
            # the sandbox per payload (turnkit._temporal.sandbox_runner), with the same restrictions and runner class.
            return TurnKitSandboxRunner(restrictions=restrictions, runner_class=runner.runner_class)
        return replace(runner, restrictions=restrictions)  # the application's own sandbox class, kept

    return runner_for


def _data_converter(existing: DataConverter | None) -> DataConverter:
    """TurnKit's payloads are pydantic models, so the payload converter is pydantic's; the application's payload codec
    (an encrypting one, say), failure converter and external storage are kept."""
    if existing is None:
        return pydantic_data_converter
    return replace(existing, payload_converter_class=pydantic_data_converter.payload_converter_class)


def _unsandboxed(_: WorkflowRunner | None) -> WorkflowRunner:
    return UnsandboxedWorkflowRunner()


class TurnKitPlugin(SimplePlugin):
    """Registers TurnKit on a Temporal client, worker or replayer.

    The client's data converter gets pydantic's payload converter and keeps its payload codec, failure converter and
    external storage; the worker's workflows run in Temporal's sandbox through
    :class:`~turnkit._temporal.sandbox_runner.TurnKitSandboxRunner`.

    Args:
        store: The record store the activities write to. Without it (a replayer, a client that only submits),
            no activities are registered.
        tracing: OpenTelemetry tracing on temporalio's ``OpenTelemetryPlugin`` (``pip install 'turnkit[otel]'``;
            see :mod:`turnkit._temporal.tracing`): False (the default) is off and imports nothing; True traces into
            the global tracer provider, replay-safe where workflows run (``create_tracer_provider()``). Give it to
            the client's plugin: the worker built on that client and the calls it makes (``ask``) are then traced
            alike.
        tools_only: Register only the tool activity (no workflows, no model or store activities): a worker on a
            tool's own task queue (``@tool(task_queue="gpu")``, ``worker.py --queue gpu --only tools``). It runs
            whatever tool calls are scheduled on its queue: the tools whose ``task_queue`` is that queue, and on a
            turns' queue the tools without one. Needs ``store``: a tool call's records are written where it runs.
        strict_sandbox: Re-import TurnKit's workflow code (``workflows/``) in the sandbox for every workflow run, so
            that a call the sandbox forbids (the clock, randomness, I/O) raises there. The replayers (``turnkit
            replay``, the replay tests) use it. Off (the default), a worker imports it once, like the pure modules it
            uses: the sandbox still runs each workflow with its own globals and restricted builtins, and a new
            workflow run's sandbox costs ~0.4 ms of CPU instead of ~17 ms (``python -m bench.sandbox_cost``; see
            docs/design.md, "Why each piece is where it is").
        sandbox: Run the workflows in Temporal's sandbox (the default). False runs them with
            ``UnsandboxedWorkflowRunner``: ~6 ms less CPU per 1-iteration turn (8 to 11%, ``python -m bench.cpu_profile
            --no-sandbox``), because the sandbox's per-activation work goes. The workflows run only TurnKit's own code
            (agents, tools and hooks run in activities), and CI replays every checked-in history under the strict
            sandbox; what is given up is a run-time check of that code, not of yours. ``worker.py --no-sandbox``.
        settings: Settings this worker's activities read over the process's defaults (``turnkit.configure``), by
            name: ``{"client": MyClient(), "max_spend": 2.0}`` (see :mod:`turnkit.config`).
        metrics_port: Serve Prometheus metrics (the SDK's and TurnKit's, README "Metrics") at
            ``http://<metrics_bind>:<metrics_port>/metrics`` from the client this plugin connects, and the workers
            built on it. ``turnkit worker --metrics-port``. Off by default.
        metrics_bind: The address the metrics endpoint listens on; default ``$TURNKIT_METRICS_BIND``, else
            ``0.0.0.0`` (every interface, so that Prometheus reaches a worker in a container).

    Raises:
        InputError: ``tracing`` is not one of these.
        ConfigError: ``tracing`` is on and OpenTelemetry is not installed (or, building a worker, the global tracer
            provider is not replay-safe); ``tools_only`` without a store;
            ``strict_sandbox`` without ``sandbox``; ``settings`` names an unknown setting or a value ``configure``
            refuses; ``metrics_port`` is no port number; at connection: the metrics endpoint cannot listen there, or
            the client was given a ``runtime`` of its own (configure Prometheus on that one instead).
    """

    def __init__(
        self,
        store: Store | None = None,
        *,
        tracing: Tracing = False,
        tools_only: bool = False,
        strict_sandbox: bool = False,
        sandbox: bool = True,
        settings: Mapping[str, Any] | None = None,
        metrics_port: int | None = None,
        metrics_bind: str | None = None,
    ) -> None:
        self._metrics = metrics_address(metrics_port, metrics_bind)
        if strict_sandbox and not sandbox:
            raise ConfigError("strict_sandbox=True needs sandbox=True: the strict sandbox is a sandbox")
        if tools_only and store is None:
            raise ConfigError("a tools-only TurnKitPlugin needs the store: tool calls write their records")
        overrides = settings_overrides(settings or {})
        self._store, self._overrides = (None if tools_only else store), overrides
        activities = None
        if store is not None:
            activities = build_tool_activities(store) if tools_only else build_activities(store)
        # Tracing first: the context it takes from the headers is then current in every other interceptor.
        traced = tracing_interceptors(tracing)
        interceptors: list[Any] = list(traced)
        if store is not None:
            # Deterministic store failures are not retried, in every activity.
            interceptors.append(StoreFailureInterceptor())
            # Heartbeats paced from each attempt's start, not sent at every store phase (_temporal/heartbeats.py).
            interceptors.append(HeartbeatClock())
            if overrides:
                interceptors.append(SettingsScope(overrides))
            if json_logging():
                interceptors.append(LogIds())  # the turn and conversation on every JSON log line of an activity
        if not tools_only:
            # A team's workflow cancelled while turns it asked run (turnkit.workflow) cancels them too.
            interceptors.append(CancelAskedTurns())
        shared = [*(() if strict_sandbox else WORKFLOW_MODULES), *(("opentelemetry",) if traced else ())]
        super().__init__(
            "turnkit.TurnKitPlugin",
            data_converter=_data_converter,
            workflows=None if tools_only else ALL_WORKFLOWS,
            activities=activities,
            interceptors=interceptors or None,
            workflow_runner=_sandbox(*shared) if sandbox else _unsandboxed,
            # A TurnKit error raised by workflow code (bad input to turnkit.workflow, a failed turn it was asked to
            # raise for) fails that workflow; any other exception fails the workflow task, which is retried.
            workflow_failure_exception_types=[Error],
        )

    async def connect_service_client(
        self, config: ConnectConfig, next: Callable[[ConnectConfig], Awaitable[ServiceClient]]
    ) -> ServiceClient:
        """Connect with the runtime that serves ``metrics_port`` (and forwards Core's logs when they are JSON):
        a runtime exists before its client connects (:mod:`turnkit._temporal.telemetry`)."""
        runtime = telemetry_runtime(self._metrics)
        if runtime is not None and config.runtime is not runtime:
            if config.runtime is None:
                config = replace(config, runtime=runtime)
            elif self._metrics is not None:
                raise ConfigError(
                    "metrics_port needs TurnKit's Temporal runtime, but the client was given a runtime of its own: "
                    "configure PrometheusConfig on that runtime instead"
                )
        return await super().connect_service_client(config, next)

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        """Run the worker; one with a store (not tools-only) also searches for lost submissions of its task queue
        and submits them to their lanes again (:mod:`turnkit._ops.lost_submits`, ``settings.lost_submit_grace``).
        When it stops, the MCP connections its activities kept are closed (:mod:`turnkit._mcp_connections`)."""
        try:
            if self._store is None or not worker.config(active_config=True).get("workflows"):
                await super().run_worker(worker, next)
                return
            search = SubmitSearch(self._store, worker.client, worker.task_queue, self._overrides)
            async with search.running():
                await super().run_worker(worker, next)
        finally:
            await close_kept_connections()

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        """As :class:`SimplePlugin` does; on a worker with Worker Versioning, TurnKit's workflows are registered with
        their versioning behaviour (turns pinned, lanes upgrading: see :mod:`turnkit._workflows.registry`)."""
        config = super().configure_worker(config)
        deployment = config.get("deployment_config")
        if deployment is not None and deployment.use_worker_versioning:
            config["workflows"] = [VERSIONED_WORKFLOWS.get(w, w) for w in config.get("workflows") or ()]
        return config
