"""Turns that call an MCP server's tools, its connections kept or not: ``python -m bench.mcp_calls``.

A stdio MCP server is a process: opening a connection starts it and runs the MCP handshake, and a worker that opens
one per listing and call pays that for every request. This bench runs turns whose model calls K tools of a stdio
server (:mod:`bench.mcp_echo_server`, one ``echo`` tool, at most once) through TurnKit on a dev server, with the
worker in this process. Two agents take turns, each in a fresh conversation, one after the other:

* ``kept``: ``MCPServer.stdio(...)`` as defined by default, its connections kept for ``keep_alive`` (300 s);
* ``each``: the same server with ``keep_alive=0``, a connection (a process) for every listing and call.

It prints each agent's median wall time per turn, this process's median CPU per turn (client, worker, store; the
server processes' own CPU is not in it) and the server processes started per turn, and kept ÷ each. The store is a
temporary SQLite file, or the PostgreSQL database ``--postgres`` names.

Before the turns, it times single calls outside Temporal (``MCPServer.call_tool``, alternated): on a kept connection
at most once (the server is asked for its tool list before the call goes out), on a kept connection replay-safe (sent
as it is), and on a connection of its own; the first two differ by what that question costs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import turnkit
from bench.single_server import add_server_options, git_commit, start_dev_server, store
from bench.turn_latency import turnkit_engine
from turnkit._temporal.process import exit_process
from turnkit.model import ModelRequest, Result
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, call_tools

__all__ = ["KINDS", "agents", "run_turns", "time_calls"]

SERVER = Path(__file__).with_name("mcp_echo_server.py")
#: The agents' names, and each one's ``keep_alive`` (None: the stdio server's default).
KINDS: dict[str, float | None] = {"kept": None, "each": 0.0}


def scripted(request: ModelRequest) -> Result:
    """Call ``echo`` K times, one call per response (K is the user message), then answer."""
    at = max(i for i, m in enumerate(request.messages) if m.get("role") == "user")
    k = int(str(request.messages[at].get("content")))
    done = sum(1 for m in request.messages[at:] if m.get("role") == "tool")
    if done < k:
        return call_tools(("echo", {"text": f"call {done}"}))
    return Result.build(text=f"{k} calls")


def agents(starts: Path) -> dict[str, turnkit.Agent]:
    """The two agents, by kind, on a server whose processes note their start in ``starts``."""
    made: dict[str, turnkit.Agent] = {}
    for kind, keep_alive in KINDS.items():
        options = {} if keep_alive is None else {"keep_alive": keep_alive}
        made[kind] = turnkit.register(
            turnkit.Agent(
                f"bench_mcp_{kind}",
                model="scripted",
                mcp_servers=[_server(starts, **options)],
                client=ScriptedClient(scripted, record=False),
                compaction=False,
            )
        )
    return made


def _server(starts: Path, **options: Any) -> turnkit.MCPServer:
    return turnkit.MCPServer.stdio(
        "echo", sys.executable, [str(SERVER)], env={"TURNKIT_BENCH_MCP_STARTS": str(starts)}, **options
    )


async def time_calls(calls: int, starts: Path) -> dict[str, list[float]]:
    """``calls`` calls of each kind (see the module docstring), taken in turn: each one's wall time (seconds)."""
    servers = {
        "kept, at most once": _server(starts),
        "kept, replay-safe": _server(starts, recovery="replay_safe"),
        "a connection each": _server(starts, keep_alive=0),
    }
    taken: dict[str, list[float]] = {kind: [] for kind in servers}
    try:
        for kind, server in servers.items():  # each kept one's process started before the timing
            await server.call_tool("echo", {"text": "warm"}, idempotency_key=f"warm {kind}")
        for i in range(calls):
            for kind, server in servers.items():
                started = time.perf_counter()
                await server.call_tool("echo", {"text": str(i)}, idempotency_key=f"{kind} {i}")
                taken[kind].append(time.perf_counter() - started)
    finally:
        for server in servers.values():
            await server.aclose()
    return taken


async def run_turns(
    tk: TurnKit, made: dict[str, turnkit.Agent], k: int, turns: int, starts: Path
) -> dict[str, list[tuple[float, float, int]]]:
    """``turns`` turns of each agent, taken in turn (which goes first alternates): each turn's wall time, this
    process's CPU (seconds) and the server processes it started."""
    taken: dict[str, list[tuple[float, float, int]]] = {kind: [] for kind in made}
    for i in range(turns):
        order = list(made.items()) if i % 2 == 0 else list(reversed(made.items()))
        for kind, agent in order:
            conversation = await tk.conversation(agent)
            before = len(starts.read_text().split()) if starts.exists() else 0
            wall, cpu = time.perf_counter(), time.process_time()
            turn = await conversation.ask(str(k))
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if turn.status != "completed" or turn.output_text != f"{k} calls":
                raise RuntimeError(f"turn {turn.id} ended {turn.status}: {turn.error or turn.output_text}")
            taken[kind].append((wall, cpu, len(starts.read_text().split()) - before))
    return taken


async def main(args: argparse.Namespace) -> None:
    load_start = os.getloadavg()
    env = await start_dev_server(args.server)
    try:
        address = env.client.service_client.config.target_host
        with tempfile.TemporaryDirectory(prefix="turnkit-bench-mcp-") as tmp, store(args.postgres) as (name, url):
            starts = Path(tmp) / "starts"
            print(f"  {args.calls} single calls of each kind …", file=sys.stderr, flush=True)
            single = await time_calls(args.calls, starts)
            made = agents(starts)
            async with turnkit_engine(address, url) as tk:
                print(f"  {name}: K = {args.k}, {args.turns} turns of each …", file=sys.stderr, flush=True)
                await run_turns(tk, made, args.k, args.warmup, starts)
                taken = await run_turns(tk, made, args.k, args.turns, starts)
    finally:
        await env.shutdown()
    load_end = os.getloadavg()
    print(
        f"TurnKit turns calling a stdio MCP server · {datetime.now(UTC):%Y-%m-%d %H:%M} UTC · git {git_commit()} · "
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores"
    )
    print(
        f"store {name} · dev server: {args.server} settings · K = {args.k} calls per turn · {args.turns} turns each · "
        f"load average at start {load_start[0]:.2f}, at end {load_end[0]:.2f}"
    )
    for kind, times in single.items():
        print(f"  one call, {kind:<19} {statistics.median(times) * 1000:8.2f} ms (median of {len(times)})")
    medians: dict[str, tuple[float, float]] = {}
    for kind, rows in taken.items():
        wall = statistics.median(r[0] for r in rows) * 1000
        cpu = statistics.median(r[1] for r in rows) * 1000
        medians[kind] = (wall, cpu)
        per_turn = statistics.fmean(r[2] for r in rows)
        print(f"  {kind:<5} wall {wall:8.1f} ms   process CPU {cpu:7.1f} ms   server processes started {per_turn:.2f}")
    (kept_wall, kept_cpu), (each_wall, each_cpu) = medians["kept"], medians["each"]
    print(f"  kept / each: wall {kept_wall / each_wall:.3f}x, process CPU {kept_cpu / each_cpu:.3f}x (medians)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--k", type=int, default=3, help="MCP tool calls per turn (default 3)")
    parser.add_argument("--turns", type=int, default=20, help="turns of each agent (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="turns of each agent before the measured ones")
    parser.add_argument("--calls", type=int, default=30, help="single calls of each kind (default 30)")
    add_server_options(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
    exit_process()  # the Temporal client's native threads can abort a finalizing interpreter (_temporal/process.py)
