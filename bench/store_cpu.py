"""CPU of one turn's store work, without Temporal: ``python -m bench.store_cpu``.

A K-iteration turn with a tool call per iteration (the :mod:`bench.peers` workload) makes the store calls below, in
the transactions its activities open (``store_trips`` in :mod:`bench.cpu_profile` counts those of a real turn; each
transaction's BEGIN, sent on SQLite with its first statement, is not counted as a statement). This
script makes those calls directly on a :class:`turnkit.store.Store`, turn after turn, and reports the process CPU
(``time.process_time``) per turn: the median of ``--rounds`` rounds.

Nothing else runs in the process and no dev server shares the cores, so the figure moves by a few percent between
runs where :mod:`bench.cpu_profile` moves by 10-20%: use it to compare two builds of the store (run the script once
in each checkout, alternately). It does not replace the end-to-end benches; what it leaves out (the activities'
own code, Temporal, the workflows) is most of a turn's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Generator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from turnkit._engine.ids import new_id
from turnkit.store import Store
from turnkit.store import storable as storable_module
from turnkit.store.direct import CompiledStatement
from turnkit.store.store import Look

TOOL_RESULT = {"content": [{"type": "text", "text": "result " * 20}]}


async def turn(store: Store, k: int, looks: bool = True) -> None:
    """The store calls of one K-iteration turn in a fresh conversation, transaction by transaction (as a real turn
    makes them: ``bench.cpu_profile`` counts those). ``looks=False``: the model and tool calls' first reads apart from
    the turn lock, as before ``Look`` (for ``--compare-looks``)."""
    conversation = await store.create_conversation(agent_name="bench")  # the client: the conversation
    message_id, turn_id = new_id("message"), new_id("turn")
    async with store.atomic(conversation_id=conversation.id) as tx:  # the client: a fresh conversation's first turn
        found, any_turn = await tx.find_turn_or_any(turn_id, conversation.id)
        assert found is None and not any_turn
        await tx.load_conversation(conversation.id)
        message = await tx.append_message(conversation.id, role="user", text="question", id=message_id)
        await tx.create_turn(
            id=turn_id,
            conversation_id=conversation.id,
            agent_name="bench",
            context_message_sequence=message.sequence,
            submitted_at=datetime.now(UTC),
            found_absent=True,
            direct=True,
        )
    for iteration in range(k + 1):
        request_id = new_id("message")
        look = Look.response(turn_id, request_id) if looks else None
        async with store.atomic(turn_id=turn_id, look=look) as tx:  # turnkit.model: reserve
            current = await tx.load_turn(turn_id)
            assert await tx.find_response(turn_id, request_id) is None
            if iteration == 0:
                await tx.list_waits(turn_id=turn_id)
            await tx.tree_usage(turn_id)
            await tx.list_messages(conversation.id, through_sequence=current.context_message_sequence, turn_id=turn_id)
            state = current.options.state.model_copy(update={"iterations": iteration + 1})
            now = datetime.now(UTC)
            await tx.claim_turn(
                turn_id,
                from_=("pending", "running"),
                to="running",
                options=current.options.with_state(state),
                started_at=current.started_at or now,
                heartbeat_at=now,
            )
            await tx.load_conversation(conversation.id)
        final = iteration == k
        call_id = f"call_{iteration}"
        if looks:  # the persist also looks for executions of the calls its response proposes
            look = Look.response(turn_id, request_id, () if final else [call_id])
        async with store.atomic(turn_id=turn_id, conversation_id=conversation.id, look=look) as tx:  # model: persist
            current = await tx.load_turn(turn_id)
            assert await tx.find_response(turn_id, request_id) is None
            if not final:
                await tx.existing_call_ids(turn_id, [call_id])
            await tx.append_message_and_update_turn(  # the response and its charge (one statement on PostgreSQL)
                conversation.id,
                message={
                    "id": new_id("message"),
                    "role": "assistant",
                    "text": "answer" if final else None,
                    "content": None
                    if final
                    else [{"type": "tool_call", "id": call_id, "name": "lookup", "arguments": {}}],
                    "turn_id": turn_id,
                    "request_id": request_id,
                },
                turn_id=turn_id,
                turn_updates={"options": current.options, "usage": {"input_tokens": 10}, "cost": 0.001},
            )
            if final:
                await tx.claim_turn(turn_id, from_="running", to="completed", output_text="answer")
                break
        look = Look.execution(turn_id, call_id) if looks else None
        async with store.atomic(turn_id=turn_id, look=look) as tx:  # the tool: reserve
            await tx.load_turn(turn_id)
            assert await tx.find_tool_execution(turn_id, call_id) is None
            await tx.latest_response(turn_id)
            await tx.tree_usage(turn_id)
            execution, _ = await tx.create_tool_execution(
                turn_id=turn_id, tool_call_id=call_id, tool_name="lookup", status="running", found_absent=True
            )
        async with store.atomic(turn_id=turn_id, conversation_id=conversation.id) as tx:  # the tool: complete
            await tx.load_turn(turn_id)
            await tx.complete_tool_execution(  # the result and its message (one statement on PostgreSQL)
                execution,
                conversation_id=conversation.id,
                result=TOOL_RESULT,
                completed_at=datetime.now(UTC),
                result_message=lambda _: ([TOOL_RESULT], {}),
            )
    async with store.reads() as tx:  # the turn's end: its completion callback and its waiters
        await tx.find_delivery(f"completion:{turn_id}")
        await tx.list_waits(target_turn_id=turn_id)
    await store.load_turn(turn_id)  # the client: the answer


async def compare_direct(args: argparse.Namespace) -> None:
    """Rounds alternated between a store that runs its prebuilt statements on the driver itself and one that runs them
    through SQLAlchemy's execution path (``turnkit/store/direct.py``), on one database, in this one process."""
    with tempfile.TemporaryDirectory(prefix="turnkit-store-cpu-") as tmp:
        url = args.database_url or f"sqlite+aiosqlite:///{Path(tmp) / 'store.db'}"
        stores = {"SQLAlchemy": await Store.open(url, direct=False), "direct": await Store.open(url, migrate=False)}
        cpu: dict[str, list[float]] = {name: [] for name in stores}
        wall: dict[str, list[float]] = {name: [] for name in stores}
        try:
            for store in stores.values():
                for _ in range(args.warmup):
                    await turn(store, args.k)
            for _ in range(args.rounds):
                for name, store in stores.items():
                    started, started_wall = time.process_time(), time.perf_counter()
                    for _ in range(args.turns):
                        await turn(store, args.k)
                    cpu[name].append((time.process_time() - started) / args.turns * 1000)
                    wall[name].append((time.perf_counter() - started_wall) / args.turns * 1000)
        finally:
            for store in stores.values():
                await store.close()
    ratios = [d / s for d, s in zip(cpu["direct"], cpu["SQLAlchemy"], strict=True)]
    wall_ratios = [d / s for d, s in zip(wall["direct"], wall["SQLAlchemy"], strict=True)]
    dialect = stores["direct"].dialect
    print(f"store work of a K = {args.k} turn ({dialect}, {args.rounds} alternated rounds of {args.turns}, medians):")
    for name in stores:
        cpu_ms, wall_ms = statistics.median(cpu[name]), statistics.median(wall[name])
        print(f"  {name:>10}: {cpu_ms:.2f} ms of CPU, {wall_ms:.2f} ms of wall")
    print(
        f"  direct / SQLAlchemy: CPU {statistics.median(ratios):.2f}x, wall {statistics.median(wall_ratios):.2f}x "
        "(median of the rounds' ratios)"
    )


