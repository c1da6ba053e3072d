"""MCP servers as tool sets of an agent: ``Agent(mcp_servers=[MCPServer.stdio(...), MCPServer.http(...)])``.

::

    files = turnkit.MCPServer.stdio("files", "python", ["files_server.py"], recovery="replay_safe")
    search = turnkit.MCPServer.http("search", "https://search.example/mcp", headers=lambda: {"Authorization": token()})
    agent = turnkit.Agent("researcher", mcp_servers=[files, search])

A turn's first model call lists each server's tools and records the list in the turn (the store), so every later
model call and retry of that turn offers the same tools, whatever the server lists meanwhile. Each call the model
makes runs as TurnKit's tool activity (``tool:<name>``), like any tool: an execution in the store, the tree's tool
budgets, the authorization hook, and the recovery the server is declared with: ``replay_safe`` calls are retried
(the server sees the same idempotency key in the request's ``_meta``, :data:`IDEMPOTENCY_KEY_META`), ``at_most_once``
calls run once, and a call whose connection dropped after it was sent is recorded ``interrupted`` (docs/design.md,
"MCP servers as tools").

The servers are reached from TurnKit's workers (the model activity lists, the tool activity calls); credentials stay
in the worker's agent definitions, never in a payload. A worker keeps a stdio server's connections (its processes)
open for ``keep_alive`` seconds after their last use, and opens one per listing or call for an HTTP server unless
told otherwise (:mod:`turnkit._mcp_connections`). Needs the ``mcp`` extra (the official MCP SDK, version 2):
``pip install 'turnkit[mcp]'``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, cast

from turnkit._mcp_connections import KeptConnections
from turnkit.kernel.errors import ToolError, ToolOutcomeUnknown
from turnkit.tools import RECOVERY_MODES, Recovery, Tool, ToolContext

if TYPE_CHECKING:
    from mcp import Client
    from mcp.types import CallToolResult
    from mcp.types import Tool as ListedTool

__all__ = ["IDEMPOTENCY_KEY_META", "MCPServer", "MCPTool", "MCPToolFailed", "result_payload"]

logger = logging.getLogger("turnkit.mcp")

#: The ``_meta`` key of a tool call's request that carries the call's idempotency key (``turnkit:tool:<execution id>``,
#: the same on every attempt), for servers whose tools can use it.
IDEMPOTENCY_KEY_META: Final = "turnkit/idempotency-key"

_SERVER_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_-]*")
#: JSON-RPC errors a second attempt of the same request cannot fix (mcp.types: parse error, invalid request, method
#: not found, invalid params): the server answered, so the call failed with a known outcome.
_REFUSED: Final = frozenset({-32700, -32600, -32601, -32602})
_MISSING_SDK: Final = "MCP servers need the MCP SDK: pip install 'turnkit[mcp]'"


class MCPToolFailed(Exception):
    """The server ran the tool and it reported an error (a ``CallToolResult`` with ``isError``): retried for a
    replay-safe server, the call's failure (the model sees the text) for an at-most-once one."""


