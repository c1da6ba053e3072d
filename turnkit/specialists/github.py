"""``github_repository_read``: the librarian's tool, reading one GitHub repository (behaviour §1.8).

Requests go over HTTPS to ``api.github.com`` only and redirects are never followed, so neither a crafted path nor a
redirect can send the token elsewhere. The HTTP call itself is a *GitHub client*: a callable
``(url, headers) -> (status, json)``, sync or async; :class:`HttpxGitHubClient` is the default.
"""

from __future__ import annotations

import base64
import inspect
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Literal
from urllib.parse import quote, urlencode, urlsplit

from pydantic import BaseModel, Field

from turnkit.kernel.errors import ToolError, ToolValidationError
from turnkit.specialists.read_only import ReadOnlyTool
from turnkit.tools import ToolContext

__all__ = [
    "GITHUB_API",
    "GITHUB_TOKEN_VARIABLE",
    "OPERATIONS",
    "GitHubClient",
    "GitHubRepositoryReadTool",
    "HttpxGitHubClient",
]

GITHUB_API: Final = "https://api.github.com"
#: The environment variable a tool without its own ``token`` reads its GitHub token from (as the seed does).
GITHUB_TOKEN_VARIABLE: Final = "GITHUB_TOKEN"
OPERATIONS: Final = ("repository", "file", "history", "diff", "issues", "issue", "comments")
_REPOSITORY_RE: Final = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")

#: ``(url, headers) -> (status, json body)``, sync or async.
GitHubClient = Callable[[str, Mapping[str, str]], "tuple[int, Any] | Awaitable[tuple[int, Any]]"]


class HttpxGitHubClient:
    """The default GitHub client: one ``httpx`` GET, redirects not followed (needs the ``providers`` extra)."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.timeout = timeout

    async def __call__(self, url: str, headers: Mapping[str, str]) -> tuple[int, Any]:
        """GET ``url``; a non-JSON body is returned as text."""
        import httpx  # the providers extra; imported here so that defining a librarian needs no HTTP stack

        async with httpx.AsyncClient(follow_redirects=False, timeout=self.timeout) as http:
            response = await http.get(url, headers=dict(headers))
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text


class GitHubRepositoryReadTool(ReadOnlyTool):
    """Read one repository: its metadata, a file, the history, a diff, issues, an issue or its comments.

    Returns ``{repository, operation, source, data}``, ``source`` being the API URL that was read.
    """

    name = "github_repository_read"
    description = "Read the GitHub repository this agent covers: metadata, files, history, diffs, issues, comments."
    usage_hint = "Use when the answer depends on the repository's code, history or issues."

    class Arguments(BaseModel):
        operation: Literal["repository", "file", "history", "diff", "issues", "issue", "comments"] = Field(
            description="What to read."
        )
        path: str | None = Field(default=None, description="file: the file's path; history: limit to this path.")
        ref: str | None = Field(default=None, description="file and history: a branch, tag or commit.")
        base: str | None = Field(default=None, description="diff: the base ref.")
        head: str | None = Field(default=None, description="diff: the head ref.")
        number: int | None = Field(default=None, description="issue and comments: the issue or pull request number.")
        state: Literal["open", "closed", "all"] = Field(default="open", description="issues: which ones.")

    def __init__(self, repository: str, *, github_client: GitHubClient | None = None, token: str | None = None) -> None:
        """Scope the tool to ``repository`` (``owner/name``). Without ``token``, each call sends ``GITHUB_TOKEN`` from
        the environment when it is set; ``token=""`` sends none.

        Raises:
            ValueError: ``repository`` is not ``owner/name``.
        """
        if not isinstance(repository, str) or _REPOSITORY_RE.fullmatch(repository) is None:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"repository must be owner/name, not {repository!r}")
        self.repository = repository
        self.github_client: GitHubClient = github_client or HttpxGitHubClient()
        self.token = token

    async def call(self, context: ToolContext, **arguments: Any) -> dict[str, Any]:
        """Read what ``operation`` names.

        Raises:
            ToolValidationError: An argument the operation needs is missing.
            ToolError: GitHub answered with a redirect or an error.
        """
        operation = str(arguments["operation"])
        url = self.url_for(operation, arguments)
        data = await self._get(url)
        if operation == "file" and isinstance(data, dict) and data.get("encoding") == "base64":
            data = {**data, "content": base64.b64decode(str(data.get("content") or "")).decode("utf-8", "replace")}
            data.pop("encoding", None)
        return {"repository": self.repository, "operation": operation, "source": url, "data": data}

    def url_for(self, operation: str, arguments: Mapping[str, Any]) -> str:
        """The API URL of an operation (path segments quoted, so they cannot leave the repository)."""
        repo = f"{GITHUB_API}/repos/{self.repository}"

        def need(name: str) -> Any:
            value = arguments.get(name)
            if value is None or value == "":
                raise ToolValidationError(f"missing required argument: {name} (for {operation})")
            return value

        def query(**values: Any) -> str:
            kept = {k: v for k, v in values.items() if v is not None}
            return f"?{urlencode(kept)}" if kept else ""

        match operation:
            case "repository":
                return repo
            case "file":
                path = quote(str(need("path")).lstrip("/"), safe="/")
                return f"{repo}/contents/{path}{query(ref=arguments.get('ref'))}"
            case "history":
                return f"{repo}/commits{query(path=arguments.get('path'), sha=arguments.get('ref'), per_page=30)}"
            case "diff":
                base, head = quote(str(need("base")), safe=""), quote(str(need("head")), safe="")
                return f"{repo}/compare/{base}...{head}"
            case "issues":
                return f"{repo}/issues{query(state=arguments.get('state') or 'open', per_page=30)}"
            case "issue":
                return f"{repo}/issues/{int(need('number'))}"
            case "comments":
                return f"{repo}/issues/{int(need('number'))}/comments{query(per_page=30)}"
            case _:
                raise ToolValidationError(f"unknown operation: {operation}")

    async def _get(self, url: str) -> Any:
        parts = urlsplit(url)
        if parts.scheme != "https" or parts.hostname != "api.github.com" or ".." in parts.path.split("/"):
            raise ToolError(f"refusing to request {url}: only https://api.github.com is allowed")
        headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}
        # Read when the call is made, in the worker that runs it: the secret lives in the worker's environment.
        token = self.token if self.token is not None else os.environ.get(GITHUB_TOKEN_VARIABLE)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        answer = self.github_client(url, headers)
        status, body = await answer if inspect.isawaitable(answer) else answer
        if 300 <= status < 400:
            raise ToolError(f"GitHub answered {status} (a redirect); redirects are not followed")
        if status >= 400:
            message = body.get("message") if isinstance(body, dict) else body
            raise ToolError(f"GitHub answered {status}: {message}")
        return body