async def _alternated(
    args: argparse.Namespace, turns: Callable[[Store, bool, int], Awaitable[None]]
) -> tuple[str, dict[bool, list[float]], dict[bool, list[float]]]:
    """``turns(store, kind, n)`` for kind False then True, alternated round by round on one store in this one
    process (after ``args.warmup`` turns of each): the store's dialect, and the CPU and wall ms per turn of each
    round, by kind."""
    with tempfile.TemporaryDirectory(prefix="turnkit-store-cpu-") as tmp:
        url = args.database_url or f"sqlite+aiosqlite:///{Path(tmp) / 'store.db'}"
        store = await Store.open(url)
        cpu: dict[bool, list[float]] = {True: [], False: []}
        wall: dict[bool, list[float]] = {True: [], False: []}
        try:
            for kind in (False, True):
                await turns(store, kind, args.warmup)
            for _ in range(args.rounds):
                for kind in (False, True):
                    started, started_wall = time.process_time(), time.perf_counter()
                    await turns(store, kind, args.turns)
                    cpu[kind].append((time.process_time() - started) / args.turns * 1000)
                    wall[kind].append((time.perf_counter() - started_wall) / args.turns * 1000)
        finally:
            await store.close()
    return store.dialect, cpu, wall


async def compare_looks(args: argparse.Namespace) -> None:
    """Rounds alternated between turns whose model and tool calls read what they look for with the turn's lock
    (``Look``) and turns that read it apart, as before, on one store in this one process."""

    async def turns(store: Store, looks: bool, n: int) -> None:
        for _ in range(n):
            await turn(store, args.k, looks)

    dialect, cpu, wall = await _alternated(args, turns)
    print(f"store work of a K = {args.k} turn ({dialect}, {args.rounds} alternated rounds of {args.turns}, medians):")
    for looks, name in ((False, "reads apart"), (True, "with the lock")):
        print(
            f"  {name:>13}: {statistics.median(cpu[looks]):.2f} ms of CPU,"
            f" {statistics.median(wall[looks]):.2f} ms of wall"
        )
    cpu_ratio = statistics.median(n / o for n, o in zip(cpu[True], cpu[False], strict=True))
    wall_ratio = statistics.median(n / o for n, o in zip(wall[True], wall[False], strict=True))
    print(f"  with the lock / apart: CPU {cpu_ratio:.2f}x, wall {wall_ratio:.2f}x (median of the rounds' ratios)")


