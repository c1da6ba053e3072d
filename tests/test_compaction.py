"""Context compaction (behaviour §3.10): policy, estimate, selection, projection, automatic and manual compaction."""

from __future__ import annotations

import asyncio
import gc
import itertools
import random
import signal
import tracemalloc
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

import turnkit
from tests.engine import Engine, HeldModel, turn_for_activities
from tests.request_client import start_client
from turnkit._activities.model import ModelActivities
from turnkit._engine.call_ids import provider_call_ids
from turnkit._engine.client_requests import compaction_message_id
from turnkit._engine.compaction import (
    DEFAULTS,
    SUMMARY_SECTIONS,
    active_messages,
    compaction_policy,
    estimate_tokens,
    message_tokens,
    select_for_compaction,
    should_compact,
    summary_request,
    summary_target_tokens,
)
from turnkit._engine.request import replay_messages
from turnkit._engine.transcripts import Transcripts
from turnkit.config import configure, settings
from turnkit.events import Event
from turnkit.kernel.errors import CompactionError, ConfigError, TransientModelError
from turnkit.kernel.payloads import ModelCall
from turnkit.kernel.records import MessageRecord
from turnkit.model import ModelRequest, Result
from turnkit.prompt import SUMMARY_PREAMBLE, SUMMARY_QUESTION, drop_unanswered_calls, project_messages
from turnkit.runtime import TurnKit
from turnkit.store import Store
from turnkit.testing import ScriptedClient, call_tools

# -- helpers ------------------------------------------------------------------------------------------------------

_seq = itertools.count(1)


def msg(role: str, kind: str = "text", content: list[dict[str, Any]] | None = None, **extra: Any) -> MessageRecord:
    sequence = extra.pop("sequence", None) or next(_seq)
    return MessageRecord(
        id=f"msg_{sequence}",
        conversation_id="conv_1",
        role=role,  # type: ignore[arg-type]
        kind=kind,  # type: ignore[arg-type]
        sequence=sequence,
        content=content if content is not None else [{"type": "text", "text": f"message {sequence}"}],
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        **extra,
    )


def text(role: str, body: str, sequence: int) -> MessageRecord:
    return msg(role, content=[{"type": "text", "text": body}], sequence=sequence)


def call(call_id: str, sequence: int) -> MessageRecord:
    part = {"type": "tool_call", "id": call_id, "name": "lookup", "arguments": {"q": "x"}}
    return msg("assistant", "tool_call", [part], sequence=sequence)


def result(call_id: str, sequence: int, body: str = '{"answer": "X"}') -> MessageRecord:
    part = {"type": "tool_result", "tool_call_id": call_id, "text": body}
    return msg("tool", "tool_result", [part], sequence=sequence)


def summary(body: str, sequence: int, start: int | None, end: int | None) -> MessageRecord:
    meta: dict[str, Any] = {}
    if start is not None:
        meta = {"replaces_from_sequence": start, "replaces_through_sequence": end}
    return msg(
        "assistant",
        "context_summary",
        [{"type": "text", "text": body}],
        sequence=sequence,
        metadata={"compaction": meta},
    )


def policy(**options: Any) -> dict[str, Any]:
    merged = compaction_policy(options)
    assert merged is not None
    return merged


# -- policy ---------------------------------------------------------------------------------------------------------


def test_policy_merges_defaults_settings_agent_and_overrides() -> None:
    assert compaction_policy() == dict(DEFAULTS)
    assert compaction_policy(True, None) == dict(DEFAULTS)
    merged = compaction_policy({"threshold": 0.5, "tail_messages": 3}, {"tail_messages": 4}, {"head_messages": 1})
    assert merged is not None
    assert (merged["threshold"], merged["tail_messages"], merged["head_messages"]) == (0.5, 4, 1)
    assert merged["context_limit"] == 128_000


@pytest.mark.parametrize(
    "layers", [(False,), ({"threshold": 0.5}, False), (False, {"threshold": 0.5}), ({"enabled": False},)]
)
def test_false_at_any_layer_disables(layers: tuple[Any, ...]) -> None:
    assert compaction_policy(*layers) is None


def test_unknown_keys_and_wrong_types_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown compaction option: tail_size"):
        compaction_policy({"tail_size": 3})
    with pytest.raises(ConfigError, match="unknown compaction option: bogus"):
        compaction_policy(False, {"bogus": 1})  # every layer is validated, even after a False
    with pytest.raises(ConfigError, match="compaction must be true, false or a mapping"):
        compaction_policy("yes")
    with pytest.raises(ConfigError, match="unknown compaction option: nope"):
        turnkit.Agent("a", compaction={"nope": 1})
    with pytest.raises(ConfigError, match="unknown compaction option: nope"):
        configure(compaction={"nope": 1})
    assert settings.compaction is True  # nothing changed


def test_agent_and_settings_options() -> None:
    assert turnkit.Agent("a").compaction is None
    assert turnkit.Agent("a", compaction=True).compaction is None
    assert turnkit.Agent("a", compaction=False).compaction is False
    options = {"threshold": 0.5}
    agent = turnkit.Agent("a", compaction=options)
    options["threshold"] = 0.9
    assert agent.compaction == {"threshold": 0.5}  # copied
    configure(compaction={"tail_messages": 2})
    assert settings.compaction == {"tail_messages": 2}
    configure(compaction=None)
    assert settings.compaction is True


# -- estimate and "when" --------------------------------------------------------------------------------------------


def test_estimate_is_ceil_chars_over_four_plus_eight() -> None:
    assert message_tokens(text("user", "", 1)) == 8
    assert message_tokens(text("user", "abcde", 2)) == 2 + 8
    assert message_tokens(text("user", "x" * 400, 3)) == 100 + 8
    # Tool results count their projected text, not only the (empty) text parts.
    assert message_tokens(result("c1", 4, "y" * 40)) == 10 + 8
    assert estimate_tokens([text("user", "abcd", 5), text("user", "abcd", 6)]) == 18


