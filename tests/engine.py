"""Test helpers shared by the engine tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from turnkit.payloads import LaneStatus
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


async def lane_buffers(tk: TurnKit, conversation_id: str, delivery_id: str) -> bool:
    """Whether the conversation's lane holds ``delivery_id`` for later (it arrived while a turn was busy)."""
    status = await tk.client.get_workflow_handle(conversation_id).query("status", result_type=LaneStatus)
    return delivery_id in status.pending_delivery_ids


def held_tool(name: str = "hold") -> tuple[asyncio.Event, Tool]:
    """A tool that blocks until the returned event is set: keeps a turn busy for as long as a test needs."""
    release = asyncio.Event()

    async def body() -> dict[str, Any]:
        await release.wait()
        return {}

    body.__name__ = name
    body.__doc__ = "Wait until released."
    return release, tool(body)
