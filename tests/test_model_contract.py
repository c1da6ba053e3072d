"""The model-client contract (behaviour §3.6), the scripted test client, message projection (behaviour §3.5; T13)."""

from __future__ import annotations

import asyncio
import re
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from turnkit.kernel.errors import ModelError
from turnkit.kernel.records import MessageRecord
from turnkit.model import Client, ModelRequest, Result, ToolCall, ToolSpec, Usage
from turnkit.prompt import drop_unanswered_calls, project_messages
from turnkit.testing import DEFAULT_USAGE, ScriptedClient, call_tools, say


def request(model: str = "m-1", **extra: Any) -> ModelRequest:
    return ModelRequest(model=model, messages=[{"role": "user", "content": "hi"}], **extra)


# -- ToolCall ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "arguments", "error"),
    [
        ({"q": "x", 1: {2: "y"}}, {"q": "x", "1": {"2": "y"}}, None),
        ('{"q": "x"}', {"q": "x"}, None),
        ("[1, 2]", {}, None),
        ('"text"', {}, None),
        ("{", {}, "invalid JSON arguments"),
        ("", {}, None),
        (None, {}, None),
        (42, {}, None),
    ],
)
def test_tool_call_argument_parsing(raw: Any, arguments: dict[str, Any], error: str | None) -> None:
    call = ToolCall.parse("call_1", "lookup", raw)
    assert call.arguments == arguments
    assert call.arguments_error == error


# -- Usage ------------------------------------------------------------------------------------------------------------


def test_usage_totals_sums_and_records() -> None:
    usage = Usage(input_tokens=10, output_tokens=5, cached_tokens=3, cache_write_tokens=2, thinking_tokens=1)
    assert usage.total_tokens == 21
    summed = usage + Usage(input_tokens=1, cost=0.5)
    assert summed.input_tokens == 11
    assert summed.cost == 0.5
    assert (Usage() + Usage()).cost is None
    assert usage.to_record() == {
        "input_tokens": 10,
        "output_tokens": 5,
        "cached_tokens": 3,
        "cache_write_tokens": 2,
        "thinking_tokens": 1,
        "total_tokens": 21,
    }
    assert Usage(cost=0.02).to_record()["cost"] == 0.02


def test_usage_from_dict_accepts_reasoning_tokens() -> None:
    usage = Usage.from_dict({"input_tokens": 4, "reasoning_tokens": 6, "total_tokens": 999, "cost": 1})
    assert usage.thinking_tokens == 6
    assert usage.total_tokens == 10
    assert usage.cost == 1.0
    assert Usage.from_dict(None) == Usage()
    assert Usage.from_dict(usage.to_record()) == usage


# -- Result -----------------------------------------------------------------------------------------------------------


def test_result_build_synthesises_parts() -> None:
    result = Result.build(
        text="Let me check.",
        tool_calls=[ToolCall(id="call_1", name="lookup", arguments={"q": "x"}), {"id": "call_2", "name": "bad",
                                                                                  "arguments": "{"}],
        usage={"input_tokens": 3},
        model="m-1",
    )  # fmt: skip
    assert result.parts == [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_call", "id": "call_1", "name": "lookup", "arguments": {"q": "x"}},
        {
            "type": "tool_call",
            "id": "call_2",
            "name": "bad",
            "arguments": {},
            "arguments_error": "invalid JSON arguments",
        },
    ]
    assert result.text == "Let me check."
    assert result.has_tool_calls
    assert [c.name for c in result.tool_calls] == ["lookup", "bad"]
    assert result.tool_calls[1].arguments_error == "invalid JSON arguments"
    assert result.usage.input_tokens == 3


def test_result_from_parts_views() -> None:
    result = Result.build(
        parts=[
            {"type": "text", "text": "a"},
            {"type": "thinking", "text": "hidden"},
            {"type": "provider", "kind": "anthropic", "data": []},
            {"text": "b"},
            {"type": "tool_call", "id": "c1", "name": "t", "arguments": '{"x": 1}'},
        ],
        text="ignored",
    )
    assert result.text == "a\nb"
    assert result.tool_calls == [ToolCall(id="c1", name="t", arguments={"x": 1})]
    plain = Result.build(text="done")
    assert not plain.has_tool_calls
    assert plain.tool_calls == []
    assert (plain.images, plain.has_image, plain.media_analyses, plain.has_media_analysis) == ([], False, [], False)