def test_threshold_rule() -> None:
    messages = [text("user", "x" * 368, 1)]  # 92 + 8 = 100 tokens
    assert should_compact(policy(context_limit=200, reserved_tokens=0, threshold=0.5), messages)
    assert not should_compact(policy(context_limit=200, reserved_tokens=0, threshold=0.51), messages)
    assert should_compact(policy(context_limit=100, reserved_tokens=500, threshold=1.0), messages)  # max(…, 1)
    assert not should_compact(policy(), messages)


# -- selection ----------------------------------------------------------------------------------------------------


def test_selection_keeps_head_and_tail_and_summarises_the_middle() -> None:
    messages = [text("user" if i % 2 else "assistant", f"m{i}", i) for i in range(1, 9)]
    selection = select_for_compaction(messages, policy(head_messages=2, tail_messages=3))
    assert selection is not None
    assert [m.sequence for m in selection.head] == [1, 2]
    assert [m.sequence for m in selection.middle] == [3, 4, 5]
    assert [m.sequence for m in selection.tail] == [6, 7, 8]
    assert (selection.replaces_from_sequence, selection.replaces_through_sequence) == (3, 5)
    assert selection.tail_start_sequence == 6


def test_tail_respects_tail_tokens_but_keeps_at_least_one_message() -> None:
    messages = [text("user", "x" * 400, i) for i in range(1, 5)]  # 108 tokens each
    selection = select_for_compaction(messages, policy(tail_tokens=10))
    assert selection is not None and [m.sequence for m in selection.tail] == [4]
    selection = select_for_compaction(messages, policy(tail_tokens=220))
    assert selection is not None and [m.sequence for m in selection.tail] == [3, 4]


def test_tail_keeps_a_tool_result_together_with_its_call() -> None:
    messages = [
        text("user", "start", 1),
        text("assistant", "ok", 2),
        call("c1", 3),  # two calls in one message, two result messages
        result("c1", 4),
        result("c2", 5),
        text("assistant", "done", 6),
    ]
    messages[2].content.append({"type": "tool_call", "id": "c2", "name": "lookup", "arguments": {}})
    selection = select_for_compaction(messages, policy(tail_messages=3))
    assert selection is not None
    # A 3-message tail would start at the result of c2; it extends back to the call.
    assert [m.sequence for m in selection.tail] == [3, 4, 5, 6]
    assert [m.sequence for m in selection.middle] == [1, 2]


def test_head_keeps_its_calls_results() -> None:
    messages = [call("c1", 1), result("c1", 2), text("user", "a", 3), text("user", "b", 4), text("user", "c", 5)]
    selection = select_for_compaction(messages, policy(head_messages=1, tail_messages=1))
    assert selection is not None
    assert [m.sequence for m in selection.head] == [1, 2]
    assert [m.sequence for m in selection.middle] == [3, 4]


def test_not_enough_messages() -> None:
    assert select_for_compaction([text("user", "only", 1)], policy()) is None
    two = [text("user", "a", 1), text("user", "b", 2)]
    assert select_for_compaction(two, policy(head_messages=1)) is None  # needs more than head + 1
    assert select_for_compaction(two, policy(tail_messages=12)) is None  # the tail takes everything
    assert select_for_compaction(two, policy(tail_messages=1)) is not None
    # A tail that must take in a whole tool exchange can leave an empty middle.
    assert select_for_compaction([call("c1", 1), result("c1", 2)], policy(tail_messages=1)) is None


def test_update_folds_the_previous_summary_into_the_new_range() -> None:
    messages = [text("user", f"m{i}", i) for i in range(1, 11)]
    messages.append(summary("old summary", 11, 2, 6))
    messages += [text("user", f"m{i}", i) for i in range(12, 16)]
    selection = select_for_compaction(messages, policy(head_messages=1, tail_messages=2))
    assert selection is not None
    assert [m.sequence for m in selection.middle] == [7, 8, 9, 10, 12, 13]
    assert [m.sequence for m in selection.previous] == [11]
    assert (selection.replaces_from_sequence, selection.replaces_through_sequence) == (2, 13)
    request, input_tokens = summary_request(selection, policy(), model="m", focus="billing")
    prompt = request.messages[-1]["content"]
    assert prompt.startswith("Update the anchored summary") and "old summary" in prompt
    assert "Focus on: billing." in prompt
    assert all(f"## {section}" in prompt for section in SUMMARY_SECTIONS)
    assert input_tokens == sum(message_tokens(m) for m in [*selection.middle, *selection.previous])


def test_summary_request_truncates_tool_output_and_offers_no_tools() -> None:
    messages = [text("user", "go", 1), call("c1", 2), result("c1", 3, "z" * 50), text("assistant", "ok", 4)]
    selection = select_for_compaction(messages, policy(tail_messages=1, tool_output_max_chars=10))
    assert selection is not None
    request, _ = summary_request(selection, policy(tool_output_max_chars=10), model="m", metadata={"turn_id": "t"})
    assert request.tools == [] and request.metadata == {"turn_id": "t", "compaction": True}
    tool = next(m for m in request.messages if m["role"] == "tool")
    assert tool["content"] == "z" * 10 + "\n[truncated 40 characters]"
    assert request.messages[-1]["content"].startswith("Create the anchored summary")
    assert summary_target_tokens(policy(), 100) == 1_000
    assert summary_target_tokens(policy(), 100_000) == 12_000
    assert summary_target_tokens(policy(), 20_000) == 4_000


# -- projection ---------------------------------------------------------------------------------------------------


