"""The ``turnkit`` command.

Operator verbs:

* ``turnkit check`` reads the store and Temporal and prints every broken invariant of behaviour §5.13 (one line each:
  kind, ids, what is wrong); it exits 1 when anything is wrong, 0 when all is well.
* ``turnkit repair`` fixes what ``check`` finds and can be fixed safely, prints what it did and what is left, and
  exits 1 when something is left.
* ``turnkit reconcile`` runs the repair sweep, then re-signals every delivery still pending in the store, so a
  signal lost between a delivery's commit and its wake-up is repaired. Schedule it (cron, a Temporal schedule)
  against a real cluster: ``TEMPORAL_ADDRESS=… TURNKIT_DATABASE_URL=… turnkit reconcile``.
* ``turnkit db upgrade | current``: the store's migrations (:mod:`turnkit._ops.dbadmin`).
* ``turnkit worker``, ``turnkit demo``.
* ``turnkit ask --app MODULE AGENT TEXT`` (:mod:`turnkit._ops.ask`): run one turn, print its progress and the answer.

Debugger verbs (each in its own module; this one only parses arguments and connects):

* ``turnkit show ID`` (:mod:`turnkit._ops.show`, :mod:`turnkit._ops.timeline`): the tree of a turn or conversation.
* ``turnkit replay ID | history.json | --all --query Q`` (:mod:`turnkit._temporal.replay`): replay histories on today's
  code.
* ``turnkit history TURN_ID`` (:mod:`turnkit._temporal.histories`): a history as JSON.
* ``turnkit events TURN_ID|CONVERSATION_ID [--follow]`` (:mod:`turnkit._ops.event_stream`): a turn's (or every turn
  of a conversation's) events as they are recorded.

Every verb takes the same connection options (:func:`connection_options`, :func:`temporal_client`,
:func:`open_store`): the one place that turns options and environment into connections. The Temporal connection
comes from Temporal's envconfig (``TEMPORAL_*`` variables, the config file's profile; see
:mod:`turnkit._temporal.connection`); ``--address``, ``--namespace``, ``--profile`` and ``--config-file`` win.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import re
import sys
from collections.abc import AsyncGenerator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from turnkit._temporal.connection import add_connection_arguments, client_options_from_arguments
from turnkit._temporal.process import exit_process
from turnkit._temporal.tracing import add_tracing_argument
from turnkit._temporal.worker import add_deployment_arguments, add_validate_models_argument
from turnkit._temporal.worker_arguments import (
    add_loop_argument,
    add_observability_arguments,
    add_sandbox_argument,
    run_on_loop,
)
from turnkit.kernel.errors import ConfigError

if TYPE_CHECKING:
    from temporalio.client import Client

    from turnkit.runtime import TurnKit
    from turnkit.store.store import Store

__all__ = ["build_parser", "connection_options", "main", "open_store", "parse_since", "run_command", "temporal_client"]

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_since(value: str) -> datetime:
    """``--since``: an ISO timestamp (UTC when it has no zone) or a duration back from now (``30s``, ``15m``, ``2h``,
    ``1d``)."""
    match = _DURATION.match(value.strip())
    if match:
        return datetime.now(UTC) - timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a timestamp or a duration (30s, 15m, 2h, 1d): {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# -- connections: the one place options and environment become a Temporal client and a store -----------------------


def connection_options() -> argparse.ArgumentParser:
    """The options every verb takes (a parent parser): Temporal address and namespace, the store, the task queue."""
    parent = argparse.ArgumentParser(add_help=False)
    add_connection_arguments(parent)
    group = parent.add_argument_group("store and task queue (environment variables give the defaults)")
    group.add_argument(
        "--database-url",
        default=os.environ.get("TURNKIT_DATABASE_URL"),
        help="SQLAlchemy URL of the store (default $TURNKIT_DATABASE_URL, else SQLite under ./.turnkit/)",
    )
    group.add_argument(
        "--task-queue",
        default=os.environ.get("TURNKIT_TASK_QUEUE"),
        help="task queue of TurnKit workflows and activities (default $TURNKIT_TASK_QUEUE or 'turnkit')",
    )
    return parent


async def temporal_client(args: argparse.Namespace) -> Client:
    """A Temporal client for ``args`` with the TurnKit plugin (data converter); needs a configured address.

    Raises:
        TemporalUnreachable: No server answers there (a ``ConfigError``: ``main`` prints it as one line).
    """
    from turnkit._temporal.connection import connect_client
    from turnkit.plugin import TurnKitPlugin

    options = client_options_from_arguments(args)
    return await connect_client(options.pop("target_host"), **options, plugins=[TurnKitPlugin()])


@asynccontextmanager
async def open_store(args: argparse.Namespace, *, migrate: bool = False) -> AsyncGenerator[Store, None]:
    """The store of ``args`` (read-only verbs do not migrate it), closed on exit."""
    from turnkit.store.store import Store

    store = await Store.open(args.database_url, migrate=migrate)
    try:
        yield store
    finally:
        await store.close()


def _connect(args: argparse.Namespace) -> AbstractAsyncContextManager[TurnKit]:
    """A full TurnKit connection (Temporal client and store) for the operator verbs.

    Raises:
        ConfigError: No store is given: checking or repairing the embedded default's SQLite file against a cluster
            would report on a store that cluster never wrote (nothing is created).
    """
    from turnkit.runtime import connect

    return connect(
        temporal_address=args.address,
        namespace=args.namespace,
        profile=args.profile,
        config_file=args.config_file,
        database_url=args.database_url,
        task_queue=args.task_queue,
    )


# -- operator verbs ---------------------------------------------------------------------------------------------------


async def _reconcile(args: argparse.Namespace) -> int:
    async with _connect(args) as tk:
        pending = await tk.reconcile(repair=not args.no_repair, grace=args.grace)
    for done in pending.repairs:
        print(done)
    print(f"repaired {len(pending.repairs)}; re-signalled {len(pending)} pending deliveries")
    return 0


async def _check(args: argparse.Namespace) -> int:
    from turnkit._ops.check import summary

    async with _connect(args) as tk:
        findings = await tk.check(since=args.since, grace=args.grace)
    print(summary(findings))
    return 1 if findings else 0


async def _repair(args: argparse.Namespace) -> int:
    from turnkit._ops.check import summary

    async with _connect(args) as tk:
        done = await tk.repair(since=args.since, grace=args.grace)
        left = await tk.check(since=args.since, grace=args.grace)
    for repair in done:
        print(repair)
    print(f"repaired {len(done)}")
    print(summary(left))
    return 1 if left else 0


async def _db(args: argparse.Namespace) -> int:
    from turnkit._ops import dbadmin

    if args.action == "upgrade":
        done = await dbadmin.upgrade(args.database_url)
        print(
            f"upgraded {done.current or '(empty)'} -> {done.head}"
            if done.current != done.head
            else f"at head {done.head}"
        )
        return 0
    revisions = await dbadmin.current(args.database_url)
    state = "(head)" if revisions.up_to_date else f"(head is {revisions.head}: run `turnkit db upgrade`)"
    print(f"{revisions.current or '(not migrated)'} {state}")
    return 0 if revisions.up_to_date else 1


# -- debugger verbs ---------------------------------------------------------------------------------------------------


async def _show(args: argparse.Namespace) -> int:
    from turnkit._ops.show import render_json, render_text, ui_links
    from turnkit._ops.timeline import follow_html, render_html
    from turnkit._ops.tree import TurnNode, load_messages, load_trees
    from turnkit.kernel.errors import RecordNotFound

    def links_of(trees: list[TurnNode]) -> dict[str, str]:
        # The namespace names the UI pages: as configured (envconfig, --namespace), though show needs no cluster.
        return ui_links(trees, args.ui, client_options_from_arguments(args)["namespace"]) if args.ui else {}

    async with open_store(args) as store:
        try:
            trees = await load_trees(store, args.id)
        except RecordNotFound as err:
            print(f"turnkit show: {err}", file=sys.stderr)
            return 1
        if args.html and args.follow:  # the page follows the run (issue 38); the text below is its end
            print(f"following the run: {args.html} is rewritten until it ends", file=sys.stderr)
            trees = await follow_html(store, trees, Path(args.html), links=links_of, title=f"TurnKit run {args.id}")
        messages = await load_messages(store, trees) if args.html else {}  # the timeline's model calls and contents
    links = links_of(trees)
    if args.html:
        page = render_html(trees, links=links, title=f"TurnKit run {args.id}", messages=messages)
        Path(args.html).write_text(page, encoding="utf-8")
    print(render_json(trees, links=links) if args.json else render_text(trees, links=links))
    if args.html:
        print(f"timeline written to {args.html}", file=sys.stderr)
    return 0


async def _replay(args: argparse.Namespace) -> int:
    _import_apps(args.app)
    sdk_log = logging.getLogger("temporalio")
    level = sdk_log.level
    if not args.verbose:  # each failure is reported below; the SDK's tracebacks of failed activations are noise here
        sdk_log.setLevel(logging.CRITICAL)
    try:
        return await _replay_runs(args)
    finally:
        sdk_log.setLevel(level)


async def _replay_runs(args: argparse.Namespace) -> int:
    from turnkit._temporal.histories import Run, matching_runs, run_from_file, runs_of, tree_workflow_ids
    from turnkit._temporal.replay import replay_runs, report, turnkit_replayer

    runs: list[Run] = []
    client = None
    if args.all:
        client = await temporal_client(args)
        runs = await matching_runs(client, args.query)
    for ident in args.ids:
        path = Path(ident)
        if ident.endswith(".json") and path.is_file():
            runs.append(run_from_file(path))  # named by its workflow id, not the file's name
            continue
        client = client or await temporal_client(args)
        if ident.startswith(("turn_", "conv_")):
            async with open_store(args) as store:
                workflow_ids = await tree_workflow_ids(store, ident)
        else:
            workflow_ids = [ident]
        for workflow_id in workflow_ids:
            runs.extend(await runs_of(client, workflow_id, missing_ok=workflow_id != ident))
    if not runs:
        print("turnkit replay: no workflow runs to replay", file=sys.stderr)
        return 1
    ready = [run for run in runs if run.replayable]
    skipped = [run for run in runs if not run.replayable]
    replayer = turnkit_replayer(quiet=not args.verbose)
    return report(await replay_runs(ready, replayer=replayer, timeout=args.timeout), skipped)


async def _history(args: argparse.Namespace) -> int:
    from turnkit._temporal.histories import run_history

    client = await temporal_client(args)
    run = await run_history(client, args.id, args.run_id)
    text = run.history.to_json()
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        events = len(run.history.events)
        print(
            f"{run.workflow_type} {run.workflow_id} run {run.run_id}: {events} events -> {args.output}", file=sys.stderr
        )
    else:
        sys.stdout.write(text + "\n")
    return 0


async def _events(args: argparse.Namespace) -> int:
    from turnkit._ops.event_stream import follow, turn_events
    from turnkit.kernel.errors import RecordNotFound

    async with open_store(args) as store:
        try:
            if args.follow:
                async for event in follow(store, args.id, interval=args.interval):
                    print(json.dumps(event.to_dict()) if args.json else event.line(), flush=True)
            else:
                events, _ = await turn_events(store, args.id)
                for event in events:
                    print(json.dumps(event.to_dict()) if args.json else event.line())
        except (RecordNotFound, ValueError) as err:  # no such record; an id of neither kind
            print(f"turnkit events: {err}", file=sys.stderr)
            return 1
    return 0


async def _ask(args: argparse.Namespace) -> int:
    from turnkit._ops.ask import ask_turn
    from turnkit.agent import registered_agents, resolve_agent
    from turnkit.runtime import connect

    try:
        _import_apps(args.app)
    except ImportError as err:
        print(f"turnkit ask: cannot import the app module: {err}", file=sys.stderr)
        return 2
    try:
        agent = resolve_agent(args.agent)
    except ConfigError:
        known = ", ".join(sorted(registered_agents())) or "none"
        print(f"turnkit ask: no agent {args.agent!r} in {', '.join(args.app)} (registered: {known})", file=sys.stderr)
        return 2
    if not args.verbose:  # a failed model call or tool is reported by the turn; the SDK's tracebacks are noise here
        logging.getLogger("temporalio").setLevel(logging.CRITICAL)
    # Nothing configured: connect() starts the embedded dev server, and nobody else can be polling it.
    embedded = "target_host" not in client_options_from_arguments(args)
    try:
        async with connect(
            temporal_address=args.address,
            namespace=args.namespace,
            profile=args.profile,
            config_file=args.config_file,
            database_url=args.database_url,
            task_queue=args.task_queue,
            ui=False,
        ) as tk:
            record = await ask_turn(
                tk,
                agent,
                args.text,
                worker=args.worker,
                embedded=embedded,
                progress=None if args.quiet else sys.stderr,
                interval=args.interval,
            )
    except ConfigError as err:  # missing search attributes, a cluster that will not describe its task queue
        print(f"turnkit ask: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(record.model_dump(mode="json"), indent=2))
    elif record.status == "completed":
        print(record.output_text or "")
    if record.status != "completed":
        error = record.error or {}
        print(
            f"turn {record.id} {record.status}: {error.get('class', '')}: {error.get('message', '')}", file=sys.stderr
        )
        return 1
    return 0


async def _worker(args: argparse.Namespace) -> int:
    from turnkit._temporal import worker
    from turnkit._temporal.logs import configure_logging
    from turnkit.config import TASK_QUEUE

    configure_logging(args.log_format)
    args.task_queue = args.task_queue or TASK_QUEUE
    sys.path.insert(0, os.getcwd())  # so that --app finds the application's modules
    try:
        await worker.run(args)
    except ConfigError as error:  # missing search attributes, --only tools on a queue no tool runs on
        print(f"turnkit worker: {error}", file=sys.stderr)
        return 2
    return 0


def _import_apps(modules: list[str]) -> None:
    """Import the application modules that register agents (replay reads tool policies from the registry)."""
    sys.path.insert(0, os.getcwd())
    for module in modules:
        importlib.import_module(module)


# -- the parser -------------------------------------------------------------------------------------------------------

_NEEDS_CLUSTER = {"reconcile", "check", "repair", "history", "worker"}
_COMMANDS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "reconcile": _reconcile,
    "check": _check,
    "repair": _repair,
    "db": _db,
    "show": _show,
    "replay": _replay,
    "history": _history,
    "events": _events,
    "worker": _worker,
    "ask": _ask,
}


def build_parser() -> argparse.ArgumentParser:
    """The ``turnkit`` argument parser (every verb has ``--help``)."""
    common = connection_options()
    parser = argparse.ArgumentParser(
        prog="turnkit",
        description="TurnKit: durable AI conversations on Temporal. `turnkit VERB --help` for a verb's options.",
    )
    parser.add_argument("--version", action="version", version=f"turnkit {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="VERB")

    def verb(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=[common], help=summary, description=description)

    def grace(command: argparse.ArgumentParser) -> None:
        command.add_argument(
            "--grace", type=float, default=10.0, help="seconds before work in flight counts as lost (default 10)"
        )

    reconcile = verb("reconcile", "repair orphaned turns, re-signal pending deliveries", _RECONCILE_DOC)
    grace(reconcile)
    reconcile.add_argument("--no-repair", action="store_true", help="only re-signal pending deliveries")
    for name, summary in (
        ("check", "report every broken invariant (exit 1 when any)"),
        ("repair", "fix what check finds and can be fixed safely"),
    ):
        command = verb(name, summary, summary)
        grace(command)
        command.add_argument(
            "--since", type=parse_since, default=None, help="only records changed since (ISO time, or 30s/15m/2h/1d)"
        )

    db = verb("db", "the store's migrations: upgrade, current", "Alembic migrations of the store.")
    db.add_argument(
        "action", choices=["upgrade", "current"], help="upgrade: migrate to head; current: print the revision"
    )

    show = verb(
        "show",
        "the tree of a turn or conversation (status, duration, tokens, cost)",
        "Print the tree of turns of a run: the root turn, sub-agent turns nested under the tool call that started "
        "them, tool executions and deliveries, with status, duration, iterations, tokens and cost. Reads the store.",
    )
    show.add_argument("id", metavar="TURN_ID|CONVERSATION_ID")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    show.add_argument("--html", metavar="FILE", help="also write a self-contained HTML timeline of the tree to FILE")
    show.add_argument(
        "--follow", action="store_true", help="with --html: rewrite FILE (which reloads itself) until the run ends"
    )
    show.add_argument(
        "--ui",
        default=os.environ.get("TURNKIT_UI"),
        metavar="URL",
        help="Temporal UI address, e.g. http://localhost:8233, to link each workflow (default $TURNKIT_UI)",
    )

    replay = verb(
        "replay",
        "replay workflow histories on the current code (exit 1 on nondeterminism)",
        "Fetch the histories of a turn's tree (lane and turn workflows, every run including continued-as-new runs, "
        "sub-agent turns), of a conversation, of any workflow id, or read history JSON files, and replay them on "
        "the current code with the worker's plugin. Prints one line per run; exits 1 if any run fails to replay.",
    )
    replay.add_argument("ids", nargs="*", metavar="TURN_ID|CONVERSATION_ID|WORKFLOW_ID|FILE.json")
    replay.add_argument("--all", action="store_true", help="replay every closed workflow matching --query")
    replay.add_argument(
        "--query",
        default='WorkflowType = "TurnWorkflow" OR WorkflowType = "ConversationWorkflow"',
        help="visibility query for --all (default: every TurnKit workflow)",
    )
    replay.add_argument(
        "--app", action="append", default=[], help="module that registers the agents (repeatable), as for the worker"
    )
    replay.add_argument("--timeout", type=float, default=30.0, help="seconds allowed per replayed run (default 30)")
    replay.add_argument("--verbose", "-v", action="store_true", help="also log the SDK's tracebacks of failed runs")

    history = verb(
        "history",
        "export a workflow history as JSON (for a bug report or a regression test)",
        "Print a workflow's history as JSON (WorkflowHistory.to_json); load it with WorkflowHistory.from_json.",
    )
    history.add_argument("id", metavar="TURN_ID|WORKFLOW_ID")
    history.add_argument("--run-id", help="a specific run (default: the latest)")
    history.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of stdout")

    events = verb(
        "events",
        "a turn's or a conversation's events (and their sub-agents'), optionally as they happen",
        "Print the events of a turn, or of every turn of a conversation (oldest first), each with its sub-agents' "
        "events, derived from the store: turn started, messages, tool calls, deliveries, the end. With --follow, "
        "until the turn (every turn of the conversation) has ended.",
    )
    events.add_argument("id", metavar="TURN_ID|CONVERSATION_ID")
    events.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="keep printing new events until the turn (every turn of the conversation) ends",
    )
    events.add_argument("--interval", type=float, default=0.5, help="seconds between polls with --follow")
    events.add_argument("--json", action="store_true", help="one JSON object per line")

    ask = verb(
        "ask",
        "run one turn of an agent, print its progress and the answer",
        "Ask AGENT (registered by the --app modules) TEXT in a new conversation and wait for the turn: its progress "
        "(iterations, tool calls, sub-agent turns) goes to stderr as it happens, the answer to stdout. Exits 0 when "
        "the turn completed, 1 when it failed or was cancelled, 2 on a usage error. With nothing configured it runs "
        "on the embedded defaults (a Temporal dev server and a SQLite store under ./.turnkit/).",
    )
    ask.add_argument("agent", metavar="AGENT", help="name of a registered agent")
    ask.add_argument("text", metavar="TEXT", help="what to ask")
    ask.add_argument(
        "--app", action="append", required=True, help="module that registers the agents (repeatable), as for the worker"
    )
    ask.add_argument(
        "--worker",
        choices=["auto", "in-process", "external"],
        default="auto",
        help="who runs the turn: auto (default) runs a worker in this process on the embedded dev server or when no "
        "worker polls the task queue, else uses the workers that do; in-process; external (workers elsewhere)",
    )
    ask.add_argument("--json", action="store_true", help="print the final turn record as JSON instead of the answer")
    ask.add_argument("--quiet", "-q", action="store_true", help="no progress, only the answer (or the JSON)")
    ask.add_argument("--interval", type=float, default=0.25, help="seconds between progress polls (default 0.25)")
    ask.add_argument("--verbose", "-v", action="store_true", help="also log the SDK's warnings (failed activities)")

    demo = commands.add_parser(
        "demo",
        help="run the demo job on the embedded defaults",
        description="Run the demo job on the embedded defaults.",
    )
    demo.add_argument("--hold", action="store_true", help="keep the dev server (and its UI) up after the job")
    worker = verb(
        "worker",
        "run a worker (same as worker.py)",
        "Run a TurnKit worker until SIGTERM/SIGINT: imports the --app modules (which register agents and tools), "
        "polls the task queue, and on shutdown lets running activities finish for up to --grace seconds.",
    )
    worker.add_argument("--app", action="append", default=[], help="module that registers agents (repeatable)")
    worker.add_argument("--grace", type=float, default=30.0, help="seconds running activities get at shutdown")
    add_deployment_arguments(worker)
    add_validate_models_argument(worker)
    add_tracing_argument(worker)
    add_sandbox_argument(worker)
    add_loop_argument(worker)
    add_observability_arguments(worker)
    worker.add_argument(
        "--queue", dest="task_queue", default=argparse.SUPPRESS, metavar="NAME", help="same as --task-queue"
    )
    worker.add_argument(
        "--only",
        choices=["tools"],
        default=None,
        help="tools: register only the tool activity (no workflows, no model or store activities), for the tools "
        "whose task_queue is this queue: a worker on a GPU box (@tool(task_queue=...))",
    )
    return parser


def _version() -> str:
    """The installed package's version (its metadata, so it cannot drift from pyproject.toml)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("turnkit")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