def test_result_image_and_media_analysis_views() -> None:
    """Behaviour §3.6 derived views: ``images`` / ``image?`` and ``media_analyses`` / ``media_analysis?``, in order."""
    painted = {"type": "image", "data": "aGk=", "mime_type": "image/png"}
    analysis = {"type": "media_analysis", "text": "A cat.", "media": {"media_id": "media_1"}}
    result = Result.build(parts=[{"type": "text", "text": "here"}, painted, analysis, {**painted, "data": "eW8="}])
    assert result.images == [painted, {**painted, "data": "eW8="}] and result.has_image
    assert result.media_analyses == [analysis] and result.has_media_analysis
    assert result.text == "here"


def test_model_request_tool_names_and_round_trip() -> None:
    req = request(tools=[ToolSpec(name="a"), ToolSpec(name="b", description="B")], metadata={"turn_id": "turn_1"})
    assert req.tool_names == ["a", "b"]
    assert ModelRequest.model_validate_json(req.model_dump_json()) == req


# -- ScriptedClient ---------------------------------------------------------------------------------------------------


async def test_scripted_client_returns_items_in_order_and_records_requests() -> None:
    client = ScriptedClient([call_tools(("lookup", {"q": "x"}), text="checking"), "done"])
    assert isinstance(client, Client)
    first = await client.chat(request())
    second = await client.chat(request(model="m-2"))
    assert first.text == "checking"
    assert [(c.name, c.arguments) for c in first.tool_calls] == [("lookup", {"q": "x"})]
    assert second.text == "done"
    assert second.usage == DEFAULT_USAGE == Usage(input_tokens=10, output_tokens=5)
    assert second.model == "m-2"
    assert client.calls == 2
    assert [r.model for r in client.requests] == ["m-1", "m-2"]
    assert client.remaining == 0


async def test_scripted_client_exhaustion() -> None:
    client = ScriptedClient(["only"])
    await client.chat(request())
    with pytest.raises(ModelError, match=r"^scripted client has no more results$"):
        await client.chat(request())
    assert client.calls == 2


async def test_a_scripted_client_told_not_to_record_keeps_no_request() -> None:
    """A long-running process's scripted model (a benchmark's worker, the demo) must not hold every request it got:
    each one holds its messages, so the list grew by every call and kept what the transcripts had let go."""
    client = ScriptedClient(lambda req: "ok", record=False)
    for _ in range(3):
        assert (await client.chat(request())).text == "ok"
    assert client.calls == 3
    assert client.requests == []


async def test_scripted_client_fills_unique_tool_call_ids() -> None:
    script = call_tools(("a", {}), ("b", {}), ToolCall(id="keep_me", name="c", arguments={}))
    client = ScriptedClient([script, script])
    ids = [c.id for c in (await client.chat(request())).tool_calls]
    ids += [c.id for c in (await client.chat(request())).tool_calls]
    generated = [i for i in ids if i != "keep_me"]
    assert len(generated) == 4 and len(set(generated)) == 4
    assert all(re.fullmatch(r"call_[0-9a-f]{12}", i) for i in generated)
    assert ids.count("keep_me") == 2
    assert [p.get("id") for p in script.parts] == ["", "", "keep_me"]  # the script itself is not mutated


async def test_scripted_client_callables() -> None:
    def echo(req: ModelRequest) -> str:
        return f"echo {req.messages[-1]['content']}"

    client = ScriptedClient([echo, lambda req: say("second", usage=Usage(input_tokens=1))])
    assert (await client.chat(request())).text == "echo hi"
    second = await client.chat(request())
    assert second.text == "second"
    assert second.usage.total_tokens == 1

    forever = ScriptedClient(lambda req: req.model)
    for _ in range(3):
        assert (await forever.chat(request(model="m-9"))).text == "m-9"
    assert forever.calls == 3


def test_scripted_client_is_thread_safe() -> None:
    client = ScriptedClient([str(i) for i in range(200)])
    answers: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(50):
            text = asyncio.run(client.chat(request())).text
            with lock:
                answers.append(text)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answers, key=int) == [str(i) for i in range(200)]
    assert client.calls == 200


# -- projection (§3.5) ------------------------------------------------------------------------------------------------

_seq = iter(range(1, 10_000))