def test_active_summaries_replace_their_range() -> None:
    """T32: a summary replacing 2..3 takes their place ([m1, summary, m4, …]) and is projected as "What did we do so
    far?" then the reference-only preamble; a newer summary whose range covers an older one hides it."""
    messages = [text("user", f"m{i}", i) for i in range(1, 7)]
    plain = list(messages)
    assert active_messages(plain) == plain
    older = summary("older", 7, 2, 3)
    newer = summary("newer", 9, 2, 5)
    unranged = summary("loose", 10, None, None)
    messages += [older, text("user", "m8", 8), newer, unranged]
    assert [m.sequence for m in active_messages(messages)] == [1, 9, 6, 8, 10]
    # Only the older summary: it replaces 2..3, placed where its range begins.
    assert [m.sequence for m in active_messages(messages[:8])] == [1, 7, 4, 5, 6, 8]
    projected = project_messages(active_messages(messages[:8]))
    assert [m["content"] for m in projected[:4]] == ["m1", SUMMARY_QUESTION, f"{SUMMARY_PREAMBLE}\n\nolder", "m4"]
    assert [m["role"] for m in projected[1:3]] == ["user", "assistant"]


# -- engine tests ---------------------------------------------------------------------------------------------------

_TAIL2 = {"tail_messages": 2}
_SMALL = {"context_limit": 200, "reserved_tokens": 0, "threshold": 0.5, "head_messages": 1, "tail_messages": 2}


def responder(summary_text: str, answers: list[Any]) -> ScriptedClient:
    """Compaction calls get ``summary_text``; main calls get ``answers`` in order."""
    queue = list(answers)

    def answer(request: ModelRequest) -> Result | str:
        if request.metadata.get("compaction"):
            return summary_text
        return queue.pop(0)

    return ScriptedClient(answer)


async def seeded(tk: TurnKit, agent: turnkit.Agent, notes: int = 6) -> turnkit.Conversation:
    conversation = await tk.conversation(agent)
    for i in range(notes):
        await conversation.say(f"note {i}: " + "x" * 200)
    return conversation


def contents(request: ModelRequest) -> list[str]:
    return [str(m.get("content") or "") for m in request.messages]


async def test_a_long_turn_compacts_before_its_model_call(tk: TurnKit) -> None:
    """T30: a turn over the small compaction threshold first calls the model with ``metadata["compaction"]`` set,
    appends one ``context_summary`` message, sends the main request with the summary question and summary in place of
    the middle messages, and charges both calls to the turn's usage."""
    events: list[Event] = []
    configure(on_event=events.append)
    client = responder("## Active Task\nThe notes.", ["answered"])
    agent = turnkit.Agent("compactor", model="scripted", client=client, compaction=_SMALL)
    conversation = await seeded(tk, agent)
    turn = await conversation.ask("go")

    assert turn.status == "completed", turn.error
    assert client.calls == 2
    first, second = client.requests
    assert first.metadata["compaction"] is True and first.tools == []
    assert first.metadata["request_id"] == second.metadata["request_id"]
    messages = await conversation.messages()
    assert [m.kind for m in messages].count("context_summary") == 1
    stored = next(m for m in messages if m.kind == "context_summary")
    assert (stored.role, stored.turn_id, stored.text) == ("assistant", turn.id, "## Active Task\nThe notes.")
    meta = stored.metadata["compaction"]
    # head = note 0 (seq 1), middle = notes 1..4 (seq 2..5), tail = note 5 and "go" (seq 6, 7).
    assert (meta["replaces_from_sequence"], meta["replaces_through_sequence"], meta["tail_start_sequence"]) == (2, 5, 6)
    assert meta["auto"] is True and meta["focus"] is None and meta["summary_model"] == "scripted"
    assert meta["created_for_turn_id"] == turn.id and meta["input_tokens"] > 0 and meta["summary_tokens"] > 0
    assert set(meta) >= {"created_at", "request_id"}
    # The main request has the summary (two messages) in place of the middle; nothing was deleted.
    sent = contents(second)
    assert sent[0].startswith("note 0") and sent[1] == SUMMARY_QUESTION
    assert sent[2] == f"{SUMMARY_PREAMBLE}\n\n## Active Task\nThe notes."
    assert sent[3].startswith("note 5") and sent[4] == "go" and len(sent) == 5
    assert [m.text.split(":")[0] for m in messages if m.kind == "text" and m.role == "user"][:6] == [
        f"note {i}" for i in range(6)
    ]
    # Both calls are charged to the turn.
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (20, 10)
    types = [e.type for e in events]
    assert types.index("compaction.model.requested") < types.index("compaction.model.completed")
    assert types.index("compaction.model.completed") < types.index("model.requested")


async def test_below_the_threshold_nothing_changes(tk: TurnKit) -> None:
    client = ScriptedClient(["answered"])
    agent = turnkit.Agent("compactor", model="scripted", client=client)
    conversation = await seeded(tk, agent)
    turn = await conversation.ask("go")
    assert turn.status == "completed" and client.calls == 1
    assert len(client.requests[0].messages) == 7


@pytest.mark.parametrize("switch", ["global", "per_turn"])
async def test_disabled_compaction_makes_one_call(tk: TurnKit, switch: str) -> None:
    """T31: with ``TurnKit.compaction = false`` (``configure(compaction=False)``), or a per-turn ``compact=False``
    over an agent policy that would compact, a long history gets exactly 1 client call, the turn's own, with the
    whole uncompacted history, and no summary is created."""
    if switch == "global":
        configure(compaction=False)
    client = ScriptedClient(["answered"])
    conversation = await seeded(tk, turnkit.Agent("compactor", model="scripted", client=client, compaction=_SMALL))
    before = len(await conversation.messages())
    turn = await conversation.ask("go", compact=False if switch == "per_turn" else None)
    assert turn.status == "completed" and turn.output_text == "answered" and client.calls == 1
    [request] = client.requests
    assert not request.metadata.get("compaction"), "T31: the one call must be the turn's, not a summariser's"
    assert len(request.messages) == before + 1 and SUMMARY_QUESTION not in contents(request)
    assert "context_summary" not in [m.kind for m in await conversation.messages()]
    assert turn.usage.total_tokens == 15  # one call's usage: nothing charged for a summary


