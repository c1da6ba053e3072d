"""Run a TurnKit worker: ``turnkit worker --app myapp.agents`` (in a source checkout, ``python worker.py``).

The application module registers its agents and tools at import time (``turnkit.register``); every worker and
every process that submits turns must import the same definitions. The worker connects to the Temporal cluster of
Temporal's envconfig (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, ``TEMPORAL_TLS_*``, the
profile in the config file; ``--address`` and ``--namespace`` win; ``127.0.0.1:7233`` when nothing is configured) and
the store at ``$TURNKIT_DATABASE_URL`` (``--database-url``), which a worker given a cluster must have: the default
SQLite file under ``./.turnkit/`` is one no other process on that cluster would read. It shuts down gracefully on
SIGTERM or SIGINT: it stops polling, lets running activities finish (up to ``--grace`` seconds) and exits. Installed
from the wheel, it is also ``turnkit worker``.

A tool with a task queue of its own (``@tool(task_queue="gpu")``) runs on a worker for that queue, on the box that can
run it: ``python worker.py --app myapp.agents --queue gpu --only tools`` registers only the tool activity (no
workflows, no model or store activities) and serves the tools whose ``task_queue`` is ``gpu``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
from datetime import timedelta

from temporalio.common import WorkerDeploymentVersion
from temporalio.worker import Worker, WorkerDeploymentConfig

from turnkit._engine.tool_queues import tools_on_queue
from turnkit._temporal.connection import (
    TemporalUnreachable,
    add_connection_arguments,
    client_options_from_arguments,
    connect_client,
    require_database_url,
)
from turnkit._temporal.logs import configure_logging, log_line
from turnkit._temporal.process import exit_process
from turnkit._temporal.search_attributes import require_search_attributes
from turnkit._temporal.tracing import add_tracing_argument
from turnkit._temporal.worker_arguments import (
    add_loop_argument,
    add_observability_arguments,
    add_sandbox_argument,
    on_uvloop,
    run_on_loop,
)
from turnkit.config import TASK_QUEUE, settings
from turnkit.kernel.errors import ConfigError
from turnkit.model_access import validate_models
from turnkit.plugin import TurnKitPlugin
from turnkit.store import Store

log = logging.getLogger("turnkit.worker")

#: Where the worker looks for Temporal when nothing is configured (the ``temporal`` CLI's default too).
DEFAULT_ADDRESS = "127.0.0.1:7233"


def add_queue_arguments(parser: argparse.ArgumentParser, *, default: str | None) -> None:
    """``--task-queue`` (alias ``--queue``) and ``--only tools``: which queue the worker polls, and what it runs."""
    parser.add_argument(
        "--task-queue",
        "--queue",
        dest="task_queue",
        default=default,
        metavar="NAME",
        help="task queue to poll (default $TURNKIT_TASK_QUEUE or 'turnkit'); a tool's own queue with --only tools",
    )
    parser.add_argument(
        "--only",
        choices=["tools"],
        default=None,
        help="tools: register only the tool activity (no workflows, no model or store activities), for the tools "
        "whose task_queue is this queue (every tool without one on the turns' queue)",
    )


def add_deployment_arguments(parser: argparse.ArgumentParser) -> None:
    """``--deployment`` and ``--build-id``: run as one version of a Worker Deployment (Worker Versioning)."""
    parser.add_argument(
        "--deployment",
        default=os.environ.get("TURNKIT_DEPLOYMENT_NAME"),
        metavar="NAME",
        help="Worker Deployment this worker belongs to (default $TURNKIT_DEPLOYMENT_NAME); with --build-id, the "
        "worker uses Worker Versioning: turns stay on the build that started them, lanes move to the current build",
    )
    parser.add_argument(
        "--build-id",
        default=os.environ.get("TURNKIT_BUILD_ID"),
        metavar="ID",
        help="this worker's build id within --deployment (default $TURNKIT_BUILD_ID)",
    )


def add_validate_models_argument(parser: argparse.ArgumentParser) -> None:
    """``--validate-models``: check every agent's client and model before polling (:mod:`turnkit.model_access`)."""
    parser.add_argument(
        "--validate-models",
        action="store_true",
        default=None,
        help="before polling, check every registered agent's API key and model with one cheap provider call each "
        "(settings.validate_models); a missing key or unknown model stops the start. Agents defined with "
        "validate=True are checked either way",
    )


