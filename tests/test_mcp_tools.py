"""MCP servers as tool sets of an agent (``Agent(mcp_servers=[...])``).

Against a real MCP server: ``tests/mcp_server.py``, built with the MCP SDK's own server, which TurnKit's worker starts
over stdio, or which the test starts over streamable HTTP on a free local port. Its calls and its state are files in
the test's own directory. The agent's model is scripted.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import turnkit
from tests.engine import Engine, eventually
from turnkit._engine.mcp_tools import mcp_call_policy
from turnkit._temporal.replay import turnkit_replayer
from turnkit.kernel.records import INTERRUPTED_MESSAGE
from turnkit.mcp import MCPServer
from turnkit.model import ModelRequest, Result
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, call_tools

ROOT = Path(__file__).resolve().parent.parent
SERVER = Path(__file__).with_name("mcp_server.py")


def calls(state: Path, tool: str) -> list[dict[str, Any]]:
    """The calls the server received of ``tool``."""
    path = state / f"{tool}.calls"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def stdio_server(state: Path, **options: Any) -> MCPServer:
    """The test server over stdio: the worker starts its process and keeps it for later listings and calls."""
    return MCPServer.stdio("calc", sys.executable, [str(SERVER)], env={"TURNKIT_MCP_STATE": str(state)}, **options)


def starts(state: Path) -> list[int]:
    """The pids of the server processes started so far, oldest first."""
    path = state / "starts"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a process that ended and was not reaped yet does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


async def ended(pid: int) -> bool:
    """Whether process ``pid`` no longer runs (for :func:`eventually`)."""
    return not alive(pid)


def tool_names(request: ModelRequest) -> list[str]:
    return [spec.name for spec in request.tools]


def answer_with_last_result(request: ModelRequest) -> Result:
    """The final answer: the text of the tool result the model received last."""
    return Result.build(text=str(request.messages[-1]["content"]))


@pytest_asyncio.fixture
async def http_port(tmp_path: Path) -> AsyncIterator[int]:
    """The test server over streamable HTTP, on a free local port, for as long as the test runs."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    log = (tmp_path / "http-server.log").open("w")
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)],
        env={**os.environ, "TURNKIT_MCP_STATE": str(tmp_path)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    async def listening() -> bool:
        assert process.poll() is None, (tmp_path / "http-server.log").read_text()
        with socket.socket() as client:
            return client.connect_ex(("127.0.0.1", port)) == 0

    try:
        await eventually(listening, what="the MCP server listening")
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


async def test_a_stdio_servers_tools_are_called_and_the_list_a_turn_saw_is_kept(tk: TurnKit, tmp_path: Path) -> None:
    """The turn's first model call lists the server's tools (names made valid and prefixed) and records them in the
    turn; the model's call runs on the server and completes with its structured result. The server starts listing a
    new tool in the middle of the turn: the turn's later model call still offers the recorded list, and replaying
    its history needs no server; the conversation's next turn lists again and sees the new tool."""

    def add_then_grow(request: ModelRequest) -> Result:
        (tmp_path / "extra").touch()  # from now on a new server process also lists `extra`
        return call_tools(("calc_add", {"a": 2, "b": 3}))

    client = ScriptedClient([add_then_grow, answer_with_last_result, "second turn"])
    server = stdio_server(tmp_path, prefix="calc_")
    agent = turnkit.Agent("mathematician", model="scripted", mcp_servers=[server], client=client)
    conversation = await tk.conversation(agent)

    turn = await conversation.ask("what is 2 + 3?")

    assert turn.status == "completed", turn.error
    listed = ["calc_add", "calc_flaky", "calc_vanish_now"]
    assert tool_names(client.requests[0]) == listed
    assert tool_names(client.requests[1]) == listed  # the list the turn saw, not the server's new one
    recorded = turn.record.state.mcp_tools["calc"]
    assert [(entry["name"], entry["tool"]) for entry in recorded] == [
        ("calc_add", "add"),
        ("calc_flaky", "flaky"),
        ("calc_vanish_now", "vanish-now"),
    ]
    assert recorded[0]["parameters"]["required"] == ["a", "b"]
    [execution] = await turn.tool_executions()
    assert (execution.tool_name, execution.status, execution.result) == ("calc_add", "completed", {"result": 5})
    assert json.loads(turn.output_text or "") == {"result": 5}
    assert [call["arguments"] for call in calls(tmp_path, "add")] == [{"a": 2, "b": 3}]
    await turnkit_replayer().replay_workflow(await tk.client.get_workflow_handle(turn.id).fetch_history())

    second = await conversation.ask("and now?")
    assert second.status == "completed", second.error
    assert tool_names(client.requests[2]) == [*listed, "calc_extra"]


async def test_a_replay_safe_tool_failing_once_over_http_is_retried_and_completes(
    tk: TurnKit, tmp_path: Path, http_port: int
) -> None:
    """Over streamable HTTP (with the agent's headers on every request): the server's tool fails its first call (an
    ``isError`` result); the server is declared replay-safe, so the call is retried with the same idempotency key and
    the one execution completes with the second call's answer."""
    server = MCPServer.http(
        "calc",
        f"http://127.0.0.1:{http_port}/mcp",
        headers=lambda: {"X-Team": "billing"},
        recovery="replay_safe",
        initial_retry_interval=0.05,
    )
    client = ScriptedClient([call_tools(("flaky", {"text": "hello"})), answer_with_last_result])
    agent = turnkit.Agent("echo", model="scripted", mcp_servers=[server], client=client)

    turn = await (await tk.conversation(agent)).ask("say hello")

    assert turn.status == "completed", turn.error
    [execution] = await turn.tool_executions()
    assert (execution.status, execution.result) == ("completed", {"result": "echo hello"})
    received = calls(tmp_path, "flaky")
    assert [call["key"] for call in received] == [execution.idempotency_key] * 2
    assert [call["team"] for call in received] == ["billing", "billing"]


async def test_an_at_most_once_call_whose_connection_drops_is_interrupted(tk: TurnKit, tmp_path: Path) -> None:
    """The server's process ends in the middle of an at-most-once call: whether the tool had its effect is unknown, so
    the call is recorded ``interrupted`` (never ``failed``), the model is told so, and it is not called again."""
    client = ScriptedClient([call_tools(("vanish_now", {})), answer_with_last_result])
    agent = turnkit.Agent("risky", model="scripted", mcp_servers=[stdio_server(tmp_path)], client=client)

    turn = await (await tk.conversation(agent)).ask("do it once")

    assert turn.status == "completed", turn.error
    [execution] = await turn.tool_executions()
    assert execution.status == "interrupted"
    assert INTERRUPTED_MESSAGE in (turn.output_text or "")
    assert len(calls(tmp_path, "vanish")) == 1


async def test_an_at_most_once_tool_failing_fails_its_call_once(tk: TurnKit, tmp_path: Path) -> None:
    """At most once (the default), a tool's error result is the call's known outcome: ``failed``, with the server's
    text for the model, and no second call."""
    client = ScriptedClient([call_tools(("flaky", {"text": "x"})), answer_with_last_result])
    agent = turnkit.Agent("careful", model="scripted", mcp_servers=[stdio_server(tmp_path)], client=client)

    turn = await (await tk.conversation(agent)).ask("try once")

    assert turn.status == "completed", turn.error
    [execution] = await turn.tool_executions()
    assert execution.status == "failed"
    assert "MCPToolFailed" in str((execution.error or {}).get("message"))
    assert len(calls(tmp_path, "flaky")) == 1


def test_the_recovery_a_server_declares_is_each_calls() -> None:
    """A server's recovery, a tool's own override, and its timeouts become the call's dispatch policy; a name the turn
    did not record is not the server's."""
    server = MCPServer(
        "files",
        lambda: pytest.fail("no connection is made"),
        recovery="replay_safe",
        tool_recovery={"delete": "at_most_once"},
        timeout=12,
        max_attempts=4,
    )
    agent = turnkit.Agent("librarian", mcp_servers=[server])
    recorded = {"files": [{"name": "read", "tool": "read"}, {"name": "delete", "tool": "delete"}]}

    read = mcp_call_policy(agent, "read", recorded)
    delete = mcp_call_policy(agent, "delete", recorded)

    assert read is not None and delete is not None
    assert (read.kind, read.at_most_once, read.max_attempts, read.timeout) == ("tool", False, 4, 12.0)
    assert (delete.at_most_once, delete.max_attempts) == (True, 1)
    assert read.mcp is not None and (read.mcp.server, read.mcp.tool) == ("files", "read")
    assert mcp_call_policy(agent, "write", recorded) is None
    with pytest.raises(ValueError, match="duplicate MCP server name"):
        turnkit.Agent("twice", mcp_servers=[server, server])
    with pytest.raises(ValueError, match="invalid MCP server name"):
        MCPServer("no spaces", lambda: pytest.fail("unused"))


async def test_a_worker_keeps_a_stdio_servers_process_for_later_listings_and_calls(tk: TurnKit, tmp_path: Path) -> None:
    """Two turns of a conversation list the server's tools and call one each: one server process serves every
    request of both."""
    client = ScriptedClient(
        [call_tools(("add", {"a": 1, "b": 2})), "three", call_tools(("add", {"a": 3, "b": 4})), "7"]
    )
    agent = turnkit.Agent("adder", model="scripted", mcp_servers=[stdio_server(tmp_path)], client=client)
    conversation = await tk.conversation(agent)

    for text in ("1 + 2?", "3 + 4?"):
        turn = await conversation.ask(text)
        assert turn.status == "completed", turn.error

    [pid] = starts(tmp_path)
    assert [call["pid"] for call in calls(tmp_path, "add")] == [pid, pid]


async def test_an_idle_connection_closes_after_keep_alive(tmp_path: Path) -> None:
    """A kept connection that waits ``keep_alive`` seconds for its next use is closed (its process ends); the next
    call starts a new one."""
    server = stdio_server(tmp_path, keep_alive=0.5)
    try:
        await server.call_tool("add", {"a": 1, "b": 1}, idempotency_key="k1")
        [first] = starts(tmp_path)
        await eventually(lambda: ended(first), what="the idle server process to end")
        await server.call_tool("add", {"a": 2, "b": 1}, idempotency_key="k2")
        assert [call["pid"] for call in calls(tmp_path, "add")] == starts(tmp_path)
        assert len(starts(tmp_path)) == 2
    finally:
        await server.aclose()


async def test_a_stopped_worker_ends_the_server_processes_it_kept(engine: Engine, tmp_path: Path) -> None:
    """A worker that stops ends the processes of the stdio servers it kept open, though their ``keep_alive`` has
    minutes to run."""
    client = ScriptedClient([call_tools(("add", {"a": 1, "b": 2})), "three"])
    agent = turnkit.Agent("adder", model="scripted", mcp_servers=[stdio_server(tmp_path)], client=client)

    async with engine.tk.worker():
        turn = await (await engine.tk.conversation(agent)).ask("1 + 2?")
        assert turn.status == "completed", turn.error
        [pid] = starts(tmp_path)
        assert alive(pid)

    await eventually(lambda: ended(pid), what="the kept server process to end with its worker")


async def test_an_at_most_once_call_goes_out_on_a_new_process_when_the_kept_one_died(tmp_path: Path) -> None:
    """The kept process of a server dies while idle: an at-most-once call finds the connection lost before it sends
    anything, and runs once on a new process (completed, not ``interrupted``); a listing does the same."""
    server = stdio_server(tmp_path)
    try:
        assert [tool.name for tool in await server.list_tools()] == ["add", "flaky", "vanish-now"]
        [first] = starts(tmp_path)
        os.kill(first, signal.SIGKILL)
        await eventually(lambda: ended(first), what="the killed server process to end")

        result = await server.call_tool("add", {"a": 2, "b": 2}, idempotency_key="k1")

        assert result.structured_content == {"result": 4}
        [_, second] = starts(tmp_path)
        assert [call["pid"] for call in calls(tmp_path, "add")] == [second]

        os.kill(second, signal.SIGKILL)
        await eventually(lambda: ended(second), what="the killed server process to end")
        assert [tool.name for tool in await server.list_tools()] == ["add", "flaky", "vanish-now"]
        assert len(starts(tmp_path)) == 3
    finally:
        await server.aclose()


async def test_calls_at_once_run_on_processes_of_their_own(tmp_path: Path) -> None:
    """A kept connection carries one request at a time: two calls at once run in two server processes, and a later
    call reuses one of them. ``keep_alive=0`` starts a process for every request."""
    server = stdio_server(tmp_path)
    try:
        await asyncio.gather(*(server.call_tool("add", {"a": i, "b": 1}, idempotency_key=f"k{i}") for i in (1, 2)))
        assert len(set(starts(tmp_path))) == 2
        await server.call_tool("add", {"a": 3, "b": 1}, idempotency_key="k3")
        pids = [call["pid"] for call in calls(tmp_path, "add")]
        assert len(set(pids)) == 2 and pids[2] in pids[:2]
    finally:
        await server.aclose()

    async def all_ended() -> bool:
        return not any(alive(pid) for pid in starts(tmp_path))

    await eventually(all_ended, what="the closed server processes to end")

    each = stdio_server(tmp_path, keep_alive=0)
    for i in (4, 5):
        await each.call_tool("add", {"a": i, "b": 1}, idempotency_key=f"k{i}")
    assert len(starts(tmp_path)) == 4


def test_keep_alive_is_a_number_of_seconds() -> None:
    """``keep_alive`` is checked when the server is defined: a negative, infinite or non-number value is refused."""
    for wrong in (-1, math.inf, "300", True):
        with pytest.raises(ValueError, match="calc: keep_alive must be a number of seconds, 0 or more"):
            MCPServer("calc", lambda: pytest.fail("no connection is made"), keep_alive=wrong)  # type: ignore[arg-type]


async def test_an_http_servers_connection_is_kept_only_when_asked_and_keeps_its_headers(
    tmp_path: Path, http_port: int
) -> None:
    """Over streamable HTTP each request has a connection of its own by default, which asks the headers callable
    again (a fresh token); with ``keep_alive`` one connection serves both calls, with the headers it was opened
    with."""
    asked = iter(range(10))

    def headers() -> dict[str, str]:
        return {"X-Team": f"team-{next(asked)}"}

    url = f"http://127.0.0.1:{http_port}/mcp"
    each = MCPServer.http("calc", url, headers=headers)
    kept = MCPServer.http("calc", url, headers=headers, keep_alive=60)
    try:
        for server in (each, each, kept, kept):
            await server.call_tool("add", {"a": 1, "b": 1}, idempotency_key="k")
    finally:
        await kept.aclose()
    assert [call["team"] for call in calls(tmp_path, "add")] == ["team-0", "team-1", "team-2", "team-2"]


async def test_connections_beyond_the_idle_limit_close_after_their_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a burst of calls at once, only ``MAX_IDLE`` connections wait for the next use (here 1 of 2): the other
    server process ends at once, not after ``keep_alive``."""
    monkeypatch.setattr("turnkit._mcp_connections.MAX_IDLE", 1)
    server = stdio_server(tmp_path)
    try:
        await asyncio.gather(*(server.call_tool("add", {"a": i, "b": 1}, idempotency_key=f"k{i}") for i in (1, 2)))
        pids = starts(tmp_path)
        assert len(pids) == 2

        async def one_left() -> bool:
            return sorted(alive(pid) for pid in pids) == [False, True]

        await eventually(one_left, what="one of the two server processes to end")
    finally:
        await server.aclose()