class MCPServer:
    """An MCP server whose tools an agent offers its model, and how their calls are recovered.

    Build one with :meth:`stdio` or :meth:`http`, or give any factory of an unentered ``mcp.Client`` (the shape
    ``temporalio.mcp.MCPPlugin`` takes, so a team's factories serve both).
    """

    def __init__(
        self,
        name: str,
        client: Callable[[], AbstractAsyncContextManager[Client]],
        *,
        recovery: Recovery = "at_most_once",
        tool_recovery: Mapping[str, Recovery] | None = None,
        timeout: float = 60.0,
        max_attempts: int = 5,
        initial_retry_interval: float = 1.0,
        maximum_retry_interval: float = 30.0,
        prefix: str = "",
        allowed_tools: Iterable[str] | None = None,
        list_timeout: float = 30.0,
        keep_alive: float = 0.0,
    ) -> None:
        """Define a server.

        Args:
            name: Its name in the agent (``[a-zA-Z_][a-zA-Z0-9_-]*``), recorded with the turn's tool list.
            client: Returns a new, unentered ``mcp.Client`` for each listing or call (or any async context manager
                that yields a connected one).
            recovery: How its tools' calls recover: ``"at_most_once"`` (one attempt; a lost one is ``interrupted``)
                or ``"replay_safe"`` (retried, same idempotency key).
            tool_recovery: Per tool (by the server's name for it), a recovery other than ``recovery``.
            timeout: Seconds one call attempt may take.
            max_attempts: Attempts of a replay-safe call.
            initial_retry_interval: First retry delay in seconds (replay-safe calls).
            maximum_retry_interval: Longest retry delay in seconds (replay-safe calls).
            prefix: Put before each tool's name as the model sees it (``"files_"``), to keep two servers apart.
            allowed_tools: Offer only these tools (by the server's names); None: every tool it lists.
            list_timeout: Seconds the listing of its tools may take.
            keep_alive: Seconds a worker keeps a connection open after its last listing or call, for the next one;
                0 opens a connection for each. A kept connection carries one request at a time.

        Raises:
            ValueError: An invalid name, recovery, limit or prefix.
        """
        if not isinstance(name, str) or not _SERVER_NAME.fullmatch(name):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"invalid MCP server name: {name!r} (must match [a-zA-Z_][a-zA-Z0-9_-]*)")
        if not callable(client):
            raise TypeError(f"MCP server {name}: client must be a callable returning an mcp.Client")
        recoveries = {"": recovery, **dict(tool_recovery or {})}
        for each in recoveries.values():
            if each not in RECOVERY_MODES:
                raise ValueError(f"MCP server {name}: unknown recovery mode {each!r}")
        if timeout <= 0 or list_timeout <= 0:
            raise ValueError(f"MCP server {name}: timeouts must be positive")
        number = isinstance(keep_alive, int | float)  # pyright: ignore[reportUnnecessaryIsInstance]
        if not number or isinstance(keep_alive, bool) or not 0 <= keep_alive < math.inf:
            raise ValueError(f"MCP server {name}: keep_alive must be a number of seconds, 0 or more")
        if max_attempts < 1:
            raise ValueError(f"MCP server {name}: max_attempts must be at least 1")
        if prefix and not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", prefix):
            raise ValueError(f"MCP server {name}: invalid prefix {prefix!r}")
        self.name = name
        self.recovery: Recovery = recovery
        self.tool_recovery: dict[str, Recovery] = dict(tool_recovery or {})
        self.timeout = float(timeout)
        self.max_attempts = max_attempts
        self.initial_retry_interval = float(initial_retry_interval)
        self.maximum_retry_interval = float(maximum_retry_interval)
        self.prefix = prefix
        self.allowed_tools = None if allowed_tools is None else frozenset(allowed_tools)
        self.list_timeout = float(list_timeout)
        self.keep_alive = float(keep_alive)
        self._client = client
        self._tools: dict[tuple[str, str], MCPTool] = {}
        #: The kept connections of each event loop that used the server (a worker's, a test's).
        self._connections: dict[asyncio.AbstractEventLoop, KeptConnections] = {}

    @classmethod
    def stdio(
        cls,
        name: str,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        keep_alive: float = 300.0,
        **options: Any,
    ) -> MCPServer:
        """A server the worker starts as a process and talks to over its stdin and stdout. The worker keeps each
        process it started for ``keep_alive`` seconds after its last listing or call (0: a process for each), and
        ends them when it stops. ``options`` are the constructor's."""
        try:
            from mcp import Client, StdioServerParameters
        except ImportError as err:
            raise ImportError(_MISSING_SDK) from err
        parameters = StdioServerParameters(
            command=command, args=list(args), env=None if env is None else dict(env), cwd=cwd
        )
        return cls(name, lambda: Client(parameters), keep_alive=keep_alive, **options)

    @classmethod
    def http(
        cls,
        name: str,
        url: str,
        *,
        headers: Mapping[str, str] | Callable[[], Mapping[str, str]] | None = None,
        **options: Any,
    ) -> MCPServer:
        """A server at ``url``, over streamable HTTP. ``headers`` (or a callable returning them, asked at each
        connection: a fresh token) go with every request. ``options`` are the constructor's: with ``keep_alive``
        a connection (and its MCP session) serves later calls too, and a token asked for it is used for as long."""
        try:
            from mcp import Client
        except ImportError as err:
            raise ImportError(_MISSING_SDK) from err
        if headers is None:
            return cls(name, lambda: Client(url), **options)
        return cls(name, lambda: _http_with_headers(url, headers), **options)

    def __repr__(self) -> str:
        """Show the name and recovery."""
        return f"MCPServer({self.name!r}, recovery={self.recovery!r})"

    def _kept(self) -> KeptConnections:
        """This event loop's connections to the server."""
        loop = asyncio.get_running_loop()
        kept = self._connections.get(loop)
        if kept is None or kept.closed:
            for other in [each for each in self._connections if each.is_closed()]:
                del self._connections[other]
            kept = self._connections[loop] = KeptConnections(self._client, self.name, self.keep_alive)
        return kept

    async def aclose(self) -> None:
        """Close the connections this event loop keeps to the server (a worker that stops closes them itself)."""
        kept = self._connections.pop(asyncio.get_running_loop(), None)
        if kept is not None:
            await kept.aclose()

    def recovery_of(self, tool: str) -> Recovery:
        """The recovery of calls of ``tool`` (the server's name for it)."""
        return self.tool_recovery.get(tool, self.recovery)

    def offers(self, tool: str) -> bool:
        """Whether the agent offers ``tool`` (the server's name for it) to its model."""
        return self.allowed_tools is None or tool in self.allowed_tools

    async def list_tools(self) -> list[ListedTool]:
        """Every tool the server lists now (all pages), asked of the server itself, never a cached answer. When a
        kept connection fails, the listing is asked again on a new one (a listing changes nothing).

        Raises:
            ConnectionError: The server could not be reached or listed within ``list_timeout``.
        """
        import anyio

        try:
            with anyio.fail_after(self.list_timeout):
                fresh = False
                while True:
                    reused = False
                    try:
                        async with self._kept().connection(fresh=fresh) as (client, reused):
                            return await _all_tools(client)
                    except Exception:
                        if not reused:
                            raise
                        fresh = True
        except Exception as err:
            raise ConnectionError(
                f"MCP server {self.name}: listing its tools failed: {_reason(_unwrapped(err))}"
            ) from err

    async def call_tool(self, tool: str, arguments: Mapping[str, Any], *, idempotency_key: str) -> CallToolResult:
        """Call ``tool`` (the server's name for it).

        A kept connection may have been lost while it waited (a server process that died). So before an at-most-once
        call goes out on one, the server is asked for its tool list; a connection that cannot answer is closed and
        the call goes out on a new one. A lost connection thus never leaves a call that was never sent
        ``interrupted``. A replay-safe call is sent without that question: a failed attempt is retried.

        Raises:
            ToolError: The server refused the request (unknown tool, invalid arguments): its outcome is known.
            ToolOutcomeUnknown: The connection failed after the request was sent (or the server failed to answer):
                the tool may have run.
            ConnectionError: The connection could not be made (nothing was sent).
        """
        from mcp import MCPError

        ask_first = self.recovery_of(tool) == "at_most_once"
        fresh = False
        while True:
            sent = False
            try:
                async with self._kept().connection(fresh=fresh) as (client, reused):
                    if reused and ask_first and not await _answers(client, self.list_timeout):
                        raise _Lost  # the block raised: the connection is closed, not kept
                    sent = True
                    return await client.call_tool(
                        tool,
                        dict(arguments),
                        read_timeout_seconds=self.timeout,
                        meta={IDEMPOTENCY_KEY_META: idempotency_key},
                    )
            except _Lost:
                logger.info("a kept connection to MCP server %s was lost: %s goes out on a new one", self.name, tool)
                fresh = True
            except Exception as err:
                cause = _unwrapped(err)
                if isinstance(cause, MCPError) and cause.code in _REFUSED:
                    raise ToolError(f"MCP server {self.name} refused {tool}: {cause.message}") from err
                if sent:  # the request may have gone out: whether the tool ran is unknown
                    raise ToolOutcomeUnknown(f"MCP server {self.name}, {tool}: {_reason(cause)}") from err
                raise ConnectionError(f"MCP server {self.name}: no connection for {tool}: {_reason(cause)}") from err

    def tool(self, name: str, server_tool: str) -> MCPTool:
        """The tool the model calls ``name``, which is ``server_tool`` on this server (one instance each)."""
        key = (name, server_tool)
        found = self._tools.get(key)
        if found is None:
            recovery = self.recovery_of(server_tool)
            namespace: dict[str, Any] = {
                "name": name,
                "recovery": recovery,
                "timeout": self.timeout,
                "max_attempts": self.max_attempts,
                "initial_retry_interval": self.initial_retry_interval,
                "maximum_retry_interval": self.maximum_retry_interval,
                "__module__": __name__,
            }
            cls = cast("type[MCPTool]", type(f"MCPTool_{name}", (MCPTool,), namespace))
            found = self._tools[key] = cls(self, server_tool)
        return found