_RECONCILE_DOC = (
    "Repair orphaned turns, then re-signal every delivery still pending in the store. Schedule it against a real "
    "cluster: TEMPORAL_ADDRESS=... TURNKIT_DATABASE_URL=... turnkit reconcile"
)


def _parse(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = build_parser()
    args = parser.parse_args(argv)
    configured = False
    if hasattr(args, "profile"):
        try:
            configured = "target_host" in client_options_from_arguments(args)
        except ConfigError as error:  # a misspelt profile or config file: a usage error, not a traceback
            parser.error(str(error))
    needs = (
        f"{args.command} needs a running cluster: set TEMPORAL_ADDRESS, a profile in Temporal's config file"
        " (TEMPORAL_PROFILE, TEMPORAL_CONFIG_FILE), or pass --address"
    )
    if args.command in _NEEDS_CLUSTER - {"worker"} and not configured:
        parser.error(needs)
    if args.command == "replay":
        if not args.ids and not args.all:
            parser.error("replay needs a TURN_ID, CONVERSATION_ID, WORKFLOW_ID or FILE.json, or --all")
        files_only = all(i.endswith(".json") and Path(i).is_file() for i in args.ids) and not args.all
        if not files_only and not configured:
            parser.error(needs)
    return parser, args


async def run_command(argv: list[str]) -> int:
    """Run one ``turnkit`` verb (not ``demo``) in the current event loop; returns its exit status.

    ``main`` runs this for the console script; tests await it in-process.
    """
    _, args = _parse(argv)
    return await _COMMANDS[args.command](args)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``turnkit`` console script."""
    _, args = _parse(argv)
    if args.command == "demo":
        from turnkit.demo import main as demo

        sys.argv = ["turnkit demo", *(["--hold"] if args.hold else [])]  # the demo parses its own arguments
        demo()  # exits the process itself
    try:
        # A worker may run on uvloop (turnkit._temporal.worker_arguments); the other commands on asyncio's loop.
        code = run_on_loop(_COMMANDS[args.command](args), args.loop if args.command == "worker" else "asyncio")
    except ConfigError as error:  # --loop uvloop without uvloop installed
        print(f"turnkit {args.command}: {error}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:  # `turnkit events … | head`: the reader left; not an error of ours
        code = 0
    exit_process(code)


if __name__ == "__main__":
    main()
