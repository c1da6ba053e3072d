"""Command-line options of a worker that both ``worker.py`` and ``turnkit worker`` take (light: no Temporal import)."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from turnkit.kernel.errors import ConfigError

__all__ = [
    "LOG_FORMATS",
    "LOOPS",
    "add_loop_argument",
    "add_observability_arguments",
    "add_sandbox_argument",
    "on_uvloop",
    "run_on_loop",
]

T = TypeVar("T")

#: The event loops a worker may run on: ``auto`` is uvloop when it is installed (``pip install 'turnkit[uvloop]'``),
#: asyncio's own loop otherwise.
LOOPS = ("auto", "uvloop", "asyncio")

#: The formats a worker's logs come in: ``text`` (Python's default) or ``json`` (one object per line, see
#: :mod:`turnkit._temporal.logs`).
LOG_FORMATS = ("text", "json")


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
        help="the event loop: uvloop spends up to ~10%% less CPU per turn; auto takes it when installed "
        "(pip install 'turnkit[uvloop]'), asyncio's loop otherwise (TURNKIT_LOOP)",
    )


def add_observability_arguments(parser: argparse.ArgumentParser) -> None:
    """Add a worker's ``--metrics-port``, ``--metrics-bind`` and ``--log-format`` (defaults from
    ``$TURNKIT_METRICS_PORT``, ``$TURNKIT_METRICS_BIND``, ``$TURNKIT_LOG_FORMAT``)."""
    group = parser.add_argument_group("Metrics and logs")
    group.add_argument(
        "--metrics-port",
        type=_port,
        default=os.environ.get("TURNKIT_METRICS_PORT") or None,  # a string default goes through _port too
        metavar="PORT",
        help="serve Prometheus metrics, the SDK's and TurnKit's, at http://BIND:PORT/metrics (TURNKIT_METRICS_PORT)",
    )
    group.add_argument(
        "--metrics-bind",
        default=os.environ.get("TURNKIT_METRICS_BIND") or None,
        metavar="HOST",
        help="the address the metrics endpoint listens on (TURNKIT_METRICS_BIND; default 0.0.0.0)",
    )
    group.add_argument(
        "--log-format",
        type=str.lower,
        choices=LOG_FORMATS,
        default=os.environ.get("TURNKIT_LOG_FORMAT") or "text",
        help="text, or json: one object per line with time, level, logger, message and the turn, conversation and "
        "workflow ids where known (TURNKIT_LOG_FORMAT)",
    )


def _port(text: str) -> int:
    if not text.strip().isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"not a port number (1 to 65535): {text!r}")
    return int(text)


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
