"""Input rules at the API (issue 8 items 1, 12, 13), on SQLite and PostgreSQL: a clear ``InputError`` naming the
field, raised before anything is sent to Temporal or written to the store.

These tests need no worker: a rejected call must not reach one. Each checks that nothing was written (no message,
no turn, no delivery, no conversation) and that no lane workflow was started.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import func, select

import turnkit
from tests.engine import Engine, lane_exists
from turnkit._engine.validation import MAX_KEY_CHARS, MAX_NAME_CHARS, check_json, check_name
from turnkit.config import configure, settings
from turnkit.handles import Conversation
from turnkit.kernel.errors import ConfigError, InputError
from turnkit.runtime import TurnKit
from turnkit.store.rows import canonical_json
from turnkit.store.schema import ConversationRow, DeliveryRow
from turnkit.testing import ScriptedClient


def _agent(name: str | None = None, **options: Any) -> turnkit.Agent:
    return turnkit.Agent(name or f"v-{uuid.uuid4().hex[:8]}", model="scripted", client=ScriptedClient([]), **options)


async def _count(tk: TurnKit, row: Any, **where: Any) -> int:
    async with tk.store.atomic() as tx:
        query = select(func.count()).select_from(row)
        for column, value in where.items():
            query = query.where(getattr(row, column) == value)
        return int(await tx.connection.scalar(query) or 0)


async def _assert_untouched(tk: TurnKit, conversation: Conversation) -> None:
    assert await conversation.messages() == []
    assert await conversation.turns() == []
    assert await conversation.inbox() == []
    assert not await lane_exists(tk, conversation.id)


LOOP: dict[str, Any] = {}
LOOP["self"] = LOOP

ASK_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("a\x00b", {}, "text must not contain NUL"),
    ("a\ud800b", {}, "text is not valid UTF-8"),
    ("", {}, "text is required"),
    ("x" * (300 * 1024), {}, "text is too large"),
    ("hi", {"model": "m" * (MAX_NAME_CHARS + 1)}, "model is too long"),
    ("hi", {"model": "gpt\x00"}, "model must not contain NUL"),
    ("hi", {"agent": "a" * (MAX_NAME_CHARS + 1)}, "agent is too long"),
    ("hi", {"metadata": {"score": float("nan")}}, "metadata.score must be a finite number"),
    ("hi", {"metadata": {1: "x"}}, "metadata keys must be strings"),
    ("hi", {"metadata": {"note": "a\x00"}}, "metadata.note must not contain NUL"),
    ("hi", {"metadata": {"when": object()}}, "metadata.when must be JSON"),
    ("hi", {"context": LOOP}, "context.self is circular"),
    ("hi", {"context": {"blob": "x" * (300 * 1024)}}, "context is too large"),
    ("hi", {"wait_for": ["conv_123"]}, "wait_for must be a turn id"),
    ("hi", {"callback": "turn_123"}, "callback must be a conv id"),
    ("hi", {"principal": {"user": "u\x00"}}, "principal.user must not contain NUL"),
]


@pytest.mark.parametrize(("text", "options", "message"), ASK_CASES, ids=[c[2] for c in ASK_CASES])
async def test_ask_rejects_bad_input_before_anything_is_written(
    engine: Engine, text: str, options: dict[str, Any], message: str
) -> None:
    """Issue 8 items 1, 12: bad text, names, metadata, context or ids give InputError; nothing is sent or written."""
    tk = engine.tk
    conversation = await tk.conversation(_agent())
    with pytest.raises(InputError, match=message):
        await conversation.ask(text, **options)
    await _assert_untouched(tk, conversation)


async def test_say_post_send_and_steer_reject_bad_input(engine: Engine) -> None:
    """Issue 8 item 13: empty say/steer text, bad delivery keys and destinations are InputErrors; nothing written."""
    tk = engine.tk
    conversation = await tk.conversation(_agent())
    other = await tk.conversation(_agent())
    for call, message in [
        (conversation.say(""), "text is required"),
        (conversation.say("a\x00"), "text must not contain NUL"),
        (conversation.say("hi", metadata={"x": float("inf")}), "metadata.x must be a finite number"),
        (conversation.post("hi", key=""), "key must be a non-empty string"),
        (conversation.post("hi", key=None), "key must be a non-empty string"),  # type: ignore[arg-type]
        (conversation.post("hi", key=123), "key must be a non-empty string"),  # type: ignore[arg-type]
        (conversation.post("hi", key="k" * (MAX_KEY_CHARS + 1)), "key is too long"),
        (conversation.post("hi", key="k\x00"), "key must not contain NUL"),
        (conversation.post("", key="k1"), "text is required"),
        (conversation.send_message(other, "a\x00", key="k2"), "text must not contain NUL"),
        (conversation.send_message("", "hi", key="k3"), "destination must be a conv id"),
        (conversation.send_message("turn_abc", "hi", key="k4"), "destination must be a conv id"),
    ]:
        with pytest.raises(InputError, match=message):
            await call
    await _assert_untouched(tk, conversation)
    await _assert_untouched(tk, other)
    assert await _count(tk, DeliveryRow, source_conversation_uid=conversation.id) == 0
    turn = tk.turn("turn_000000000000000000000000")
    for call, message in [
        (turn.steer("", key="s1"), "text is required"),
        (turn.steer("a\x00", key="s1"), "text must not contain NUL"),
        (turn.steer("go", key=""), "key must be a non-empty string"),
    ]:
        with pytest.raises(InputError, match=message):
            await call


async def test_conversation_and_run_reject_bad_input_before_writing(engine: Engine) -> None:
    """Issue 8 item 1: tk.conversation and tk.run check names, metadata and context before the conversation row."""
    tk = engine.tk
    agent = _agent()
    for options, message in [
        ({"model": "m" * (MAX_NAME_CHARS + 1)}, "model is too long"),
        ({"metadata": {"k": "\x00"}}, "metadata.k must not contain NUL"),
        ({"context": {"n": float("nan")}}, "context.n must be a finite number"),
        ({"subject": {"type": "Ticket", "id": "x" * (MAX_NAME_CHARS + 1)}}, "subject id is too long"),
    ]:
        with pytest.raises(InputError, match=message):
            await tk.conversation(agent, **options)
    with pytest.raises(InputError, match="agent name is too long"):
        await tk.conversation(_agent("a" * (MAX_NAME_CHARS + 1)))
    with pytest.raises(InputError, match="task must not contain NUL"):
        await tk.run(agent, "do \x00 this")
    with pytest.raises(InputError, match="task is too large"):
        await tk.run(agent, "go", input={"blob": "x" * (300 * 1024)})
    assert await _count(tk, ConversationRow, agent_name=agent.name) == 0


async def test_turn_ids_are_checked(engine: Engine) -> None:
    """Issue 8 item 13: tk.turn("") and tk.turn(<a conversation id>) are InputErrors, not an RPC error or a hang."""
    tk = engine.tk
    conversation = await tk.conversation(_agent())
    for bad in ["", "turn_", conversation.id, "x" * 100, None]:
        with pytest.raises(InputError, match="turn_id must be a turn id"):
            tk.turn(bad)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="conversation_id must be a conv id"):
        await tk.load_conversation("turn_123")
    with pytest.raises(InputError, match="timeout must be a non-negative"):
        await tk.turn("turn_000000000000000000000000").result(timeout=-1)


def test_budgets_must_let_a_turn_run() -> None:
    """Issue 8 item 13: zero or negative budgets are refused where a turn could never run under them.

    A zero ``max_iterations`` or ``timeout`` is refused; negatives are refused everywhere; 0 is kept where it
    forbids something (no sub-agents, no tools, no paid calls).
    """
    for options, message in [
        ({"timeout": 0}, "timeout must be a positive number"),
        ({"timeout": -5}, "timeout must be a positive number"),
        ({"timeout": float("nan")}, "timeout must be a positive number"),
        ({"max_iterations": 0}, "max_iterations must be an integer >= 1"),
        ({"max_iterations": -1}, "max_iterations must be an integer >= 1"),
        ({"max_iterations": 2.5}, "max_iterations must be an integer >= 1"),
        ({"max_tool_executions": -1}, "max_tool_executions must be an integer >= 0"),
        ({"max_depth": -1}, "max_depth must be an integer >= 0"),
        ({"max_spend": -0.01}, "max_spend must be a number of USD >= 0"),
        ({"max_tool_executions_by_name": {"lookup": -1}}, "max_tool_executions_by_name"),
    ]:
        with pytest.raises(ConfigError, match=message):
            _agent(**options)
        with pytest.raises(ConfigError, match=message):
            configure(**options)
    assert settings.timeout == 300.0 and settings.max_iterations == 25  # a refused configure changes nothing
    _agent(max_depth=0, max_tool_executions=0, max_spend=0, max_tool_executions_by_name={"lookup": 0})


def test_agent_names_and_skill_keys_follow_the_rule_of_every_other_name() -> None:
    """§1.2: an agent's name and a skill's key are checked when they are defined, by the rule that
    model and subject names follow: within the column's length, no NUL, and no control character (an escape
    sequence would be obeyed by the terminal that prints it). Ordinary names, spaces included, stay valid."""
    assert ConversationRow.__table__.c.model.type.length == MAX_NAME_CHARS  # pyright: ignore[reportAttributeAccessIssue]
    for bad, message in [
        ("a" * (MAX_NAME_CHARS + 1), "is too long"),
        ("evil\x00", "must not contain NUL"),
        ("red\x1b[31m", "must not contain control characters"),
        ("two\nlines", "must not contain control characters"),
        ("\u202ereversed", "must not contain control characters"),
    ]:
        with pytest.raises(InputError, match=f"^agent name {message}"):
            turnkit.Agent(bad)
        with pytest.raises(InputError, match=f"^skill key {message}"):
            turnkit.Skill(bad)
        with pytest.raises(InputError, match=f"^model {message}"):
            check_name("model", bad)
    assert turnkit.Agent("support bot-2.0").name == "support bot-2.0"
    assert turnkit.Skill(" triage ").key == "triage"


def test_json_rules_and_storable_json_are_the_same_on_every_backend() -> None:
    """Issue 8 items 1, 11: the JSON rules (strict for the application, storable for the store) in one place."""
    assert check_json("metadata", {"a": [1, 2.5, "x", None, True, {"b": "c"}]}) is not None
    assert check_json("principal", {"user": object()}, lenient=True) is not None  # stored as its str
    assert canonical_json({"n": float("nan"), "s": "a\x00", "ok": "😀"}) == {"n": None, "ok": "😀", "s": "a\ufffd"}


async def test_size_limit_is_a_setting(engine: Engine) -> None:
    """Issue 8 item 12: ``max_input_bytes`` bounds every text; None lifts the check."""
    tk = engine.tk
    conversation = await tk.conversation(_agent())
    configure(max_input_bytes=1024)
    with pytest.raises(InputError, match=r"text is too large: 2000 bytes \(the limit is 1024 bytes"):
        await conversation.say("x" * 2000)
    configure(max_input_bytes=None)
    message = await conversation.say("x" * 2000)
    assert message.text == "x" * 2000
