"""A client process that makes one request and is killed in the middle of it by a test (``tests/test_controls.py``,
``tests/test_compaction.py``, ``tests/test_media.py``): ``python -m tests.request_client REQUEST TARGET``.

It connects to the test's dev server and database (no worker: the test's own process runs that), prints
``connected``, waits for a line on its standard input (the test's go), makes the request (``cancel`` a turn with its
descendants, ``compact`` a conversation, ``paint`` or ``view_media`` a prepared turn with its agent's client) and
prints ``done``. The test sends SIGKILL while the request is being carried out, and shows what is left: all of it
or none of it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from temporalio.client import Client

from turnkit._temporal.process import exit_process
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit
from turnkit.store import Store

if TYPE_CHECKING:
    from tests.engine import Engine

ROOT = Path(__file__).resolve().parent.parent


async def _request(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="tests.request_client")
    parser.add_argument("--address", required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--key")
    parser.add_argument("--media")
    parser.add_argument("request", choices=["cancel", "compact", "paint", "view_media"])
    parser.add_argument("target", help="the turn id, or the conversation id for compact")
    args = parser.parse_args(argv)
    store = await Store.open(args.database_url)
    client = await Client.connect(args.address, plugins=[TurnKitPlugin(store)])
    tk = TurnKit(client, store, task_queue=args.task_queue)
    print("connected", flush=True)
    sys.stdin.readline()  # the test's go: it times its kill from here
    if args.request == "cancel":
        await tk.turn(args.target).cancel(descendants="cascade")
    elif args.request == "compact":
        await (await tk.load_conversation(args.target)).compact(key=args.key)
    elif args.request == "paint":
        await tk.turn(args.target).paint("a cat", model="scripted-image")
    else:
        await tk.turn(args.target).view_media(args.media, objective="what is it?")
    print("done", flush=True)


async def start_client(engine: Engine, request: str, target: str, *extra: str) -> asyncio.subprocess.Process:
    """Start this module as a process on ``engine``'s server, database and task queue; returns once it is connected
    and has been told to go (it makes its request right after)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.request_client",
        "--address",
        engine.temporal_address,
        "--database-url",
        engine.database_url,
        "--task-queue",
        engine.tk.task_queue,
        *extra,
        request,
        target,
        cwd=str(ROOT),
        env={**os.environ, "TURNKIT_LOG_LEVEL": "WARNING"},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    async with asyncio.timeout(60):
        line = await process.stdout.readline()
    if line.strip() != b"connected":
        raise RuntimeError(f"request client exited before it connected (code {await process.wait()})")
    process.stdin.write(b"go\n")
    await process.stdin.drain()
    return process


if __name__ == "__main__":
    asyncio.run(_request(sys.argv[1:]))
    exit_process(0)
