"""MCP servers as tool sets of an agent (``Agent(mcp_servers=[...])``).

Against a real MCP server: ``tests/mcp_server.py``, built with the MCP SDK's own server, which TurnKit's worker starts
over stdio, or which the test starts over streamable HTTP on a free local port. Its calls and its state are files in
the test's own directory. The agent's model is scripted.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import turnkit
from tests.engine import eventually
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
    """The test server over stdio: the worker starts one process per listing and per call."""
    return MCPServer.stdio("calc", sys.executable, [str(SERVER)], env={"TURNKIT_MCP_STATE": str(state)}, **options)


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
