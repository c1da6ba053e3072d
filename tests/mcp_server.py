"""A small MCP server, built with the MCP SDK's own ``MCPServer``, for tests/test_mcp_tools.py.

Run over stdio (``python tests/mcp_server.py``: a TurnKit worker starts the process and keeps it for later listings
and calls) or over streamable HTTP (``python tests/mcp_server.py http PORT``). Its state lives in the directory named
by ``TURNKIT_MCP_STATE``, so that it outlives a stdio process:

* every process appends its pid to ``<state>/starts`` when it starts;
* every call of a tool appends one JSON line to ``<state>/<tool>.calls``: the arguments, the call's idempotency key
  (from the request's ``_meta``), the ``X-Team`` header (HTTP only) and the pid of the process that ran it;
* ``flaky`` fails its first call (an ``isError`` result) and answers every later one;
* ``vanish`` ends its server process in the middle of the call (the connection drops after the request went out);
* ``extra`` is listed by a server that started, or ran an ``add``, while ``<state>/extra`` exists.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

IDEMPOTENCY_KEY_META = "turnkit/idempotency-key"  # turnkit.mcp.IDEMPOTENCY_KEY_META (no TurnKit import here)

STATE = Path(os.environ["TURNKIT_MCP_STATE"])
server = MCPServer("calc")


def record(tool: str, ctx: Context, **arguments: Any) -> int:
    """Append this call to ``<tool>.calls``; the number of calls so far, this one included."""
    meta = ctx.request_context.meta or {}
    headers = ctx.headers or {}
    line = {
        "arguments": arguments,
        "key": meta.get(IDEMPOTENCY_KEY_META),
        "team": headers.get("x-team"),
        "pid": os.getpid(),
    }
    path = STATE / f"{tool}.calls"
    with path.open("a") as calls:
        calls.write(json.dumps(line) + "\n")
    return len(path.read_text().splitlines())


@server.tool()
def add(a: int, b: int, ctx: Context) -> int:
    """Add two integers."""
    record("add", ctx, a=a, b=b)
    offer_extra()
    return a + b


@server.tool()
def flaky(text: str, ctx: Context) -> str:
    """Echo the text (the first call fails)."""
    if record("flaky", ctx, text=text) == 1:
        raise RuntimeError("the first call fails")
    return f"echo {text}"


@server.tool(name="vanish-now")
def vanish(ctx: Context) -> str:
    """Do something, then lose the connection."""
    record("vanish", ctx)
    os._exit(3)


def extra() -> str:
    """Listed once the marker was written."""
    return "extra"


def offer_extra() -> None:
    """List ``extra`` from now on, once the marker exists."""
    global offers_extra
    if not offers_extra and (STATE / "extra").exists():
        server.add_tool(extra)
        offers_extra = True


offers_extra = False
offer_extra()


if __name__ == "__main__":
    with (STATE / "starts").open("a") as starts:
        starts.write(f"{os.getpid()}\n")
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
