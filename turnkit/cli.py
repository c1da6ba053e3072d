"""The ``turnkit`` command: ``turnkit reconcile``, ``turnkit demo``, ``turnkit worker``.

``turnkit reconcile`` re-signals every delivery still pending in the store, so a signal lost between a delivery's
commit and its wake-up is repaired. Schedule it (cron, a Temporal schedule) against a real cluster:
``TEMPORAL_ADDRESS=… TURNKIT_DATABASE_URL=… turnkit reconcile``.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from turnkit.process import exit_process

__all__ = ["main"]


async def _reconcile(args: argparse.Namespace) -> int:
    from turnkit.runtime import connect

    async with connect(temporal_address=args.address, database_url=args.database_url, task_queue=args.task_queue) as tk:
        pending = await tk.reconcile()
    print(f"re-signalled {len(pending)} pending deliveries")
    return 0


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``turnkit`` console script."""
    parser = argparse.ArgumentParser(prog="turnkit", description="TurnKit: durable AI conversations on Temporal.")
    commands = parser.add_subparsers(dest="command", required=True)
    reconcile = commands.add_parser("reconcile", help="re-signal deliveries still pending in the store")
    reconcile.add_argument("--address", default=os.environ.get("TEMPORAL_ADDRESS"))
    reconcile.add_argument("--database-url", default=os.environ.get("TURNKIT_DATABASE_URL"))
    reconcile.add_argument("--task-queue", default=os.environ.get("TURNKIT_TASK_QUEUE"))
    commands.add_parser("demo", help="run the demo job on the embedded defaults")
    commands.add_parser("worker", help="run a worker (same options as worker.py)", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "reconcile":
        if not args.address:
            parser.error("reconcile needs a running cluster: set TEMPORAL_ADDRESS or pass --address")
        exit_process(asyncio.run(_reconcile(args)))
    if args.command == "demo":
        from turnkit.demo import main as demo

        demo()  # exits the process itself
    import worker

    worker.main(rest)


if __name__ == "__main__":
    main()
