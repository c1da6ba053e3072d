"""``TurnKitPlugin`` on a real worker: the application's payload codec is kept, and the sandbox's per-payload context
answers (``turnkit._temporal.sandbox_runner``) are the SDK's own, given without re-entering the sandbox."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import (
    ActivitySerializationContext,
    PayloadCodec,
    SerializationContext,
    WithSerializationContext,
    WorkflowSerializationContext,
)
from temporalio.testing import WorkflowEnvironment
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

import turnkit
import turnkit._temporal.sandbox_runner
from turnkit._temporal.sandbox_runner import DIRECT_CONTEXTS, TurnKitSandboxRunner
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit
from turnkit.store import Store
from turnkit.testing import ScriptedClient, call_tools


class RecordingCodec(PayloadCodec, WithSerializationContext):
    """A pass-through codec that records the serialization context of every payload it encodes or decodes."""

    def __init__(self, seen: list[SerializationContext | None], context: SerializationContext | None = None) -> None:
        self.seen = seen
        self.context = context

    def with_context(self, context: SerializationContext) -> RecordingCodec:
        return RecordingCodec(self.seen, context)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        self.seen.extend(self.context for _ in payloads)
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        self.seen.extend(self.context for _ in payloads)
        return list(payloads)


def _shape(context: SerializationContext | None, ids: dict[str, str]) -> tuple[Any, ...]:
    """A context with this run's ids replaced by their role, so two runs compare."""
    if isinstance(context, ActivitySerializationContext):
        return ("activity", context.activity_type, context.is_local, ids.get(context.workflow_id, context.workflow_id))
    if isinstance(context, WorkflowSerializationContext):
        return ("workflow", ids.get(context.workflow_id, context.workflow_id))
    return (type(context).__name__,)


async def _one_turn(temporal: WorkflowEnvironment, database_url: str) -> tuple[list[tuple[Any, ...]], int]:
    """One turn with a tool call through a client whose codec records contexts: the contexts seen (by role), and how
    many times the converter's questions entered the sandbox."""
    entries = 0
    instance_class = turnkit._temporal.sandbox_runner._SandboxInstance  # pyright: ignore[reportPrivateUsage]
    assert instance_class is not None
    run_code = instance_class._run_code  # pyright: ignore[reportPrivateUsage]

    def counting_run_code(self: Any, code: str, **extra: Any) -> None:
        nonlocal entries
        if "get_serialization_context" in code or "get_external_store_context" in code:
            entries += 1
        run_code(self, code, **extra)

    seen: list[SerializationContext | None] = []

    @turnkit.tool(recovery="replay_safe")
    async def lookup(q: str) -> str:
        """Look ``q`` up."""
        return f"found {q}"

    agent = turnkit.register(
        turnkit.Agent(
            f"plugin_{uuid.uuid4().hex[:8]}",
            model="scripted",
            tools=[lookup],
            client=ScriptedClient([call_tools(("lookup", {"q": "x"})), "done"]),
        )
    )
    store = await Store.open(database_url)
    try:
        address = temporal.client.service_client.config.target_host
        converter = dataclasses.replace(temporal.client.data_converter, payload_codec=RecordingCodec(seen))
        client = await Client.connect(address, data_converter=converter, plugins=[TurnKitPlugin(store)])
        assert client.data_converter.payload_codec is not None, "the plugin dropped the application's codec"
        tk = TurnKit(client, store, task_queue=f"tq-{uuid.uuid4().hex[:12]}")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(instance_class, "_run_code", counting_run_code)
            async with tk.worker():
                conversation = await tk.conversation(agent)
                turn = await conversation.ask("look x up")
        assert turn.status == "completed", turn.error
        assert turn.output_text == "done"
        ids = {conversation.id: "lane", turn.id: "turn"}
        return sorted(map(str, (_shape(context, ids) for context in seen))), entries  # type: ignore[return-value]
    finally:
        await store.close()


@pytest.mark.usefixtures("through_lanes")
async def test_the_codec_sees_the_sdks_contexts_without_the_sandbox_being_reentered(
    temporal: WorkflowEnvironment, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A codec that depends on the serialization context (per-workflow keys, say) gets exactly what Temporal's own
    sandbox runner gives it, for every payload of a turn with a tool call; the converter's questions no longer enter
    the sandbox (they did, ~60 times per such turn, with the SDK's runner)."""
    assert DIRECT_CONTEXTS, (
        "this temporalio release lacks what _temporal.sandbox_runner relies on: the sandbox is slower"
    )
    configured = TurnKitPlugin().configure_worker(
        {"client": temporal.client, "workflow_runner": SandboxedWorkflowRunner()}  # type: ignore[typeddict-item]
    )
    plugin_runner = configured["workflow_runner"]
    assert type(plugin_runner) is TurnKitSandboxRunner

    direct, direct_entries = await _one_turn(temporal, database_url)
    monkeypatch.setattr(turnkit._temporal.sandbox_runner, "_Answering", None)  # the SDK's own path, for comparison
    sdk, sdk_entries = await _one_turn(temporal, database_url)

    assert direct_entries == 0
    assert sdk_entries > 0
    assert direct == sdk
    assert "('activity', 'tool:lookup', False, 'turn')" in direct, direct
    assert "('activity', 'turnkit.model', False, 'turn')" in direct, direct
    assert "('workflow', 'lane')" in direct, direct