async def test_an_empty_automatic_summary_is_swallowed(tk: TurnKit) -> None:
    client = responder("  ", ["answered"])
    conversation = await seeded(tk, turnkit.Agent("compactor", model="scripted", client=client, compaction=_SMALL))
    turn = await conversation.ask("go")
    assert turn.status == "completed" and turn.output_text == "answered"
    assert client.calls == 2
    assert SUMMARY_QUESTION not in contents(client.requests[1]) and len(client.requests[1].messages) == 7
    assert "context_summary" not in [m.kind for m in await conversation.messages()]


async def test_a_retried_model_activity_does_not_summarise_twice(engine: Engine) -> None:
    tk = engine.tk
    compactions: list[ModelRequest] = []
    attempts: list[ModelRequest] = []

    def answer(request: ModelRequest) -> Result | str:
        if request.metadata.get("compaction"):
            compactions.append(request)
            return "summary"
        attempts.append(request)
        if len(attempts) == 1:
            raise RuntimeError("worker lost")  # not a ModelError: Temporal would retry the activity
        return call_tools(("lookup", {"q": "x"}))

    agent = turnkit.Agent("compactor", model="scripted", client=ScriptedClient(answer), compaction=_SMALL)
    conversation = await seeded(tk, agent)
    record = await turn_for_activities(tk, conversation, "go")
    model_call = ModelCall(turn_id=record.id, root_turn_id=record.id, request_id="req_1", iteration=1)
    activities = ModelActivities(tk.store)
    env = ActivityEnvironment()

    with pytest.raises(RuntimeError, match="worker lost"):
        await env.run(activities.model, model_call)
    step = await env.run(activities.model, model_call)  # the retry

    assert len(step.tool_calls) == 1
    assert len(compactions) == 1 and len(attempts) == 2
    assert SUMMARY_QUESTION in contents(attempts[1])
    summaries = [m for m in await conversation.messages() if m.kind == "context_summary"]
    assert len(summaries) == 1 and summaries[0].metadata["compaction"]["request_id"] == "req_1"
    turn = await tk.store.load_turn(record.id)
    assert turn.options.state.iterations == 1
    assert turn.usage["input_tokens"] == 20  # the compaction call and the main call, each charged once

    # A zombie attempt that read the history before the summary was written writes no second one.
    turn = await tk.store.load_turn(record.id)
    before = await tk.store.list_messages(conversation.id, through_sequence=record.context_message_sequence)
    kept, denial, _ = await env.run(activities._auto_compact, model_call, turn, agent, before)  # pyright: ignore[reportPrivateUsage]
    assert denial is None and kept[-1].id == summaries[0].id
    assert len([m for m in await conversation.messages() if m.kind == "context_summary"]) == 1


async def test_manual_compaction(tk: TurnKit) -> None:
    client = responder("## Active Task\nManual.", ["answered"])
    conversation = await seeded(
        tk,
        turnkit.Agent(
            "compactor", model="scripted", client=client, compaction={"head_messages": 1, "tail_messages": 2}
        ),
    )
    stored = await conversation.compact(focus="the notes", model="summariser")
    assert stored.kind == "context_summary" and stored.turn_id is None
    meta = stored.metadata["compaction"]
    assert meta["auto"] is False and meta["focus"] == "the notes" and meta["summary_model"] == "summariser"
    assert (meta["replaces_from_sequence"], meta["replaces_through_sequence"], meta["tail_start_sequence"]) == (2, 4, 5)
    assert client.requests[0].model == "summariser"
    assert "Focus on: the notes." in contents(client.requests[0])[-1]

    turn = await conversation.ask("go")  # the default policy does not compact again; the summary is projected
    assert turn.status == "completed" and client.calls == 2
    sent = contents(client.requests[1])
    assert sent[1] == SUMMARY_QUESTION and sent[2].endswith("Manual.")
    assert [s.split(":")[0] for s in sent[3:]] == ["note 4", "note 5", "go"]


async def test_manual_compaction_errors(tk: TurnKit) -> None:
    """T33: a manual ``compact()`` whose compaction model returns "" raises ``CompactionError`` "compaction model
    returned an empty summary"; disabled compaction, too few messages and a failing model raise their own errors, and
    no summary is stored."""
    disabled = await seeded(tk, turnkit.Agent("off", model="scripted", client=ScriptedClient([]), compaction=False))
    with pytest.raises(CompactionError, match="compaction is disabled"):
        await disabled.compact()

    short = await seeded(tk, turnkit.Agent("short", model="scripted", client=ScriptedClient([])), notes=1)
    with pytest.raises(CompactionError, match="not enough messages to compact"):
        await short.compact()

    empty = await seeded(tk, turnkit.Agent("empty", model="scripted", client=ScriptedClient([""]), compaction=_TAIL2))
    with pytest.raises(CompactionError, match="compaction model returned an empty summary"):
        await empty.compact()

    broken = await seeded(tk, turnkit.Agent("broken", model="scripted", client=ScriptedClient([]), compaction=_TAIL2))
    with pytest.raises(CompactionError, match="compaction failed: scripted client has no more results"):
        await broken.compact()
    assert not [m for c in (empty, broken) for m in await c.messages() if m.kind == "context_summary"]


