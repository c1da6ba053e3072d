"""Test helpers shared by the engine tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from turnkit.runtime import TurnKit
from turnkit.tools import Tool, tool


@dataclass
class Engine:
    """A TurnKit connection plus what a worker process needs to join it."""

    tk: TurnKit
    database_url: str
    temporal_address: str


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout: float = 30.0, what: str = "condition") -> None:
    """Wait until ``check()`` is true, polling; fail with ``what`` after ``timeout`` seconds (no fixed sleeps)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.01
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.25)


def held_tool(name: str = "hold") -> tuple[asyncio.Event, Tool]:
    """A tool that blocks until the returned event is set: keeps a turn busy for as long as a test needs."""
    release = asyncio.Event()

    async def body() -> dict[str, Any]:
        await release.wait()
        return {}

    body.__name__ = name
    body.__doc__ = "Wait until released."
    return release, tool(body)
