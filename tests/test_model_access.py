"""Model access checked when a worker starts (issue 39): ``Agent(validate=True)``, ``settings.validate_models`` and
``worker.py --validate-models`` report a missing key or an unknown model as a ``ModelAccessError`` naming the agent and
the model, before the worker polls, instead of as a failed turn at the first model call.

The provider is the local wire-format server (:class:`tests.provider_server.ProviderServer`) speaking Gemini.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator

import pytest

import turnkit
from tests.engine import Engine
from tests.provider_server import ProviderServer, gemini_error
from tests.workers import ROOT
from turnkit.agent import registered_agents
from turnkit.kernel.errors import ModelAccessError
from turnkit.providers import GeminiClient
from turnkit.runtime import TurnKit


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as running:
        yield running


async def test_worker_start_validates_agents_that_ask_for_it(
    monkeypatch: pytest.MonkeyPatch, engine: Engine, server: ProviderServer
) -> None:
    """``Agent(validate=True)``: a missing key stops the worker's start with a ModelAccessError naming the agent and
    the model, without a provider call; other agents are not checked unless ``settings.validate_models``."""
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    keyless = GeminiClient(base_url=server.url)
    turnkit.register(turnkit.Agent("unchecked", model="gemini-a", client=keyless))
    turnkit.register(turnkit.Agent("checked", model="gemini-b", client=keyless, validate=True))
    with pytest.raises(
        ModelAccessError, match=r'^agent "checked": GEMINI_API_KEY or GOOGLE_API_KEY is required for gemini-b$'
    ):
        async with engine.tk.worker():
            pass
    assert server.requests == []

    # With a key, each (client, model) pair is looked up once; an unknown model stops the start.
    keyed = GeminiClient(api_key="g-key", base_url=server.url)
    turnkit.register(turnkit.Agent("unchecked", model="gemini-a", client=keyed))
    turnkit.register(turnkit.Agent("checked", model="gemini-b", client=keyed, validate=True))
    turnkit.register(turnkit.Agent("same-pair", model="gemini-b", client=keyed, validate=True))
    server.script({"name": "models/gemini-b"}, gemini_error(404, "models/gemini-a is not found", code="NOT_FOUND"))
    assert await turnkit.validate_models() == ["checked: gemini-b"]
    turnkit.configure(validate_models=True)
    with pytest.raises(
        ModelAccessError, match=r'^agent "unchecked": model gemini-a is not available: ClientError: 404'
    ):
        async with engine.tk.worker():
            pass
    server.script({"name": "models/gemini-a"}, {"name": "models/gemini-b"})
    async with engine.tk.worker():  # every model known: the worker starts
        pass
    assert [r.path.removeprefix("/v1beta/models/") for r in server.requests] == [
        "gemini-b",
        "gemini-a",
        "gemini-a",
        "gemini-b",
    ]


async def test_an_agent_registered_into_a_running_worker_is_validated_once(
    monkeypatch: pytest.MonkeyPatch, tk: TurnKit, server: ProviderServer
) -> None:
    """``tk.conversation(agent)`` with ``validate=True`` while the connection runs a worker: a missing key is refused
    before anything is written; a known model is looked up once, not at each conversation."""
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    keyless = turnkit.Agent("late", model="gemini-late", client=GeminiClient(base_url=server.url), validate=True)
    with pytest.raises(ModelAccessError, match=r'^agent "late": GEMINI_API_KEY or GOOGLE_API_KEY is required'):
        await tk.conversation(keyless)
    assert "late" not in registered_agents()

    keyed = turnkit.Agent(
        "late", model="gemini-late", client=GeminiClient(api_key="k", base_url=server.url), validate=True
    )
    server.script({"name": "models/gemini-late"})
    first = await tk.conversation(keyed)
    second = await tk.conversation(keyed)
    assert first.id != second.id
    assert [r.path for r in server.requests] == ["/v1beta/models/gemini-late"]


async def test_worker_process_with_validate_models_refuses_to_start(server: ProviderServer) -> None:
    """``worker.py --validate-models``: an unknown model stops the worker before it connects to anything (exit 2, the
    message on stderr, no traceback)."""
    server.script(gemini_error(404, "models/gemini-checked is not found", code="NOT_FOUND"))
    env = {**os.environ, "GEMINI_API_KEY": "g-key", "MODEL_ACCESS_BASE_URL": server.url}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "worker.py"),
        "--app",
        "tests.model_access_app",
        "--validate-models",
        cwd=str(ROOT),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        _out, err = await process.communicate()
    assert process.returncode == 2, err
    message = err.decode()
    assert 'agent "checked-at-start": model gemini-checked is not available: ClientError: 404' in message, message
    assert "Traceback" not in message
    assert [(r.method, r.path) for r in server.requests] == [("GET", "/v1beta/models/gemini-checked")]