async def test_a_compaction_outlives_its_client_and_asking_again_finds_it(tk: TurnKit, engine: Engine) -> None:
    """``Conversation.compact(key=…)`` from a client process SIGKILLed while the summariser answers: the compaction
    workflow appends the summary without the client, and no operator is needed. Asked again with the same key by
    another client, the request returns that summary: the summariser was called once in all. Its call is the
    ``turnkit.compact`` activity of the request's workflow."""
    held = HeldModel(Result.build(text="## Active Task\nHeld."), then="never")
    conversation = await seeded(tk, turnkit.Agent("held-compactor", model="scripted", client=held, compaction=_TAIL2))
    client = await start_client(engine, "compact", conversation.id, "--key", "nightly")
    await asyncio.wait_for(held.entered.wait(), 30)
    client.send_signal(signal.SIGKILL)
    assert await client.wait() == -signal.SIGKILL
    assert not [m for m in await conversation.messages() if m.kind == "context_summary"]  # nothing yet
    held.released.set()

    message_id = compaction_message_id(conversation.id, "nightly")
    handle = tk.client.get_workflow_handle(f"compact-{message_id}", result_type=str)
    assert await handle.result() == message_id
    [summary] = [m for m in await conversation.messages() if m.kind == "context_summary"]
    assert summary.id == message_id and summary.text == "## Active Task\nHeld." and summary.turn_id is None
    again = await conversation.compact(key="nightly")
    assert again.id == message_id and len(held.requests) == 1
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in (await handle.fetch_history()).events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled == ["turnkit.compact"]


@pytest.mark.parametrize("seed", range(4))
async def test_a_compaction_whose_client_died_at_any_moment_is_done_once(
    tk: TurnKit, engine: Engine, seed: int
) -> None:
    """The client process that asks for ``compact(key=…)`` is SIGKILLed at a moment drawn from ``seed`` (0 to 6 ms
    after it was told to go: before its request left it, or after). The same request asked again by another client
    then leaves exactly one summary, and the summariser was called exactly once: whatever the dead client had
    started was finished or found, never half done and never paid twice."""
    client = ScriptedClient(["## Active Task\nOnce."])  # a second call would raise: the script has one answer
    conversation = await seeded(tk, turnkit.Agent(f"once-{seed}", model="scripted", client=client, compaction=_TAIL2))
    process = await start_client(engine, "compact", conversation.id, "--key", "once")
    await asyncio.sleep(random.Random(seed).uniform(0.0, 0.006))  # the fault's moment, not a wait for a state
    with suppress(ProcessLookupError):  # it may have finished its request already
        process.send_signal(signal.SIGKILL)
    await process.wait()

    summary = await conversation.compact(key="once")
    assert summary.id == compaction_message_id(conversation.id, "once") and summary.text == "## Active Task\nOnce."
    assert [m.id for m in await conversation.messages() if m.kind == "context_summary"] == [summary.id]
    assert client.calls == 1


async def test_a_manual_compactions_call_is_retried_by_temporal(tk: TurnKit) -> None:
    """A summariser that is overloaded once (``TransientModelError``) is asked again by the activity's retry, and one
    summary is appended; one that stays overloaded fails the request with ``compaction failed: <cause>`` once the
    attempts (``model_max_attempts``) ran out, and appends nothing."""
    configure(model_max_attempts=2)
    answers: list[Exception | str] = [TransientModelError("overloaded"), "## Active Task\nRetried."]

    def flaky(request: ModelRequest) -> str:
        answer = answers.pop(0) if answers else TransientModelError("still overloaded")
        if isinstance(answer, Exception):
            raise answer
        return answer

    client = ScriptedClient(flaky)
    agent = turnkit.Agent("flaky-compactor", model="scripted", client=client, compaction=_TAIL2)
    conversation = await seeded(tk, agent)
    summary = await conversation.compact()
    assert summary.text == "## Active Task\nRetried." and client.calls == 2
    unlucky = await seeded(tk, agent)
    with pytest.raises(CompactionError, match=r"^compaction failed: still overloaded$"):
        await unlucky.compact()
    assert client.calls == 4
    assert not [m for m in await unlucky.messages() if m.kind == "context_summary"]


async def test_ask_compact_forces_or_disables_compaction(tk: TurnKit) -> None:
    """``ask(compact=True)`` compacts before the first model call although the history is below the threshold;
    ``ask(compact=False)`` never compacts, although the agent's policy would."""
    forced_client = responder("## Active Task\nForced.", ["forced answer"])
    forced = await seeded(tk, turnkit.Agent("forced", model="scripted", client=forced_client, compaction=_TAIL2))
    turn = await forced.ask("go", compact=True)
    assert turn.status == "completed" and forced_client.calls == 2
    assert forced_client.requests[0].metadata["compaction"] is True
    assert SUMMARY_QUESTION in contents(forced_client.requests[1])
    assert turn.record.options.compact is True

    kept_client = responder("never", ["kept answer"])
    kept = await seeded(tk, turnkit.Agent("kept", model="scripted", client=kept_client, compaction=_SMALL))
    turn = await kept.ask("go", compact=False)
    assert turn.status == "completed" and kept_client.calls == 1
    assert "context_summary" not in [m.kind for m in await kept.messages()]
    with pytest.raises(turnkit.InputError, match="compact must be True, False or None"):
        await kept.ask("go", compact="yes")  # type: ignore[arg-type]


# -- the transcript a worker keeps (issue 37 target 4) ---------------------------------------------------------------

_KEEPER = {"context_limit": 500, "reserved_tokens": 0, "threshold": 0.5, "head_messages": 1, "tail_messages": 4}


def keeper_agent(name: str = "keeper") -> tuple[turnkit.Agent, ScriptedClient]:
    """An agent that compacts every few turns; compaction calls get a numbered summary, main calls ``answer N``."""
    summaries = itertools.count(1)
    answers = itertools.count(1)

    def answer(request: ModelRequest) -> Result | str:
        if request.metadata.get("compaction"):
            return f"## Active Task\nsummary {next(summaries)}"
        if str(request.messages[-1].get("content")).startswith("use a tool"):
            return call_tools(("lookup", {"q": "x"}))
        return f"answer {next(answers)}"

    client = ScriptedClient(answer)
    return turnkit.Agent(name, model="scripted", client=client, compaction=_KEEPER), client


