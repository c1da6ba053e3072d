"""Command-line options of a worker that both ``worker.py`` and ``turnkit worker`` take (light: no Temporal import)."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from turnkit.kernel.errors import ConfigError

__all__ = ["LOOPS", "add_loop_argument", "add_sandbox_argument", "on_uvloop", "run_on_loop"]

T = TypeVar("T")

#: The event loops a worker may run on: ``auto`` is uvloop when it is installed (``pip install 'turnkit[uvloop]'``),
#: asyncio's own loop otherwise.
LOOPS = ("auto", "uvloop", "asyncio")


def add_sandbox_argument(parser: argparse.ArgumentParser) -> None:
    """Add a worker's ``--no-sandbox`` (default from ``$TURNKIT_SANDBOX``: ``0``, ``false`` or ``no`` turn it off)."""
    parser.add_argument(
        "--no-sandbox",
        dest="sandbox",
        action="store_false",
        default=os.environ.get("TURNKIT_SANDBOX", "").lower() not in ("0", "false", "no"),
        help="run the workflows without Temporal's sandbox: less CPU per turn; their code is TurnKit's, which CI "
        "replays under the strict sandbox (TURNKIT_SANDBOX=0)",
    )


def add_loop_argument(parser: argparse.ArgumentParser) -> None:
    """Add a worker's ``--loop`` (default from ``$TURNKIT_LOOP``, else ``auto``)."""
    parser.add_argument(
        "--loop",
        choices=LOOPS,
        default=os.environ.get("TURNKIT_LOOP", "auto").lower() or "auto",
        help="the event loop: uvloop spends ~10%% less CPU per turn; auto takes it when installed "
        "(pip install 'turnkit[uvloop]'), asyncio's loop otherwise (TURNKIT_LOOP)",
    )


def run_on_loop(main: Coroutine[Any, Any, T], requested: str) -> T:
    """Run ``main`` to completion, as :func:`asyncio.run` does, on the loop ``requested`` (one of :data:`LOOPS`).

    Raises:
        ConfigError: ``uvloop`` was asked for and is not installed, or ``requested`` is no loop TurnKit knows (a
            ``TURNKIT_LOOP`` that argparse's choices did not check). ``main`` is closed unrun.
    """
    runner: Callable[[Coroutine[Any, Any, T]], T] = asyncio.run
    try:
        if requested not in LOOPS:
            choices = ", ".join(LOOPS)
            raise ConfigError(f"unknown event loop {requested!r}: choose one of {choices} (--loop, TURNKIT_LOOP)")
        if requested != "asyncio":
            try:
                import uvloop
            except ImportError:
                if requested == "uvloop":
                    raise ConfigError("--loop uvloop needs uvloop: pip install 'turnkit[uvloop]'") from None
            else:
                runner = uvloop.run
    except ConfigError:
        main.close()  # never awaited: no "coroutine was never awaited" warning
        raise
    return runner(main)


def on_uvloop() -> bool:
    """Whether the running event loop is uvloop's (for a worker's ready line)."""
    return type(asyncio.get_running_loop()).__module__.startswith("uvloop")
