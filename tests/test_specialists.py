"""Specialists (behaviour §1.8; T105, T106): the oracle, the librarian and the painter, on their own and as
sub-agents of a real turn."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.test_tools import make_context
from turnkit import specialists
from turnkit.agent import Agent
from turnkit.config import configure
from turnkit.kernel.errors import ToolError, ToolValidationError
from turnkit.runtime import TurnKit
from turnkit.skills import Skill
from turnkit.specialists import (
    NOT_AUTHORIZED,
    GitHubRepositoryReadTool,
    ReadFileTool,
    ReadOnlyTool,
)
from turnkit.testing import ScriptedClient, call_tools, image
from turnkit.tools import ToolContext, tool


@tool
def delete_file(path: str) -> str:
    """Delete a file (a mutating tool).

    Args:
        path: The file.
    """
    return path


class ListNotes(ReadOnlyTool):
    """A read-only tool a skill may own."""

    description = "List the notes."

    def call(self, context: ToolContext) -> list[str]:
        return ["notes.txt"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "notes.txt").write_text("the answer is 42")
    (tmp_path / "outside.txt").write_text("secret")
    (root / "escape").symlink_to(tmp_path / "outside.txt")
    return root


# -- T105: the oracle ---------------------------------------------------------------------------------------------


async def test_oracle_reads_inside_its_root_as_a_sub_agent(tk: TurnKit, project: Path) -> None:
    """T105: ``read_file`` reads inside the root and rejects ``../outside`` (and a symlink out) with ``ToolError``;
    the global available skills are not inherited; the oracle works as a sub-agent of a real turn."""
    configure(available_skills=[Skill("reading", description="global skill")])
    oracle_client = ScriptedClient(
        [
            call_tools(
                ("read_file", {"path": "notes.txt"}),
                ("read_file", {"path": "../outside.txt"}),
                ("read_file", {"path": "escape"}),
            ),
            "The notes say 42.",
        ]
    )
    oracle = specialists.oracle(model="scripted", root=project, client=oracle_client)
    assert oracle.name == "oracle" and oracle.inherit_globals is False
    assert oracle.available_skills == () and oracle.load_skill_tool is None
    boss_client = ScriptedClient([call_tools(("oracle", {"task": "What do the notes say?"})), "42, says the oracle"])
    boss = Agent("boss", model="scripted", sub_agents=[oracle], client=boss_client)
    turn = await (await tk.conversation(boss)).ask("ask the oracle")
    assert turn.status == "completed" and turn.output_text == "42, says the oracle"

    [child] = [t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id]
    assert child.agent_name == "oracle" and child.status == "completed"
    executions = await tk.store.list_tool_executions(turn_id=child.id)
    assert [(e.tool_name, e.status) for e in executions] == [
        ("read_file", "completed"),
        ("read_file", "failed"),
        ("read_file", "failed"),
    ]
    assert executions[0].result == {"path": "notes.txt", "content": "the answer is 42", "bytes": 16, "truncated": False}
    for execution, path in zip(executions[1:], ("../outside.txt", "escape"), strict=True):
        assert execution.error == {
            "message": f"path is outside the root: {path}",
            "details": {"class": "TurnKit::ToolError"},
        }
    assert oracle_client.requests[0].tool_names == ["read_file"]  # no load_skill: the global skill is not listed
    assert "<skills_available>" not in oracle_client.requests[0].instructions
    assert "secret" not in str([m.content for m in await tk.store.list_messages(child.conversation_id)])


def test_oracle_accepts_only_read_only_tools_and_no_sub_agents(project: Path) -> None:
    """T105: any mutating tool, given or owned by a skill, and any sub_agents raise ``ValueError``."""
    with pytest.raises(ValueError, match=r"^oracle tools must be read-only: delete_file$"):
        specialists.oracle(model="m", tools=[delete_file])
    with pytest.raises(ValueError, match=r"^oracle tools must be read-only: delete_file$"):
        specialists.oracle(model="m", root=project, skills=[Skill("cleanup", tools=[delete_file])])
    with pytest.raises(ValueError, match=r"^oracle tools must be read-only: delete_file$"):
        specialists.oracle(model="m", root=project, available_skills=[Skill("cleanup", tools=[delete_file])])
    with pytest.raises(ValueError, match=r"^oracle cannot have sub_agents$"):
        specialists.oracle(model="m", root=project, sub_agents=[Agent("helper")])
    with pytest.raises(ValueError, match=r"^oracle requires a model$"):
        specialists.oracle(model="", root=project)
    with pytest.raises(ValueError, match=r"^librarian cannot have sub_agents$"):
        specialists.librarian(repository="acme/widgets", model="m", sub_agents=[Agent("helper")])
    reader = ReadFileTool(project)
    custom = specialists.oracle(model="m", tools=[reader], skills=[Skill("notes", tools=[ListNotes])])
    assert custom.tools == (reader,) and [s.key for s in custom.skills] == ["notes"]


def test_read_file_caps_what_it_returns(project: Path) -> None:
    """``max_bytes`` caps one read; ``truncated`` says so. A missing file is a ``ToolError``."""
    reader = ReadFileTool(project, max_bytes=10)
    assert reader.call(make_context(), path="notes.txt") == {
        "path": "notes.txt",
        "content": "the answer",
        "bytes": 10,
        "truncated": True,
    }
    with pytest.raises(ToolError, match=r"^no such file: nope\.txt$"):
        reader.call(make_context(), path="nope.txt")
    with pytest.raises(ToolError, match=r"^path is outside the root: /etc/passwd$"):
        reader.call(make_context(), path="/etc/passwd")


# -- T106: the painter --------------------------------------------------------------------------------------------


class Gate:
    """An authorization gate that records every request it is asked about."""

    def __init__(self, verdict: Any) -> None:
        self.verdict = verdict
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: dict[str, Any], *, context: Any) -> Any:
        self.requests.append(request)
        return self.verdict


async def test_painter_gate_and_reference_limit(tk: TurnKit) -> None:
    """T106: with a gate returning false, ``paint_image`` raises ``ToolError`` and makes no call; more than
    ``max_reference_images`` references is a ``ToolValidationError`` (before the gate is asked)."""
    gate = Gate(False)
    client = ScriptedClient(
        [
            call_tools(("paint_image", {"prompt": "a cat"})),
            call_tools(("paint_image", {"prompt": "a cat", "reference_images": ["a", "b", "c"]})),
            "could not paint",
        ]
    )
    painter = specialists.painter(
        model="scripted", image_model="gpt-image-1", authorization=gate, max_reference_images=2, client=client
    )
    assert painter.name == "painter" and painter.inherit_globals is False
    assert client is painter.client
    run = await tk.run(painter, "paint a cat")
    assert run.status == "completed" and run.output_text == "could not paint"
    executions = await run.tool_executions()
    assert [(e.tool_name, e.status) for e in executions] == [("paint_image", "failed"), ("paint_image", "failed")]
    assert executions[0].error == {"message": NOT_AUTHORIZED, "details": {"class": "TurnKit::ToolError"}}
    assert executions[1].error == {
        "message": "too many reference images: 3 (at most 2)",
        "details": {"class": "TurnKit::ToolValidationError"},
    }
    assert client.paint_requests == [], "T106: a refused paint_image makes no image call"
    # Asked once, for the first call only: the second was refused on its references before reaching the gate.
    assert gate.requests == [
        {
            "prompt": "a cat",
            "reference_images": [],
            "mask": None,
            "model": "gpt-image-1",
            "provider": None,
            "size": None,
            "params": {},
        }
    ]
    [spec] = client.requests[0].tools
    assert spec.name == "paint_image" and spec.terminal is True


async def test_an_allowed_paint_ends_the_turn_with_the_image_message_id_and_no_base64(tk: TurnKit) -> None:
    """T106: when allowed, the painter paints and the terminal JSON holds ``image_message_id`` and no base64 data.
    A gate that answers something other than literally ``True`` denies."""
    data = b"\x89PNG\r\n\x1a\n" + b"dog pixels " * 50
    client = ScriptedClient([call_tools(("paint_image", {"prompt": "a dog"}))], images=[image(data)])
    painter = specialists.painter(
        model="scripted", image_model="scripted-image", authorization=Gate(True), client=client
    )
    run = await tk.run(painter, "paint")
    assert run.status == "completed", run.error
    [execution] = await run.tool_executions()
    assert execution.status == "completed" and execution.result is not None
    terminal = json.dumps(execution.result)
    assert base64.b64encode(data).decode()[:40] not in terminal and '"data"' not in terminal
    [image_message] = [
        m for m in await (await tk.load_conversation(run.record.conversation_id)).messages() if m.kind == "image"
    ]
    assert execution.result["image_message_id"] == image_message.id
    assert execution.result["conversation_id"] == run.record.conversation_id
    assert execution.result["image"]["byte_size"] == len(data)
    [request] = client.paint_requests
    assert (request.prompt, request.model) == ("a dog", "scripted-image")
    truthy = specialists.painter(model="m", authorization=Gate("yes")).tool("paint_image")
    assert truthy is not None
    with pytest.raises(ToolError, match=f"^{NOT_AUTHORIZED}$"):
        await truthy.call(make_context(), prompt="x", reference_images=[], mask=None)
    with pytest.raises(ValueError, match=r"^painter authorization must be a callable"):
        specialists.painter(model="m", authorization=True)  # type: ignore[arg-type]


# -- the librarian ------------------------------------------------------------------------------------------------


class GitHub:
    """A GitHub client standing in for ``api.github.com``: canned answers by URL, every request recorded."""

    def __init__(self, answers: Mapping[str, tuple[int, Any]]) -> None:
        self.answers = dict(answers)
        self.requests: list[tuple[str, dict[str, str]]] = []

    async def __call__(self, url: str, headers: Mapping[str, str]) -> tuple[int, Any]:
        self.requests.append((url, dict(headers)))
        return self.answers.get(url, (404, {"message": "Not Found"}))


async def test_the_librarian_reads_github_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """§9 environment: the librarian sends ``GITHUB_TOKEN`` by default, read when the call is made (in the worker
    that runs it); an explicit ``token`` wins, ``token=""`` sends none, and with neither no header is sent."""
    base = "https://api.github.com/repos/acme/widgets"
    github = GitHub({base: (200, {"full_name": "acme/widgets"})})
    by_default = specialists.librarian(repository="acme/widgets", model="m", github_client=github)
    explicit = specialists.librarian(repository="acme/widgets", model="m", github_client=github, token="mine")
    none = specialists.librarian(repository="acme/widgets", model="m", github_client=github, token="")
    monkeypatch.setenv("GITHUB_TOKEN", "from-env")  # after the agents were built: read at call time
    for agent in (by_default, explicit, none):
        reader = agent.tool("github_repository_read")
        assert reader is not None
        await reader.invoke({"operation": "repository"}, make_context())
    monkeypatch.delenv("GITHUB_TOKEN")
    await by_default.tool("github_repository_read").invoke({"operation": "repository"}, make_context())  # type: ignore[union-attr]
    sent = [headers.get("Authorization") for _, headers in github.requests]
    assert sent == ["Bearer from-env", "Bearer mine", None, None]


async def test_librarian_reads_one_repository_over_https() -> None:
    """§1.8: file content is base64-decoded; the result is ``{repository, operation, source, data}``; requests go to
    ``https://api.github.com`` with the token; redirects are refused; paths cannot climb out of the repository."""
    base = "https://api.github.com/repos/acme/widgets"
    encoded = base64.b64encode(b"# Widgets\n").decode()
    github = GitHub(
        {
            f"{base}/contents/README.md?ref=main": (
                200,
                {"path": "README.md", "encoding": "base64", "content": encoded},
            ),
            f"{base}/issues/7/comments?per_page=30": (200, [{"body": "fixed"}]),
            base: (301, {"message": "Moved Permanently"}),
        }
    )
    librarian = specialists.librarian(repository="acme/widgets", model="m", github_client=github, token="t0k")
    assert librarian.name == "librarian" and librarian.inherit_globals is False
    reader = librarian.tool("github_repository_read")
    assert isinstance(reader, GitHubRepositoryReadTool) and reader.read_only is True
    context = make_context()

    read = await reader.invoke({"operation": "file", "path": "README.md", "ref": "main"}, context)
    assert read == {
        "repository": "acme/widgets",
        "operation": "file",
        "source": f"{base}/contents/README.md?ref=main",
        "data": {"path": "README.md", "content": "# Widgets\n"},
    }
    comments = await reader.invoke({"operation": "comments", "number": 7}, context)
    assert comments["data"] == [{"body": "fixed"}]
    assert all(url.startswith("https://api.github.com/") for url, _ in github.requests)
    assert github.requests[0][1]["Authorization"] == "Bearer t0k"

    with pytest.raises(ToolError, match=r"^GitHub answered 301 \(a redirect\); redirects are not followed$"):
        await reader.invoke({"operation": "repository"}, context)
    with pytest.raises(ToolError, match=r"only https://api\.github\.com is allowed"):
        await reader.invoke({"operation": "file", "path": "../../../users/x"}, context)
    with pytest.raises(ToolValidationError, match=r"^missing required argument: number \(for issue\)$"):
        await reader.invoke({"operation": "issue"}, context)
    with pytest.raises(ToolError, match=r"^GitHub answered 404: Not Found$"):
        await reader.invoke({"operation": "issues"}, context)
    with pytest.raises(ValueError, match=r"^repository must be owner/name"):
        specialists.librarian(repository="https://evil.example/acme", model="m")