async def seeded_with_calls(tk: TurnKit, agent: turnkit.Agent) -> turnkit.Conversation:
    """A conversation whose history holds notes, a tool call and its result."""
    conversation = await tk.conversation(agent)
    await conversation.say("note: " + "x" * 40)
    call_part = {"type": "tool_call", "id": "call_1", "name": "lookup", "arguments": {"q": "x"}, "provider_id": "p1"}
    await tk.store.append_message(conversation.id, role="assistant", kind="tool_call", content=[call_part])
    result_part = {"type": "tool_result", "tool_call_id": "call_1", "text": '{"answer": "X"}'}
    await tk.store.append_message(conversation.id, role="tool", kind="tool_result", content=[result_part])
    return conversation


async def sent_from_a_fresh_read(tk: TurnKit, request: ModelRequest) -> list[dict[str, Any]]:
    """The messages a model request of the turn in ``request.metadata`` sends when built from the store afresh, as
    before transcripts were kept: every message the turn saw then (those before its response), projected again."""
    turn = await tk.store.load_turn(request.metadata["turn_id"])
    async with tk.store.atomic() as tx:
        response = await tx.find_response(turn.id, request.metadata["request_id"])
    assert response is not None
    stored = await tk.store.list_messages(
        turn.conversation_id, through_sequence=turn.context_message_sequence, turn_id=turn.id
    )
    seen = [m for m in stored if m.sequence < response.sequence]
    return provider_call_ids(drop_unanswered_calls(project_messages(active_messages(seen))))


async def ask_directly(tk: TurnKit, activities: ModelActivities, conversation: turnkit.Conversation, text: str) -> None:
    """One turn of ``text`` in ``conversation``, its model activity run by ``activities`` (a worker's)."""
    record = await turn_for_activities(tk, conversation, text)
    call = ModelCall(turn_id=record.id, root_turn_id=record.id, request_id=f"req_{record.id}", iteration=1)
    step = await ActivityEnvironment(client=tk.client).run(activities.model, call)
    assert step.outcome == "completed", step


async def ask_with_a_tool(
    tk: TurnKit,
    workers: tuple[ModelActivities, ModelActivities],
    conversation: turnkit.Conversation,
    text: str,
    *,
    meanwhile: str,
) -> None:
    """A 2-iteration turn of ``text`` (which must start with "use a tool"): its first model call on ``workers[0]``,
    its tool result appended (as the tool activity does), then a whole turn of ``meanwhile`` on ``workers[1]``
    (after the first turn's context: not its own), then the first turn's second model call on ``workers[1]``, whose
    kept transcript now reaches past that turn's context."""
    record = await turn_for_activities(tk, conversation, text)
    env = ActivityEnvironment(client=tk.client)
    first = ModelCall(turn_id=record.id, root_turn_id=record.id, request_id=f"req_{record.id}_1", iteration=1)
    step = await env.run(workers[0].model, first)
    assert step.outcome == "tools" and len(step.tool_calls) == 1, step
    part = {"type": "tool_result", "tool_call_id": step.tool_calls[0].id, "text": '{"answer": "looked up"}'}
    await tk.store.append_message(conversation.id, role="tool", kind="tool_result", content=[part], turn_id=record.id)
    await ask_directly(tk, workers[1], conversation, meanwhile)
    second = ModelCall(turn_id=record.id, root_turn_id=record.id, request_id=f"req_{record.id}_2", iteration=2)
    step = await env.run(workers[1].model, second)
    assert step.outcome == "completed", step


async def test_a_kept_transcript_sends_what_a_fresh_read_would(engine: Engine) -> None:
    """Over a long conversation with a tool call in its history and automatic compactions every few turns, each
    model request a worker sends from its kept transcript equals the one built from a fresh read of the store, warm
    or cold (every fifth turn on a new worker); and a warm call reads only the few messages appended since."""
    tk = engine.tk
    agent, client = keeper_agent()
    conversation = await seeded_with_calls(tk, agent)
    warm = ModelActivities(tk.store)
    warm_reads: list[int] = []
    for i in range(40):
        worker = warm if i % 5 else ModelActivities(tk.store)
        before = warm.transcripts.rows_read
        await ask_directly(tk, worker, conversation, f"question {i}")
        if worker is warm and i % 5 != 1:  # right after a cold turn, the warm one also reads that turn's messages
            warm_reads.append(warm.transcripts.rows_read - before)

    stored = await conversation.messages()
    assert len([m for m in stored if m.kind == "context_summary"]) >= 4, "the policy must compact several times"
    main = [r for r in client.requests if not r.metadata.get("compaction")]
    assert len(main) == 40
    for request in main:
        assert request.messages == await sent_from_a_fresh_read(tk, request), request.metadata
    # After a compaction the request shows the summary in place of the middle, from the kept transcript too.
    assert SUMMARY_QUESTION in contents(main[-1]) and len(main[-1].messages) < len(stored) / 3
    # A warm call read the last kept message again, the previous answer (and summary) and its question: never more.
    assert warm_reads and max(warm_reads) <= 4, warm_reads
    # It keeps what its last call read: through that turn's question (its summary and answer came after).
    assert warm.transcripts.kept_through(conversation.id) == next(m.sequence for m in stored if m.text == "question 39")


