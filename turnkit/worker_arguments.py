"""Command-line options of a worker that both ``worker.py`` and ``turnkit worker`` take (light: no Temporal import)."""

from __future__ import annotations

import argparse
import os

__all__ = ["add_sandbox_argument"]


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
