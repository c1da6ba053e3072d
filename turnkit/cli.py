"""The ``turnkit`` command: ``turnkit check``, ``turnkit repair``, ``turnkit reconcile``, ``turnkit demo``,
``turnkit worker``.

* ``turnkit check`` reads the store and Temporal and prints every broken invariant of spec §5.13 (one line each:
  kind, ids, what is wrong); it exits 1 when anything is wrong, 0 when all is well.
* ``turnkit repair`` fixes what ``check`` finds and can be fixed safely, prints what it did and what is left, and
  exits 1 when something is left.
* ``turnkit reconcile`` runs the repair sweep, then re-signals every delivery still pending in the store, so a
  signal lost between a delivery's commit and its wake-up is repaired. Schedule it (cron, a Temporal schedule)
  against a real cluster: ``TEMPORAL_ADDRESS=… TURNKIT_DATABASE_URL=… turnkit reconcile``.

Every verb reads the Temporal connection from Temporal's envconfig (``TEMPORAL_*`` variables, the config file's
profile; see :mod:`turnkit.connection`); ``--address``, ``--namespace``, ``--profile`` and ``--config-file`` win.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from turnkit.connection import add_connection_arguments, client_options_from_arguments
from turnkit.errors import ConfigError
from turnkit.process import exit_process

__all__ = ["main", "parse_since"]

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


async def _reconcile(args: argparse.Namespace) -> int:
    from turnkit.runtime import connect

    async with connect(**_connect_arguments(args)) as tk:
        pending = await tk.reconcile(repair=not args.no_repair, grace=args.grace)
    for done in pending.repairs:
        print(done)
    print(f"repaired {len(pending.repairs)}; re-signalled {len(pending)} pending deliveries")
    return 0


async def _check(args: argparse.Namespace) -> int:
    from turnkit.check import summary
    from turnkit.runtime import connect

    async with connect(**_connect_arguments(args)) as tk:
        findings = await tk.check(since=args.since, grace=args.grace)
    print(summary(findings))
    return 1 if findings else 0


async def _repair(args: argparse.Namespace) -> int:
    from turnkit.check import summary
    from turnkit.runtime import connect

    async with connect(**_connect_arguments(args)) as tk:
        done = await tk.repair(since=args.since, grace=args.grace)
        left = await tk.check(since=args.since, grace=args.grace)
    for repair in done:
        print(repair)
    print(f"repaired {len(done)}")
    print(summary(left))
    return 1 if left else 0


def _connect_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """``turnkit.connect()``'s arguments from a verb's options (the connection ones resolved through envconfig)."""
    return {
        "temporal_address": args.address,
        "namespace": args.namespace,
        "profile": args.profile,
        "config_file": args.config_file,
        "database_url": args.database_url,
        "task_queue": args.task_queue,
    }


def _cluster_options(command: argparse.ArgumentParser, *, window: bool) -> None:
    add_connection_arguments(command)
    command.add_argument("--database-url", default=os.environ.get("TURNKIT_DATABASE_URL"))
    command.add_argument("--task-queue", default=os.environ.get("TURNKIT_TASK_QUEUE"))
    command.add_argument(
        "--grace", type=float, default=10.0, help="seconds before work in flight counts as lost (default 10)"
    )
    if window:
        command.add_argument(
            "--since", type=parse_since, default=None, help="only records changed since (ISO time, or 30s/15m/2h/1d)"
        )


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``turnkit`` console script."""
    parser = argparse.ArgumentParser(prog="turnkit", description="TurnKit: durable AI conversations on Temporal.")
    commands = parser.add_subparsers(dest="command", required=True)
    reconcile = commands.add_parser("reconcile", help="repair orphaned turns, re-signal pending deliveries")
    _cluster_options(reconcile, window=False)
    reconcile.add_argument("--no-repair", action="store_true", help="only re-signal pending deliveries")
    check = commands.add_parser("check", help="report every broken invariant (exit 1 when any)")
    _cluster_options(check, window=True)
    repair = commands.add_parser("repair", help="fix what check finds and can be fixed safely")
    _cluster_options(repair, window=True)
    commands.add_parser("demo", help="run the demo job on the embedded defaults")
    commands.add_parser("worker", help="run a worker (same options as worker.py)", add_help=False)
    args, rest = parser.parse_known_args(argv)
    commands_of = {"reconcile": _reconcile, "check": _check, "repair": _repair}
    if args.command in commands_of:
        try:
            configured = "target_host" in client_options_from_arguments(args)
        except ConfigError as error:
            parser.error(str(error))
        if not configured:
            parser.error(
                f"{args.command} needs a running cluster: set TEMPORAL_ADDRESS, a profile in Temporal's config file"
                " (TEMPORAL_PROFILE, TEMPORAL_CONFIG_FILE), or pass --address"
            )
        exit_process(asyncio.run(commands_of[args.command](args)))
    if args.command == "demo":
        from turnkit.demo import main as demo

        demo()  # exits the process itself
    import worker

    worker.main(rest)


if __name__ == "__main__":
    main()