def deployment_config(args: argparse.Namespace) -> WorkerDeploymentConfig | None:
    """The worker's Worker Versioning options, from ``--deployment`` and ``--build-id`` (both, or neither)."""
    name, build_id = getattr(args, "deployment", None), getattr(args, "build_id", None)
    if not name and not build_id:
        return None
    if not (name and build_id):
        raise ConfigError("--deployment and --build-id go together: a worker version is a deployment and a build id")
    version = WorkerDeploymentVersion(deployment_name=name, build_id=build_id)
    return WorkerDeploymentConfig(version=version, use_worker_versioning=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (environment variables give the defaults)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--app", action="append", default=[], help="module that registers agents (repeatable)")
    add_connection_arguments(parser)
    add_queue_arguments(parser, default=os.environ.get("TURNKIT_TASK_QUEUE", TASK_QUEUE))
    parser.add_argument("--database-url", default=os.environ.get("TURNKIT_DATABASE_URL"))
    parser.add_argument("--grace", type=float, default=30.0, help="seconds running activities get at shutdown")
    add_deployment_arguments(parser)
    add_validate_models_argument(parser)
    add_tracing_argument(parser)
    add_sandbox_argument(parser)
    add_loop_argument(parser)
    add_observability_arguments(parser)
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> None:
    """Import the apps, connect, and run the worker until SIGTERM/SIGINT."""
    for module in args.app:
        importlib.import_module(module)
    options = client_options_from_arguments(args)
    database_url = args.database_url
    configured = "target_host" in options
    if configured:  # a cluster was given: refused before the store creates anything on disk
        database_url = require_database_url(database_url, options["target_host"])
    address = options.pop("target_host", DEFAULT_ADDRESS)
    tools_only = getattr(args, "only", None) == "tools"
    served = _served_tools(args.task_queue) if tools_only else ""
    if not tools_only:  # a tools-only worker makes no model calls
        await validate_models(every=getattr(args, "validate_models", None))
    deployment = deployment_config(args)
    store = await Store.open(database_url)
    try:
        sandbox = getattr(args, "sandbox", True)
        plugin = TurnKitPlugin(
            store,
            tracing=args.tracing,
            tools_only=tools_only,
            sandbox=sandbox,
            metrics_port=getattr(args, "metrics_port", None),
            metrics_bind=getattr(args, "metrics_bind", None),
        )
        try:
            client = await connect_client(address, **options, plugins=[plugin])
        except TemporalUnreachable as error:
            if configured:
                raise
            hint = "nothing configured, so the local default: set TEMPORAL_ADDRESS, a profile, or pass --address"
            raise TemporalUnreachable(f"{error} ({hint})") from error
        if settings.search_attributes:  # before polling: no workflow may start or upsert an unregistered attribute
            await require_search_attributes(client)
        worker = Worker(
            client,
            task_queue=args.task_queue,
            graceful_shutdown_timeout=timedelta(seconds=args.grace),
            deployment_config=deployment,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with worker:
            log.info("turnkit worker polling %s on %s (%s)", args.task_queue, address, options["namespace"])
            unsandboxed = "" if sandbox or tools_only else " (workflows unsandboxed)"
            on_loop = " (uvloop)" if on_uvloop() else ""
            version = deployment.version if deployment else None
            build = f" (build {version.deployment_name}/{version.build_id})" if version else ""
            metrics = f" (metrics on port {args.metrics_port})" if getattr(args, "metrics_port", None) else ""
            ready = f"worker ready: task queue {args.task_queue} on {address}{served}{on_loop}{unsandboxed}{build}"
            print(log_line(ready + metrics), flush=True)  # a JSON line too when the logs are JSON
            await stop.wait()
            log.info("shutting down")
    finally:
        await store.close()


def _served_tools(task_queue: str) -> str:
    """What a tools-only worker on ``task_queue`` serves, for its ready line; a queue no tool runs on is an error."""
    turn_queue = os.environ.get("TURNKIT_TASK_QUEUE", TASK_QUEUE)
    tools = tools_on_queue(task_queue, turn_queue=turn_queue)
    if not tools:
        raise ConfigError(
            f"no registered tool runs on task queue {task_queue!r}: give a tool @tool(task_queue={task_queue!r}), "
            "or check --app (the modules that register the agents)"
        )
    return f" (tools only: {', '.join(sorted({t.name for t in tools}))})"


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    sys.path.insert(0, os.getcwd())  # so that --app finds the application's modules
    args = parse_args(argv)
    configure_logging(args.log_format)
    try:
        client_options_from_arguments(args)  # a misspelt profile or config file: a usage error, not a traceback
        run_on_loop(run(args), args.loop)
    except ConfigError as error:  # also missing search attributes, no store, no server: say what to do, in one line
        print(f"turnkit worker: {error}", file=sys.stderr, flush=True)
        exit_process(2)
    exit_process(0)