@contextlib.contextmanager
def as_before_plans(before: bool) -> Generator[None]:
    """With ``before``: each prebuilt statement's arguments built by SQLAlchemy's ``construct_params`` at each
    execution, and every JSON value copied through the JSON text, as before the plans and the walked copies
    (``turnkit/store/direct.py``, ``turnkit/store/storable.py``); else this build as it is."""
    if not before:
        yield
        return

    def never(_value: Any, _budget: list[int]) -> Any:
        raise storable_module._NotPlain  # pyright: ignore[reportPrivateUsage]

    planned, walked = CompiledStatement.arguments, storable_module._plain_copy  # pyright: ignore[reportPrivateUsage]
    CompiledStatement.arguments = CompiledStatement._constructed  # pyright: ignore[reportPrivateUsage]
    storable_module._plain_copy = never  # pyright: ignore[reportPrivateUsage]
    try:
        yield
    finally:
        CompiledStatement.arguments = planned
        storable_module._plain_copy = walked  # pyright: ignore[reportPrivateUsage]


async def compare_plans(args: argparse.Namespace) -> None:
    """Rounds alternated between this build's arguments and copies (a plan per statement, small values walked) and
    the way before them (:func:`as_before_plans`), on one store in this one process."""

    async def turns(store: Store, now: bool, n: int) -> None:
        with as_before_plans(not now):
            for _ in range(n):
                await turn(store, args.k)

    dialect, cpu, _ = await _alternated(args, turns)
    ratios = [now / was for now, was in zip(cpu[True], cpu[False], strict=True)]
    print(f"store work of a K = {args.k} turn ({dialect}, {args.rounds} alternated rounds of {args.turns}):")
    print(f"  before the plans: {statistics.median(cpu[False]):.2f} ms of CPU (median)")
    print(f"  this build:       {statistics.median(cpu[True]):.2f} ms of CPU (median)")
    print(
        f"  this build / before: {statistics.median(ratios):.3f}x (median of the rounds' ratios; rounds "
        f"{', '.join(f'{r:.2f}' for r in ratios)})"
    )


async def main(args: argparse.Namespace) -> None:
    if args.compare_direct:
        await compare_direct(args)
        return
    if args.compare_looks:
        await compare_looks(args)
        return
    if args.compare_plans:
        await compare_plans(args)
        return
    with tempfile.TemporaryDirectory(prefix="turnkit-store-cpu-") as tmp:
        url = args.database_url or f"sqlite+aiosqlite:///{Path(tmp) / 'store.db'}"
        store = await Store.open(url, sqlite_inline=not args.no_inline)
        try:
            for _ in range(args.warmup):
                await turn(store, args.k)
            per_turn = []
            for _ in range(args.rounds):
                started = time.process_time()
                for _ in range(args.turns):
                    await turn(store, args.k)
                per_turn.append((time.process_time() - started) / args.turns * 1000)
        finally:
            await store.close()
    print(
        f"store work of a K = {args.k} turn ({store.dialect}, pid {os.getpid()}): "
        f"{statistics.median(per_turn):.2f} ms of CPU (median of {args.rounds} rounds of {args.turns}; "
        f"rounds {', '.join(f'{x:.2f}' for x in per_turn)})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--k", type=int, default=1, help="tool-calling iterations per turn (default 1)")
    parser.add_argument("--turns", type=int, default=100, help="turns per round (default 100)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=20, help="turns before the rounds (default 20)")
    parser.add_argument("--database-url", help="the store (default: a temporary SQLite file)")
    parser.add_argument(
        "--no-inline",
        action="store_true",
        help="SQLite: each statement on the connection's thread, not on the event loop's"
        " (Store.open(url, sqlite_inline=False), turnkit/store/sqlite_trips.py)",
    )
    parser.add_argument(
        "--compare-direct",
        action="store_true",
        help="alternate rounds with and without the store's direct path (turnkit/store/direct.py)",
    )
    parser.add_argument(
        "--compare-looks",
        action="store_true",
        help="alternate rounds whose first reads come with the turn lock (Look) and rounds that read them apart"
        " (PostgreSQL only: SQLite reads apart in both)",
    )
    parser.add_argument(
        "--compare-plans",
        action="store_true",
        help="alternate rounds of this build and rounds with the arguments and copies made as before their plans"
        " (construct_params per execution, every JSON value through its text)",
    )
    asyncio.run(main(parser.parse_args()))