async def test_a_kept_transcript_sums_and_finds_as_a_pass_over_its_messages(engine: Engine) -> None:
    """Issue 37 target 4: a transcript's projections, token estimate, whether it holds a summary and its delivered
    messages come from the kept prefix's (taken whole, a running sum, positions) plus a pass over the rest; they
    equal a pass over every message for a turn's view cut anywhere, before, inside and after what is kept, with
    summaries and deliveries on both sides of the cut."""
    tk = engine.tk
    agent, _ = keeper_agent("keeper_sums")
    conversation = await seeded_with_calls(tk, agent)
    transcripts = ModelActivities(tk.store).transcripts

    async def say(count: int, start: int) -> None:
        for i in range(start, start + count):
            await conversation.say(f"said {i}", metadata={"delivery_id": f"delivery_{i}"} if i % 3 == 0 else None)
        await tk.store.append_message(conversation.id, role="assistant", kind="context_summary", text=f"sum {start}")

    async def check_every_cut() -> None:
        stored = await conversation.messages()
        for through in range(stored[0].sequence - 1, stored[-1].sequence + 2):
            async with tk.store.atomic() as tx:
                read = await transcripts.read(tx, conversation.id, through_sequence=through, turn_id="turn_none")
            assert [m.id for m in read.messages] == [m.id for m in stored if m.sequence <= through]
            assert read.total_tokens() == estimate_tokens(read.messages, message_tokens), through
            assert read.has_summary() == any(m.kind == "context_summary" for m in read.messages), through
            for sent in (read.messages, active_messages(read.messages)):  # the prefix itself, and summaries' places
                assert read.project_all(sent) == project_messages(sent), through
            assert [m.id for m in read.delivered()] == [m.id for m in read.messages if m.metadata.get("delivery_id")], (
                through
            )

    await say(5, 0)
    await check_every_cut()  # the first read keeps the whole conversation; the next ones cut inside it
    await say(7, 5)
    await check_every_cut()  # the first read adds what was said since, the next ones cut inside and after


async def test_a_kept_transcript_replays_what_the_passes_over_every_message_make(engine: Engine) -> None:
    """Issue 37 target 4: the request's messages a transcript replays from its kept prefix (unanswered calls left
    out, the provider's call ids put back), their characters and whether one references media equal what the passes
    over every message make, for a turn's view cut anywhere, before, inside and after what is kept. The history has
    a renamed call, a call answered only later, one never answered, a message with media and a summary."""
    tk = engine.tk
    agent, _ = keeper_agent("keeper_replay")
    conversation = await seeded_with_calls(tk, agent)  # call_1, renamed (the provider's p1), answered at once
    transcripts = ModelActivities(tk.store).transcripts

    async def call(call_id: str) -> None:
        part = {"type": "tool_call", "id": call_id, "name": "lookup", "arguments": {"q": call_id}}
        await tk.store.append_message(conversation.id, role="assistant", kind="tool_call", content=[part])

    async def answer(call_id: str) -> None:
        part = {"type": "tool_result", "tool_call_id": call_id, "text": f'{{"answer": "{call_id}"}}'}
        await tk.store.append_message(conversation.id, role="tool", kind="tool_result", content=[part])

    changed = {"dropped": False, "renamed": False, "media": False, "none": False}

    async def check_every_cut() -> None:
        stored = await conversation.messages()
        # From the last cut down: the first read's view holds what was not kept yet (all of it, the first time).
        for through in range(stored[-1].sequence + 1, stored[0].sequence - 2, -1):
            async with tk.store.atomic() as tx:
                read = await transcripts.read(tx, conversation.id, through_sequence=through, turn_id="turn_none")
            replay = read.replay(read.messages)
            full = replay_messages(read.messages)
            assert replay.messages == full, through
            assert replay.chars == sum(len(str(m.get("content") or "")) for m in full), through
            assert replay.media == any(m.get("media") for m in full), through
            projected = project_messages(read.messages)
            changed["dropped"] |= drop_unanswered_calls(projected) != projected
            changed["renamed"] |= provider_call_ids(projected) != projected
            changed["media"] |= replay.media
            changed["none"] |= full == projected

    await call("call_2")  # answered only after a few more messages
    await conversation.say("between")
    media_part = {"type": "media", "media_id": "media_1", "kind": "image", "mime_type": "image/png"}
    await tk.store.append_message(conversation.id, role="user", kind="text", content=[media_part])
    await check_every_cut()  # the first read keeps the whole conversation; the next ones cut inside it
    await answer("call_2")
    await call("call_3")  # never answered
    await conversation.say("after")
    await check_every_cut()  # the first read adds what came since (its view holds it), the next ones cut inside
    await tk.store.append_message(conversation.id, role="assistant", kind="context_summary", text="sum")
    await conversation.say("past the summary")
    await check_every_cut()
    assert all(changed.values()), changed  # each pass was needed somewhere, and somewhere none was


async def test_a_request_cannot_change_the_transcript_its_worker_keeps(tk: TurnKit) -> None:
    """Issue 37 target 4: a request's messages are the worker's kept ones, not copies. Over turns run by a worker on
    Temporal, a client that changes one in place gets a ``TypeError`` that says what to do instead, and the
    conversation's next requests are sent as stored; the ``model.requested`` report's ``message_chars`` is what a
    pass over the sent messages counts."""
    events: list[Event] = []
    configure(on_event=events.append)
    refused: list[str] = []

    def answer(request: ModelRequest) -> str:
        try:
            request.messages[0]["content"] = "changed by the client"
        except TypeError as err:
            refused.append(str(err))
        return "ok"

    client = ScriptedClient(answer)
    agent = turnkit.Agent("keeper_read_only", model="scripted", client=client)
    conversation = await seeded_with_calls(tk, agent)
    for i in range(3):
        turn = await conversation.ask(f"question {i}")
        assert turn.status == "completed", turn.error

    assert len(refused) == 3 and "build a new dict" in refused[0], refused
    for request in client.requests:
        assert request.messages[0]["content"] == "note: " + "x" * 40
        assert request.messages == await sent_from_a_fresh_read(tk, request)
    reported = [e.payload["prompt"]["message_chars"] for e in events if e.type == "model.requested"]
    assert reported == [sum(len(str(m.get("content") or "")) for m in r.messages) for r in client.requests]


