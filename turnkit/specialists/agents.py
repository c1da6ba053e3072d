"""The specialist factories (behaviour §1.8): ordinary :class:`~turnkit.agent.Agent` s named ``oracle``,
``librarian`` and ``painter``, built with ``inherit_globals=False`` and an explicit model.

Use one on its own or as a sub-agent::

    boss = Agent("boss", sub_agents=[turnkit.specialists.oracle(model="claude-sonnet-4-5", root="docs")])
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final, Unpack

from turnkit.agent import Agent, AgentOptions, SpecialistOptions
from turnkit.model import Client
from turnkit.skills import check_skills
from turnkit.specialists.github import GitHubClient, GitHubRepositoryReadTool
from turnkit.specialists.paint import PaintImageTool
from turnkit.specialists.read_file import DEFAULT_MAX_BYTES, ReadFileTool
from turnkit.specialists.read_only import check_read_only
from turnkit.tools import Tool

__all__ = ["LIBRARIAN_INSTRUCTIONS", "ORACLE_INSTRUCTIONS", "PAINTER_INSTRUCTIONS", "librarian", "oracle", "painter"]

ORACLE_INSTRUCTIONS: Final = (
    "You are the oracle: a read-only expert adviser. Study the material your tools can read, reason carefully and "
    "give a precise, well-argued answer. You never change anything; say what you could not verify."
)
LIBRARIAN_INSTRUCTIONS: Final = (
    "You are the librarian: you answer questions about one GitHub repository by reading its code, history and "
    "issues. Cite the files, commits or issues your answer rests on, and say what you could not find."
)
PAINTER_INSTRUCTIONS: Final = (
    "You are the painter: turn the request into one complete image prompt and call paint_image once. Use reference "
    "images only when they were given to you."
)


def oracle(
    *,
    model: str,
    tools: Iterable[Tool | type[Tool]] | None = None,
    root: str | Path | None = None,
    client: Client | None = None,
    instructions: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    **agent_options: Unpack[SpecialistOptions],
) -> Agent:
    """The ``oracle``: read-only expert advice; by default it reads files under ``root`` (the working directory).

    Args:
        model: The model (required).
        tools: Replaces the default ``read_file``; every tool must be read-only.
        root: The directory ``read_file`` is confined to.
        client: Model client; falls back to ``settings.client``.
        instructions: Replaces :data:`ORACLE_INSTRUCTIONS`.
        max_bytes: The most ``read_file`` returns per call.
        **agent_options: Other :class:`~turnkit.agent.Agent` options (not ``sub_agents``).

    Raises:
        ValueError: No model; ``sub_agents`` given; a tool (given or a skill's) is not read-only.
    """
    chosen = [ReadFileTool(root if root is not None else os.getcwd(), max_bytes=max_bytes)] if tools is None else tools
    return _specialist("oracle", model, chosen, client, instructions or ORACLE_INSTRUCTIONS, agent_options)


def librarian(
    *,
    repository: str,
    model: str,
    github_client: GitHubClient | None = None,
    token: str | None = None,
    tools: Iterable[Tool | type[Tool]] = (),
    client: Client | None = None,
    instructions: str | None = None,
    **agent_options: Unpack[SpecialistOptions],
) -> Agent:
    """The ``librarian``: answers from one GitHub repository (``owner/name``) through ``github_repository_read``.

    Args:
        repository: ``owner/name``.
        model: The model (required).
        github_client: The HTTP call, ``(url, headers) -> (status, json)``; default :class:`HttpxGitHubClient`.
        token: A GitHub token, sent as a bearer token to ``api.github.com`` only; by default ``GITHUB_TOKEN`` from
            the environment of the worker that makes the call, and ``""`` sends none.
        tools: More tools, each read-only.
        client: Model client; falls back to ``settings.client``.
        instructions: Replaces :data:`LIBRARIAN_INSTRUCTIONS`.
        **agent_options: Other :class:`~turnkit.agent.Agent` options (not ``sub_agents``).

    Raises:
        ValueError: No model, a repository that is not ``owner/name``, ``sub_agents`` given, or a tool (given or a
            skill's) that is not read-only.
    """
    reader = GitHubRepositoryReadTool(repository, github_client=github_client, token=token)
    chosen = [reader, *tools]
    return _specialist("librarian", model, chosen, client, instructions or LIBRARIAN_INSTRUCTIONS, agent_options)


def painter(
    *,
    model: str,
    authorization: Callable[..., Any],
    image_model: str | None = None,
    provider: str | None = None,
    size: str | None = None,
    params: Mapping[str, Any] | None = None,
    max_reference_images: int = 4,
    client: Client | None = None,
    instructions: str | None = None,
    tools: Iterable[Tool | type[Tool]] = (),
    **agent_options: Unpack[SpecialistOptions],
) -> Agent:
    """The ``painter``: one terminal ``paint_image`` tool behind an ``authorization`` gate.

    An authorized ``paint_image`` call generates the image with ``image_model`` through the agent's client (OpenAI's
    ``images.generate``; Anthropic has none), stores it and ends the turn with ``{conversation_id,
    image_message_id, image}`` (the image without its bytes).

    Args:
        model: The model (required).
        authorization: ``(request, context=...)``, sync or async; runs before every generation and must return
            literally True.
        image_model: The image model.
        provider: The image provider.
        size: The image size.
        params: More generation parameters.
        max_reference_images: The most reference images one call may pass.
        client: Model client; falls back to ``settings.client``.
        instructions: Replaces :data:`PAINTER_INSTRUCTIONS`.
        tools: More tools, after ``paint_image``.
        **agent_options: Other :class:`~turnkit.agent.Agent` options.

    Raises:
        ValueError: No model, or ``authorization`` is not callable.
    """
    tool = PaintImageTool(
        authorization=authorization,
        image_model=image_model,
        provider=provider,
        size=size,
        params=params,
        max_reference_images=max_reference_images,
    )
    if not model:
        raise ValueError("painter requires a model")
    agent_options.pop("inherit_globals", None)  # always False, as for every specialist
    options: AgentOptions = {
        **agent_options,
        "model": model,
        "tools": [tool, *tools],
        "client": client,
        "instructions": instructions or PAINTER_INSTRUCTIONS,
        "inherit_globals": False,
    }
    return Agent("painter", **options)


def _specialist(
    name: str,
    model: str,
    tools: Iterable[Tool | type[Tool]],
    client: Client | None,
    instructions: str,
    options: SpecialistOptions,
) -> Agent:
    """A read-only specialist: no sub-agents, only read-only tools, no inherited globals."""
    if not model:
        raise ValueError(f"{name} requires a model")
    if options.get("sub_agents"):
        raise ValueError(f"{name} cannot have sub_agents")
    tools = list(tools)
    # Generators are read once: checked here, then handed over as tuples.
    preloaded = check_skills(options.pop("skills", ()), "skills")
    loadable = check_skills(options.pop("available_skills", ()), "available_skills")
    check_read_only(name, tools, (*preloaded, *loadable))
    options.pop("inherit_globals", None)  # always False: a specialist is configured only by its factory's arguments
    chosen: AgentOptions = {
        **options,
        "model": model,
        "tools": tools,
        "client": client,
        "instructions": instructions,
        "skills": preloaded,
        "available_skills": loadable,
        "inherit_globals": False,
    }
    return Agent(name, **chosen)