class MCPTool(Tool):
    """One tool of an :class:`MCPServer`, as TurnKit's tool activity runs it: the server validates the arguments
    and runs it; the result is what the server returned (:func:`result_payload`)."""

    server_tool: str
    """The server's name for the tool."""

    def __init__(self, server: MCPServer, server_tool: str) -> None:
        """The tool ``server_tool`` of ``server``."""
        self.server = server
        self.server_tool = server_tool

    @property
    def reads_context(self) -> bool:
        """Only the call's idempotency key is used: the conversation is not read for it."""
        return False

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """Not called: :meth:`invoke` sends the model's arguments to the server as they are."""
        raise NotImplementedError("an MCP tool runs through invoke")

    async def invoke(self, arguments: Mapping[str, Any], context: ToolContext) -> dict[str, Any]:
        """Call the tool on its server with the model's arguments and the call's idempotency key.

        Raises:
            MCPToolFailed: The tool reported an error (``isError``).
        """
        result = await self.server.call_tool(self.server_tool, arguments, idempotency_key=context.idempotency_key)
        payload = result_payload(result)
        if result.is_error:
            raise MCPToolFailed(str(payload.get("result") or payload))
        return payload


def result_payload(result: CallToolResult) -> dict[str, Any]:
    """What the model sees of a tool's result: its structured content when it has some, the text of a single text
    block as ``{"result": text}``, otherwise ``{"content": [blocks]}`` (MCP's content blocks, as JSON)."""
    if result.structured_content is not None and not result.is_error:
        return dict(result.structured_content)
    blocks = [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content]
    if len(blocks) == 1 and blocks[0].get("type") == "text":
        return {"result": str(blocks[0].get("text", ""))}
    return {"content": blocks}


