"""Specialists (behaviour §1.8): ready-made agents for common sub-tasks.

* :func:`oracle`: read-only expert advice, reading files confined to one directory (``read_file``);
* :func:`librarian`: answers from one GitHub repository (``github_repository_read``);
* :func:`painter`: an image behind an authorization gate (``paint_image``, generated through the agent's client).

Each returns an ordinary :class:`~turnkit.agent.Agent` (``inherit_globals=False``), usable on its own or as a
sub-agent: ``Agent("boss", sub_agents=[turnkit.specialists.oracle(model="...", root="docs")])``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from turnkit._lazy import lazy_exports

if TYPE_CHECKING:
    from turnkit.specialists.agents import librarian, oracle, painter
    from turnkit.specialists.github import GitHubRepositoryReadTool, HttpxGitHubClient
    from turnkit.specialists.paint import NOT_AUTHORIZED, PaintImageTool
    from turnkit.specialists.read_file import ReadFileTool
    from turnkit.specialists.read_only import ReadOnlyTool

__all__ = [
    "NOT_AUTHORIZED",
    "GitHubRepositoryReadTool",
    "HttpxGitHubClient",
    "PaintImageTool",
    "ReadFileTool",
    "ReadOnlyTool",
    "librarian",
    "oracle",
    "painter",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        **dict.fromkeys(("librarian", "oracle", "painter"), "turnkit.specialists.agents"),
        **dict.fromkeys(("GitHubRepositoryReadTool", "HttpxGitHubClient"), "turnkit.specialists.github"),
        **dict.fromkeys(("NOT_AUTHORIZED", "PaintImageTool"), "turnkit.specialists.paint"),
        "ReadFileTool": "turnkit.specialists.read_file",
        "ReadOnlyTool": "turnkit.specialists.read_only",
    },
)
