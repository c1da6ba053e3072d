"""A small MCP server, built with the MCP SDK's own ``MCPServer``, for tests/test_mcp_tools.py.

Run over stdio (``python tests/mcp_server.py``: a TurnKit worker starts one process per listing or call) or over
streamable HTTP (``python tests/mcp_server.py http PORT``). Its state lives in the directory named by
``TURNKIT_MCP_STATE``, so that it outlives a stdio process:

* every call of a tool appends one JSON line to ``<state>/<tool>.calls``: the arguments, the call's idempotency key
  (from the request's ``_meta``) and the ``X-Team`` header (HTTP only);
* ``flaky`` fails its first call (an ``isError`` result) and answers every later one;
* ``vanish`` ends its server process in the middle of the call (the connection drops after the request went out);
* ``extra`` is listed only by a server started while ``<state>/extra`` exists.
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
    line = {"arguments": arguments, "key": meta.get(IDEMPOTENCY_KEY_META), "team": headers.get("x-team")}
    path = STATE / f"{tool}.calls"
    with path.open("a") as calls:
        calls.write(json.dumps(line) + "\n")
    return len(path.read_text().splitlines())


@server.tool()
def add(a: int, b: int, ctx: Context) -> int:
    """Add two integers."""
    record("add", ctx, a=a, b=b)
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


if (STATE / "extra").exists():

    @server.tool()
    def extra() -> str:
        """Listed only by servers started after the marker was written."""
        return "extra"


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