@asynccontextmanager
async def _http_with_headers(
    url: str, headers: Mapping[str, str] | Callable[[], Mapping[str, str]]
) -> AsyncGenerator[Client]:
    """A streamable-HTTP connection whose requests carry ``headers`` (the HTTP client is closed with it)."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    sent = dict(headers() if callable(headers) else headers)
    # The MCP SDK's own defaults for its HTTP client: 30 s to connect and write, 5 min to read a streamed answer.
    async with (
        httpx2.AsyncClient(headers=sent, timeout=httpx2.Timeout(30.0, read=300.0)) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


class _Lost(Exception):
    """A kept connection did not answer before a call was sent on it."""


async def _all_tools(client: Client) -> list[ListedTool]:
    """Every page of the server's tool list, asked of the server (not the client's cache)."""
    tools: list[ListedTool] = []
    cursor: str | None = None
    seen: set[str | None] = set()
    while True:
        page = await client.list_tools(cursor=cursor, cache_mode="bypass")
        tools.extend(page.tools)
        seen.add(cursor)
        cursor = page.next_cursor
        if cursor is None or cursor in seen:  # a repeated cursor would page forever
            return tools


async def _answers(client: Client, timeout: float) -> bool:
    """Whether the server answers a request on ``client`` (a first page of its tool list) within ``timeout``."""
    try:
        async with asyncio.timeout(timeout):
            await client.list_tools(cache_mode="bypass")
    except Exception:
        return False
    return True


def _unwrapped(err: BaseException) -> BaseException:
    """The error inside the exception groups anyio wraps a transport's failure in (one error each)."""
    while isinstance(err, BaseExceptionGroup) and len(err.exceptions) == 1:  # pyright: ignore[reportUnknownMemberType]
        err = err.exceptions[0]  # pyright: ignore[reportUnknownMemberType]
    return err


def _reason(err: BaseException) -> str:
    """A one-line reason for a failed call."""
    message = getattr(err, "message", None) or str(err)
    return f"{type(err).__name__}: {message}"