async def test_kept_transcripts_stay_within_their_memory_budget(engine: Engine) -> None:
    """Issue 37 target 4: what a worker keeps of its conversations is bounded in memory. The estimate the bound reads
    is within a factor of two of what ``tracemalloc`` measures of a kept conversation, of short messages or long;
    past the budget the least recently read conversation is dropped, and its next read reads it whole."""
    tk = engine.tk
    agent, _ = keeper_agent("keeper_budget")

    async def conversation_of(size: int, count: int) -> turnkit.Conversation:
        conversation = await tk.conversation(agent)
        for i in range(count):
            await tk.store.append_message(conversation.id, role="user", kind="text", text=f"{i} " + "y" * size)
        return conversation

    async def read(transcripts: Transcripts, conversation: turnkit.Conversation) -> None:
        async with tk.store.atomic() as tx:
            await transcripts.read(tx, conversation.id, through_sequence=10**9, turn_id="turn_none")

    await read(Transcripts(), await conversation_of(10, 2))  # the statements' caches, made before measuring
    for size in (10, 5_000):
        conversation = await conversation_of(size, 200)
        transcripts = Transcripts()
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            await read(transcripts, conversation)
            gc.collect()
            measured = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert 0.5 <= measured / transcripts.size <= 2, (size, measured, transcripts.size)

    first, second = await conversation_of(10, 30), await conversation_of(10, 30)
    one = Transcripts()
    await read(one, first)
    transcripts = Transcripts(max_bytes=one.size * 3 // 2)  # room for one of them
    await read(transcripts, first)
    await read(transcripts, second)
    assert transcripts.kept_through(first.id) is None and transcripts.kept_through(second.id) is not None
    assert transcripts.size <= transcripts.max_bytes
    before = transcripts.rows_read
    await read(transcripts, first)
    assert transcripts.rows_read - before == 30  # read whole again, and kept in the other's place
    assert transcripts.kept_through(first.id) is not None and transcripts.kept_through(second.id) is None


async def test_a_kept_transcript_is_never_stale(engine: Engine) -> None:
    """A worker's kept transcript never hides what another wrote: turns served by a second worker on its own store
    handle, and messages the application said meanwhile, are in the next request; messages a transaction read but
    rolled back are never kept; and a kept prefix that no longer matches the store is dropped and read whole."""
    tk = engine.tk
    agent, client = keeper_agent("keeper_two")
    conversation = await seeded_with_calls(tk, agent)
    other_store = await Store.open(engine.database_url)  # a second worker process's own store
    try:
        first, second = ModelActivities(tk.store), ModelActivities(other_store)
        for i in range(12):
            await ask_directly(tk, first if i % 3 else second, conversation, f"question {i}")
            if i % 4 == 3:
                await conversation.say(f"aside {i}")
        # A turn's second call shows its own tool result, kept or not, and not what was said after its context.
        await ask_with_a_tool(tk, (first, first), conversation, "use a tool, 1", meanwhile="not for turn 1")
        await ask_with_a_tool(tk, (first, second), conversation, "use a tool, 2", meanwhile="not for turn 2")
    finally:
        await other_store.close()
    main = [r for r in client.requests if not r.metadata.get("compaction")]
    assert len(main) == 18
    for request in main:
        assert request.messages == await sent_from_a_fresh_read(tk, request), request.metadata
    # Turn 3 ran on the second worker; turn 4, on the first, shows its answer and the aside said after it.
    assert [contents(main[4])[-3:]] == [["answer 4", "aside 3", "question 4"]]
    for second_call, said in ((main[14], "not for turn 1"), (main[17], "not for turn 2")):
        shown = contents(second_call)
        assert shown[-1] == '{"answer": "looked up"}' and said not in shown
        assert shown[-3].startswith("use a tool")  # its question, then its call and its result
    assert contents(main[13])[-1] == "not for turn 1"  # the turn in between saw the first one's call and result

    # A read inside a transaction that rolls back keeps nothing, not even the rows that were committed.
    transcripts = first.transcripts
    kept = transcripts.kept_through(conversation.id)
    assert kept is not None

    class TakenBack(Exception):
        pass

    with pytest.raises(TakenBack):
        async with tk.store.atomic(conversation_id=conversation.id) as tx:
            await tx.append_message(conversation.id, role="user", text="taken back")
            read = await transcripts.read(tx, conversation.id, through_sequence=10**9, turn_id="turn_none")
            assert read.messages[-1].text == "taken back"
            raise TakenBack
    assert transcripts.kept_through(conversation.id) == kept
    await conversation.say("said after")
    async with tk.store.atomic() as tx:
        read = await transcripts.read(tx, conversation.id, through_sequence=10**9, turn_id="turn_none")
    assert "taken back" not in [m.text for m in read.messages] and read.messages[-1].text == "said after"
    assert transcripts.kept_through(conversation.id) == read.messages[-1].sequence

    # A kept prefix whose last message is not the store's (a database replaced under the worker) is read whole.
    entry = transcripts._kept[conversation.id]  # pyright: ignore[reportPrivateUsage]
    entry.messages[-1] = entry.messages[-1].model_copy(update={"id": "message_elsewhere"})
    before = transcripts.rows_read
    async with tk.store.atomic() as tx:
        read = await transcripts.read(tx, conversation.id, through_sequence=10**9, turn_id="turn_none")
    stored = await conversation.messages()
    assert [m.id for m in read.messages] == [m.id for m in stored]
    assert transcripts.rows_read - before == len(stored)  # the whole conversation, read again
    assert transcripts.kept_through(conversation.id) == stored[-1].sequence
