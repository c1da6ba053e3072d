"""The MCP server :mod:`bench.mcp_calls` calls over stdio: one tool, ``echo``, built with the MCP SDK's own server.

Each process appends its pid to the file ``TURNKIT_BENCH_MCP_STARTS`` names when it starts, so the bench counts the
processes its turns started.
"""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("echo")


@server.tool()
def echo(text: str) -> str:
    """Return the text."""
    return text


if __name__ == "__main__":
    with open(os.environ["TURNKIT_BENCH_MCP_STARTS"], "a") as starts:
        starts.write(f"{os.getpid()}\n")
    server.run()