def message(role: str, kind: str, content: list[dict[str, Any]], **extra: Any) -> MessageRecord:
    return MessageRecord(
        id=f"msg_{next(_seq)}",
        conversation_id="conv_1",
        role=role,  # type: ignore[arg-type]
        kind=kind,  # type: ignore[arg-type]
        sequence=next(_seq),
        content=content,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        **extra,
    )


def test_tool_call_projection_puts_thinking_first() -> None:
    """T13: a message with parts ``[text "visible", thinking "hidden reasoning", tool_call]`` projects to the content
    "hidden reasoning", a newline, "visible" (thinking first) with tool call ``call_1``; its ``text`` is "visible"."""
    msg = message(
        "assistant",
        "tool_call",
        [
            {"type": "text", "text": "visible"},
            {"type": "thinking", "text": "hidden reasoning", "signature": "sig", "redacted": False},
            {"type": "tool_call", "id": "call_1", "name": "lookup", "arguments": {"q": "x"}},
        ],
    )
    [projected] = project_messages([msg])
    assert projected["role"] == "assistant"
    assert projected["content"] == "hidden reasoning\nvisible"
    assert projected["tool_calls"][0] == {"id": "call_1", "name": "lookup", "arguments": {"q": "x"}}
    assert msg.text == "visible"
    assert "provider_parts" not in projected


def test_projection_of_each_kind() -> None:
    provider = {"type": "provider", "kind": "anthropic", "data": [{"type": "text", "text": "hi"}]}
    messages = [
        message("user", "text", [{"type": "text", "text": "hello"}]),
        message("assistant", "context_summary", [{"type": "text", "text": "We did X."}], metadata={"compaction": {}}),
        message(
            "tool",
            "tool_result",
            [{"type": "tool_result", "tool_call_id": "call_1", "text": '{"ok": true}', "error": False}],
            tool_execution_id="tool_1",
        ),
        message("assistant", "text", [{"type": "text", "text": "answer"}, provider]),
        message(
            "assistant",
            "image",
            [{"type": "image", "url": "https://img/1.png", "data": "AAAA", "mime_type": "image/png", "model": "p"}],
        ),
        message(
            "assistant",
            "media_analysis",
            [{"type": "media_analysis", "text": "A cat.", "media": {"kind": "image", "filename": "cat.png"}}],
        ),
    ]
    projected = project_messages(messages)
    # Spec §3.5 (context_summary): two messages, the literal question, then a reference-only preamble that says the
    # summary is background, the latest user message wins and live context is more authoritative; "\n\n"; the summary.
    preamble, _, summary = projected[2]["content"].partition("\n\n")
    assert summary == "We did X."
    assert preamble.startswith("Reference only") and "background" in preamble
    assert "latest user message wins" in preamble and "live context" in preamble and "more authoritative" in preamble
    assert projected == [
        {"role": "user", "content": "hello"},
        {"role": "user", "content": "What did we do so far?"},
        {"role": "assistant", "content": f"{preamble}\n\nWe did X."},
        {"role": "tool", "content": '{"ok": true}', "tool_call_id": "call_1"},
        {"role": "assistant", "content": "answer", "provider_parts": [provider]},
        {
            "role": "assistant",
            "content": 'Generated image: {"url": "https://img/1.png", "mime_type": "image/png", "model": "p"}',
        },
        {"role": "assistant", "content": 'Media analysis: {"kind": "image", "filename": "cat.png"}\nA cat.'},
    ]


def test_unanswered_calls_are_left_out_of_a_request() -> None:
    provider = [{"type": "provider", "kind": "openai_responses", "data": []}]
    projected = [
        {"role": "user", "content": "a"},
        {
            "role": "assistant",
            "content": "checking",
            "tool_calls": [{"id": "c1"}, {"id": "c2"}],
            "provider_parts": provider,
        },
        {"role": "tool", "content": "{}", "tool_call_id": "c1"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c3"}]},
        {"role": "assistant", "content": "more", "tool_calls": [{"id": "c4"}]},
        {"role": "user", "content": "b"},
    ]
    assert drop_unanswered_calls(projected) == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "checking", "tool_calls": [{"id": "c1"}]},  # raw parts would replay c2
        {"role": "tool", "content": "{}", "tool_call_id": "c1"},
        {"role": "assistant", "content": "more"},
        {"role": "user", "content": "b"},
    ]
    answered = projected[:3]
    answered[1] = {**answered[1], "tool_calls": [{"id": "c1"}]}
    assert drop_unanswered_calls(answered) == answered  # complete histories are unchanged, raw parts included
