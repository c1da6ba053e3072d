"""Ending a short-lived TurnKit process without tripping over the Temporal client's native threads.

The Temporal SDK runs its gRPC client on a Rust (Tokio) runtime whose threads outlive the asyncio loop. When the
interpreter finalizes while one of them still holds a Python object, CPython aborts with "PyGILState_Release: thread
state ... must be current when releasing" (temporalio/sdk-python#300) and the process exits with SIGABRT although
its work is done. Commands therefore flush their output and leave with ``os._exit`` once everything they own is
closed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn

__all__ = ["exit_process"]


def exit_process(code: int = 0) -> NoReturn:
    """Flush stdout, stderr and logging, then end the process with ``code`` and no interpreter teardown."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        # A closed or broken pipe must not turn success into failure.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
