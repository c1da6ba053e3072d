"""The OpenAI and Anthropic clients, through the official SDKs, against a local server speaking their wire formats.

Nothing reaches the internet: every SDK is pointed at :class:`tests.provider_server.ProviderServer` with
``base_url`` and ``max_retries=0``. The last tests run real turns on the Temporal dev server with these clients.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import openai
import pytest
import pytest_asyncio

import turnkit
from tests.provider_server import (
    ProviderServer,
    anthropic_error,
    anthropic_message,
    anthropic_text,
    anthropic_thinking,
    anthropic_tool_use,
    openai_call,
    openai_error,
    openai_reasoning,
    openai_response,
    openai_text,
)
from turnkit.kernel.errors import ModelAccessError, ModelError
from turnkit.model import ModelRequest, ToolSpec
from turnkit.providers import AnthropicClient, OpenAIClient, TransientModelError
from turnkit.providers._common import fully_required, strict_schema
from turnkit.runtime import TurnKit
from turnkit.store.store import utcnow

LOOKUP = ToolSpec(
    name="lookup",
    description="Look something up.",
    parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
)

OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answer": {"type": "integer"},
        "sources": {"type": "array", "items": {"type": "object", "properties": {"url": {"type": "string"}}}},
    },
    "required": ["answer", "sources"],
}

# A history as TurnKit projects it (behaviour §3.5): a tool loop that ran on some other client, then a new question.
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "look up a and b"},
    {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {"id": "call_a", "name": "lookup", "arguments": {"q": "a"}},
            {"id": "call_b", "name": "lookup", "arguments": {"q": "b"}},
        ],
    },
    {"role": "tool", "content": '{"answer": "A"}', "tool_call_id": "call_a"},
    {"role": "tool", "content": '{"answer": "B"}', "tool_call_id": "call_b"},
    {"role": "assistant", "content": "A and B."},
    {"role": "user", "content": "and c?"},
]

OPENAI_ITEMS = [
    openai_reasoning("thinking about c", id="rs_9"),
    openai_call("call_c", "lookup", {"q": "c"}, id="fc_9"),
]
ANTHROPIC_BLOCKS = [
    anthropic_thinking("thinking about c", signature="sig-9"),
    anthropic_tool_use("toolu_c", "lookup", {"q": "c"}),
]


def request(**fields: Any) -> ModelRequest:
    return ModelRequest(**{"model": "test-model", "messages": [{"role": "user", "content": "hi"}], **fields})


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as running:
        yield running


@pytest_asyncio.fixture
async def openai_client(server: ProviderServer) -> AsyncIterator[OpenAIClient]:
    client = OpenAIClient(client=openai.AsyncOpenAI(api_key="sk-test", base_url=f"{server.url}/v1", max_retries=0))
    yield client
    await client.close()


@pytest_asyncio.fixture
async def anthropic_client(server: ProviderServer) -> AsyncIterator[AnthropicClient]:
    client = AnthropicClient(client=anthropic.AsyncAnthropic(api_key="sk-ant-test", base_url=server.url, max_retries=0))
    yield client
    await client.close()


def closed_port_url() -> str:
    """A URL on which nothing listens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# -- shared helpers ----------------------------------------------------------------------------------------------


def test_strict_schema_closes_every_object_it_does_not_specify() -> None:
    schema = {
        "type": "object",
        "properties": {
            "inner": {"type": "object", "properties": {"x": {"type": "string"}}},
            "open": {"type": "object", "additionalProperties": True},
            "list": {"type": "array", "items": {"type": "object", "properties": {}}},
            "either": {"anyOf": [{"type": "object", "properties": {}}, {"type": "null"}]},
            "ref": {"$ref": "#/$defs/thing"},
        },
        "$defs": {"thing": {"type": "object", "properties": {"y": {"type": "integer"}}}},
    }
    closed = strict_schema(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["inner"]["additionalProperties"] is False
    assert closed["properties"]["open"]["additionalProperties"] is True  # the application decided
    assert closed["properties"]["list"]["items"]["additionalProperties"] is False
    assert closed["properties"]["either"]["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["either"]["anyOf"][1]
    assert closed["$defs"]["thing"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the input is not modified
    assert not fully_required(closed)  # optional properties: OpenAI gets it non-strict


# -- OpenAI --------------------------------------------------------------------------------------------------------


async def test_openai_request_mapping(server: ProviderServer, openai_client: OpenAIClient) -> None:
    server.script(openai_response(openai_text('{"answer": 1, "sources": []}')))
    await openai_client.chat(
        request(
            messages=HISTORY,
            tools=[LOOKUP],
            instructions="Stable part.",
            dynamic_instructions="Dynamic part.",
            output_schema=OUTPUT_SCHEMA,
            thinking={"effort": "low"},
            metadata={"turn_id": "turn_1", "conversation_id": "conv_1", "request_id": "req_1"},
        )
    )

    [sent] = server.requests
    assert sent.path == "/v1/responses"
    assert sent.headers["authorization"] == "Bearer sk-test"
    body = sent.body
    assert body["model"] == "test-model"
    assert body["instructions"] == "Stable part.\n\nDynamic part."
    assert body["input"] == [
        {"role": "user", "content": "look up a and b"},
        {"role": "assistant", "content": "Looking."},
        {"type": "function_call", "call_id": "call_a", "name": "lookup", "arguments": '{"q": "a"}'},
        {"type": "function_call", "call_id": "call_b", "name": "lookup", "arguments": '{"q": "b"}'},
        {"type": "function_call_output", "call_id": "call_a", "output": '{"answer": "A"}'},
        {"type": "function_call_output", "call_id": "call_b", "output": '{"answer": "B"}'},
        {"role": "assistant", "content": "A and B."},
        {"role": "user", "content": "and c?"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "name": "lookup",
            "description": "Look something up.",
            "parameters": LOOKUP.parameters,
            "strict": False,
        }
    ]
    text_format = body["text"]["format"]
    assert text_format["type"] == "json_schema" and text_format["name"] == "output"
    assert text_format["schema"]["additionalProperties"] is False
    assert text_format["schema"]["properties"]["sources"]["items"]["additionalProperties"] is False
    assert text_format["strict"] is False  # "url" is optional, which strict mode would reject
    assert body["reasoning"] == {"effort": "low"}
    assert body["metadata"] == {"turn_id": "turn_1", "conversation_id": "conv_1", "request_id": "req_1"}


async def test_openai_strict_output_and_budget_only_thinking(
    server: ProviderServer, openai_client: OpenAIClient
) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    server.script(openai_response(openai_text('{"answer": 1}')))
    client = OpenAIClient(client=openai_client.sdk, reasoning_summary="auto")
    await client.chat(request(output_schema=schema, thinking={"budget": 6000}))
    body = server.bodies[0]
    assert body["text"]["format"]["strict"] is True  # every property required: strict mode accepts it
    assert body["reasoning"] == {"effort": "medium", "summary": "auto"}
    assert "instructions" not in body and "tools" not in body


async def test_openai_response_mapping(server: ProviderServer, openai_client: OpenAIClient) -> None:
    output = [
        openai_reasoning("I should look it up."),
        openai_text("Let me check."),
        openai_call("call_1", "lookup", {"q": "a"}),
        openai_call("call_2", "lookup", "{not json", id="fc_2"),
    ]
    usage = {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 40, "cache_write_tokens": 0},
        "output_tokens": 50,
        "output_tokens_details": {"reasoning_tokens": 20},
        "total_tokens": 150,
    }
    server.script(openai_response(*output, usage=usage))
    result = await openai_client.chat(request(model="gpt-test", tools=[LOOKUP]))

    assert [p["type"] for p in result.parts] == ["thinking", "text", "provider", "tool_call", "tool_call"]
    assert result.parts[0] == {"type": "thinking", "text": "I should look it up.", "signature": None, "redacted": False}
    assert result.text == "Let me check."
    assert result.parts[2] == {"type": "provider", "kind": "openai_responses", "data": output}
    assert [(c.id, c.name, c.arguments, c.arguments_error) for c in result.tool_calls] == [
        ("call_1", "lookup", {"q": "a"}, None),
        ("call_2", "lookup", {}, "invalid JSON arguments"),
    ]
    usage_buckets = result.usage
    assert (usage_buckets.input_tokens, usage_buckets.cached_tokens) == (60, 40)
    assert (usage_buckets.output_tokens, usage_buckets.thinking_tokens) == (30, 20)
    assert usage_buckets.total_tokens == 150  # exclusive buckets add up to the provider's total
    assert result.model == "gpt-test"  # the model asked for, which cost rates are keyed by
    assert result.finish_reason == "tool_calls"
    assert result.output_data is None


async def test_openai_structured_output(server: ProviderServer, openai_client: OpenAIClient) -> None:
    server.script(openai_response(openai_text('{"answer": 42, "sources": []}')), openai_response(openai_text("nope")))
    result = await openai_client.chat(request(output_schema=OUTPUT_SCHEMA))
    assert result.output_data == {"answer": 42, "sources": []}
    assert result.finish_reason == "stop"
    assert (await openai_client.chat(request(output_schema=OUTPUT_SCHEMA))).output_data is None


def replay_histories(
    call_id: str, *, own: tuple[str, list[Any]], other: tuple[str, list[Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Two histories with one answered tool call: its assistant message carries both providers' raw parts (the
    client's own last), or only the other provider's."""
    parts = [{"type": "provider", "kind": kind, "data": data} for kind, data in (other, own)]
    assistant = {
        "role": "assistant",
        "content": "thinking about c",
        "tool_calls": [{"id": call_id, "name": "lookup", "arguments": {"q": "c"}}],
        "provider_parts": parts,
    }
    question = {"role": "user", "content": "c?"}
    result = {"role": "tool", "content": '{"answer": "C"}', "tool_call_id": call_id}
    return [question, assistant, result], [question, {**assistant, "provider_parts": parts[:1]}, result]


async def test_openai_replays_only_its_own_provider_parts(server: ProviderServer, openai_client: OpenAIClient) -> None:
    own, foreign = replay_histories(
        "call_c", own=("openai_responses", OPENAI_ITEMS), other=("anthropic", ANTHROPIC_BLOCKS)
    )
    server.script(openai_response(openai_text("C")), openai_response(openai_text("C")))

    await openai_client.chat(request(messages=own))
    await openai_client.chat(request(messages=foreign))

    replayed, rebuilt = (body["input"] for body in server.bodies)
    assert replayed[1:3] == OPENAI_ITEMS  # the raw output items, verbatim (reasoning item and its call)
    assert replayed[3] == {"type": "function_call_output", "call_id": "call_c", "output": '{"answer": "C"}'}
    # Another provider's blocks are never sent, and no reasoning item is made up in their place.
    assert rebuilt[1:3] == [
        {"role": "assistant", "content": "thinking about c"},
        {"type": "function_call", "call_id": "call_c", "name": "lookup", "arguments": '{"q": "c"}'},
    ]
    assert "sig-9" not in json.dumps(server.bodies)


@pytest.mark.parametrize(
    ("status", "reason", "message"),
    [
        ("incomplete", "max_output_tokens", "OpenAI response incomplete: max_output_tokens"),
        ("failed", None, "OpenAI response failed"),
        ("in_progress", None, "OpenAI response in_progress"),
    ],
)
async def test_openai_response_that_did_not_complete_is_a_model_error(
    server: ProviderServer, openai_client: OpenAIClient, status: str, reason: str | None, message: str
) -> None:
    server.script(openai_response(openai_text("partial"), status=status, incomplete_reason=reason))
    with pytest.raises(ModelError) as caught:
        await openai_client.chat(request())
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("status", "sdk_class"),
    [(400, "BadRequestError"), (401, "AuthenticationError"), (403, "PermissionDeniedError"), (404, "NotFoundError")],
)
async def test_openai_client_errors_are_not_retryable(
    server: ProviderServer, openai_client: OpenAIClient, status: int, sdk_class: str
) -> None:
    server.script(openai_error(status, "nope"))
    with pytest.raises(ModelError, match=f"^{sdk_class}: .*nope") as caught:
        await openai_client.chat(request())
    assert not isinstance(caught.value, TransientModelError)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("status", "sdk_class"), [(429, "RateLimitError"), (500, "InternalServerError"), (503, "InternalServerError")]
)
async def test_openai_transient_errors_are_retryable(
    server: ProviderServer, openai_client: OpenAIClient, status: int, sdk_class: str
) -> None:
    server.script(openai_error(status, "try later", type="server_error"))
    with pytest.raises(TransientModelError, match=f"^{sdk_class}: .*try later") as caught:
        await openai_client.chat(request())
    assert not isinstance(caught.value, ModelError)  # a ModelError would fail the turn without a retry


async def test_openai_connection_error_is_retryable() -> None:
    client = OpenAIClient(client=openai.AsyncOpenAI(api_key="sk-test", base_url=closed_port_url(), max_retries=0))
    with pytest.raises(TransientModelError, match=r"^APIConnectionError: "):
        await client.chat(request())
    await client.close()


async def test_openai_missing_key_or_model_is_a_model_access_error(
    monkeypatch: pytest.MonkeyPatch, openai_client: OpenAIClient
) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_ADMIN_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ModelAccessError):
        await OpenAIClient("gpt-test").chat(request())
    with pytest.raises(ModelAccessError, match="model is required"):
        await openai_client.chat(request(model=""))


async def test_openai_pinned_model_wins(server: ProviderServer, openai_client: OpenAIClient) -> None:
    server.script(openai_response(openai_text("hi")))
    result = await OpenAIClient("gpt-pinned", client=openai_client.sdk).chat(request(model="claude-sonnet-4-5"))
    assert server.bodies[0]["model"] == "gpt-pinned" and result.model == "gpt-pinned"


# -- Anthropic -----------------------------------------------------------------------------------------------------


async def test_anthropic_request_mapping(server: ProviderServer, anthropic_client: AnthropicClient) -> None:
    server.script(anthropic_message(anthropic_text('{"answer": 1, "sources": []}')))
    await anthropic_client.chat(
        request(
            messages=HISTORY,
            tools=[LOOKUP],
            instructions="Stable part.",
            dynamic_instructions="Dynamic part.",
            output_schema=OUTPUT_SCHEMA,
            thinking={"budget": 3000},
        )
    )

    [sent] = server.requests
    assert sent.path == "/v1/messages"
    assert sent.headers["authorization"] == "Bearer sk-ant-test"
    body = sent.body
    assert body["model"] == "test-model"
    assert body["system"] == [
        {"type": "text", "text": "Stable part.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Dynamic part."},
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "look up a and b"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "call_a", "name": "lookup", "input": {"q": "a"}},
                {"type": "tool_use", "id": "call_b", "name": "lookup", "input": {"q": "b"}},
            ],
        },
        {  # both results in one user message, as Anthropic requires
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_a", "content": '{"answer": "A"}'},
                {"type": "tool_result", "tool_use_id": "call_b", "content": '{"answer": "B"}'},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "A and B."}]},
        {"role": "user", "content": [{"type": "text", "text": "and c?"}]},
    ]
    assert body["tools"] == [{"name": "lookup", "description": "Look something up.", "input_schema": LOOKUP.parameters}]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 3000}
    assert body["max_tokens"] == 8192  # already above budget + answer room
    schema = body["output_config"]["format"]["schema"]
    assert body["output_config"]["format"]["type"] == "json_schema"
    assert schema["additionalProperties"] is False
    assert schema["properties"]["sources"]["items"]["additionalProperties"] is False


async def test_anthropic_system_prompt_and_thinking_budgets(
    server: ProviderServer, anthropic_client: AnthropicClient
) -> None:
    server.script(*[anthropic_message(anthropic_text("ok"))] * 3)
    sdk = anthropic_client.sdk
    await anthropic_client.chat(request(instructions="Stable only.", thinking={"effort": "high"}))
    await AnthropicClient(client=sdk, prompt_cache=False).chat(request(instructions="S", dynamic_instructions="D"))
    await AnthropicClient(client=sdk, max_tokens=1000).chat(request(thinking={"budget": 10}))
    only_stable, uncached, small = server.bodies
    assert only_stable["system"] == "Stable only."  # nothing dynamic: one plain system prompt
    assert only_stable["thinking"] == {"type": "enabled", "budget_tokens": 12288}
    assert only_stable["max_tokens"] == 12288 + 4096  # the budget must stay below max_tokens
    assert uncached["system"] == "S\n\nD"
    assert "thinking" not in uncached and "tools" not in uncached
    assert small["thinking"] == {"type": "enabled", "budget_tokens": 1024}  # Anthropic's minimum
    assert small["max_tokens"] == 1024 + 4096


async def test_anthropic_response_mapping(server: ProviderServer, anthropic_client: AnthropicClient) -> None:
    content = [
        anthropic_thinking("I should look it up.", signature="sig-1"),
        {"type": "redacted_thinking", "data": "opaque"},
        anthropic_text("Let me check."),
        anthropic_tool_use("toolu_1", "lookup", {"q": "a"}),
        anthropic_tool_use("toolu_2", "lookup", {"q": "b"}),
    ]
    usage = {
        "input_tokens": 10,
        "cache_read_input_tokens": 300,
        "cache_creation_input_tokens": 50,
        "output_tokens": 40,
        "output_tokens_details": {"thinking_tokens": 25},
    }
    server.script(anthropic_message(*content, stop_reason="tool_use", usage=usage))
    result = await anthropic_client.chat(request(model="claude-test", tools=[LOOKUP]))

    assert [p["type"] for p in result.parts] == ["thinking", "thinking", "text", "provider", "tool_call", "tool_call"]
    assert result.parts[0] == {
        "type": "thinking",
        "text": "I should look it up.",
        "signature": "sig-1",
        "redacted": False,
    }
    assert result.parts[1] == {"type": "thinking", "text": "", "signature": None, "redacted": True}
    assert result.text == "Let me check."
    assert result.parts[3] == {"type": "provider", "kind": "anthropic", "data": content}
    assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == [
        ("toolu_1", "lookup", {"q": "a"}),
        ("toolu_2", "lookup", {"q": "b"}),
    ]
    buckets = result.usage
    assert (buckets.input_tokens, buckets.cached_tokens, buckets.cache_write_tokens) == (10, 300, 50)
    assert (buckets.output_tokens, buckets.thinking_tokens) == (15, 25)
    assert result.model == "claude-test"
    assert result.finish_reason == "tool_use"


async def test_anthropic_structured_output(server: ProviderServer, anthropic_client: AnthropicClient) -> None:
    server.script(anthropic_message(anthropic_text('{"answer": 42, "sources": []}')))
    result = await anthropic_client.chat(request(output_schema=OUTPUT_SCHEMA))
    assert result.output_data == {"answer": 42, "sources": []}


async def test_anthropic_replays_only_its_own_provider_parts(
    server: ProviderServer, anthropic_client: AnthropicClient
) -> None:
    own, foreign = replay_histories(
        "toolu_c", own=("anthropic", ANTHROPIC_BLOCKS), other=("openai_responses", OPENAI_ITEMS)
    )
    server.script(anthropic_message(anthropic_text("C")), anthropic_message(anthropic_text("C")))

    await anthropic_client.chat(request(messages=own))
    await anthropic_client.chat(request(messages=foreign))

    replayed, rebuilt = (body["messages"] for body in server.bodies)
    assert replayed[1] == {"role": "assistant", "content": ANTHROPIC_BLOCKS}  # signed thinking, verbatim
    assert rebuilt[1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "thinking about c"},
            {"type": "tool_use", "id": "toolu_c", "name": "lookup", "input": {"q": "c"}},
        ],
    }
    assert (
        replayed[2]
        == rebuilt[2]
        == {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_c", "content": '{"answer": "C"}'}],
        }
    )
    assert "gAAA-opaque" not in json.dumps(server.bodies)  # no OpenAI reasoning crosses over


@pytest.mark.parametrize(
    ("status", "sdk_class"),
    [(400, "BadRequestError"), (401, "AuthenticationError"), (403, "PermissionDeniedError"), (404, "NotFoundError")],
)
async def test_anthropic_client_errors_are_not_retryable(
    server: ProviderServer, anthropic_client: AnthropicClient, status: int, sdk_class: str
) -> None:
    server.script(anthropic_error(status, "nope"))
    with pytest.raises(ModelError, match=f"^{sdk_class}: .*nope") as caught:
        await anthropic_client.chat(request())
    assert not isinstance(caught.value, TransientModelError)


@pytest.mark.parametrize(
    ("status", "sdk_class"),
    [(429, "RateLimitError"), (500, "InternalServerError"), (529, "OverloadedError")],
)
async def test_anthropic_transient_errors_are_retryable(
    server: ProviderServer, anthropic_client: AnthropicClient, status: int, sdk_class: str
) -> None:
    server.script(anthropic_error(status, "try later", type="overloaded_error"))
    with pytest.raises(TransientModelError, match=f"^{sdk_class}: .*try later") as caught:
        await anthropic_client.chat(request())
    assert not isinstance(caught.value, ModelError)


async def test_anthropic_should_retry_header_wins(server: ProviderServer, anthropic_client: AnthropicClient) -> None:
    refused = anthropic_error(500, "do not retry")
    refused.headers["x-should-retry"] = "false"
    server.script(refused)
    with pytest.raises(ModelError, match="do not retry"):
        await anthropic_client.chat(request())


async def test_anthropic_connection_error_is_retryable() -> None:
    client = AnthropicClient(client=anthropic.AsyncAnthropic(api_key="k", base_url=closed_port_url(), max_retries=0))
    with pytest.raises(TransientModelError, match=r"^APIConnectionError: "):
        await client.chat(request())
    await client.close()


async def test_anthropic_missing_key_or_model_is_a_model_access_error(
    monkeypatch: pytest.MonkeyPatch, server: ProviderServer, anthropic_client: AnthropicClient
) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ModelAccessError, match="ANTHROPIC_API_KEY is not set"):
        await AnthropicClient("claude-test").chat(request())
    keyless = AnthropicClient(client=anthropic.AsyncAnthropic(base_url=server.url, max_retries=0))
    with pytest.raises(ModelAccessError, match="authentication"):  # the SDK notices only when sending
        await keyless.chat(request())
    await keyless.close()
    assert server.requests == []
    with pytest.raises(ModelAccessError, match="model is required"):
        await anthropic_client.chat(request(model=" "))


# -- end to end: real turns on the Temporal dev server ---------------------------------------------------------------


@turnkit.tool(recovery="replay_safe")
def lookup(q: str) -> dict[str, Any]:
    """Look something up.

    Args:
        q: The query.
    """
    return {"answer": q.upper()}


def tool_agent(client: turnkit.Client, model: str) -> turnkit.Agent:
    return turnkit.Agent("provider-e2e", model=model, instructions="Use lookup.", tools=[lookup], client=client)


async def test_openai_turn_end_to_end(tk: TurnKit, server: ProviderServer, openai_client: OpenAIClient) -> None:
    first = [openai_reasoning("Need a lookup."), openai_call("call_e2e", "lookup", {"q": "a"})]
    server.script(
        openai_response(*first, usage={"input_tokens": 100, "output_tokens": 30, "total_tokens": 130}),
        openai_response(openai_text("It is A.")),
    )
    conversation = await tk.conversation(tool_agent(openai_client, "gpt-e2e"))
    turn = await conversation.ask("what is a?")

    assert turn.status == "completed", turn.error
    assert turn.output_text == "It is A."
    [execution] = await turn.tool_executions()
    assert (execution.tool_call_id, execution.status, execution.result) == ("call_e2e", "completed", {"answer": "A"})
    first_body, second_body = server.bodies
    assert [t["name"] for t in first_body["tools"]] == ["lookup"]
    assert "Use lookup." in first_body["instructions"]
    assert first_body["input"] == [{"role": "user", "content": "what is a?"}]
    # The second request replays the first response's raw items, then carries the tool result in Responses form.
    assert second_body["input"][:3] == [{"role": "user", "content": "what is a?"}, *first]
    [output] = second_body["input"][3:]
    assert output["type"] == "function_call_output" and output["call_id"] == "call_e2e"
    assert json.loads(output["output"])["answer"] == "A"
    assistant = next(m for m in await conversation.messages() if m.role == "assistant")
    assert {"type": "provider", "kind": "openai_responses", "data": first} in assistant.content
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (100 + 12, 30 + 7)


async def test_openai_compatible_server_repeating_call_0_runs_each_call(
    tk: TurnKit, server: ProviderServer, openai_client: OpenAIClient
) -> None:
    """Issue 8 item 8: a server that numbers calls per response (``call_0`` every time): both calls run, and the
    server gets its own ids back, each output after the call it answers."""
    server.script(
        openai_response(openai_call("call_0", "lookup", {"q": "a"}, id="fc_a")),
        openai_response(openai_call("call_0", "lookup", {"q": "b"}, id="fc_b")),
        openai_response(openai_text("A and B.")),
    )
    conversation = await tk.conversation(tool_agent(openai_client, "gpt-e2e"))
    turn = await conversation.ask("what are a and b?")

    assert turn.status == "completed", turn.error
    executions = await turn.tool_executions()
    assert [(e.tool_call_id, e.status, e.result) for e in executions] == [
        ("call_0", "completed", {"answer": "A"}),
        ("call_0_1", "completed", {"answer": "B"}),
    ]
    third = server.bodies[2]["input"]
    calls_and_outputs = [
        (item["type"], item["call_id"], item.get("arguments") or json.loads(item["output"])["answer"])
        for item in third
        if item.get("type") in ("function_call", "function_call_output")
    ]
    assert calls_and_outputs == [
        ("function_call", "call_0", '{"q": "a"}'),
        ("function_call_output", "call_0", "A"),
        ("function_call", "call_0", '{"q": "b"}'),
        ("function_call_output", "call_0", "B"),
    ]


async def test_anthropic_turn_end_to_end(
    tk: TurnKit, server: ProviderServer, anthropic_client: AnthropicClient
) -> None:
    first = [
        anthropic_thinking("Need a lookup.", signature="sig-e2e"),
        anthropic_tool_use("toolu_e2e", "lookup", {"q": "b"}),
    ]
    server.script(anthropic_message(*first, stop_reason="tool_use"), anthropic_message(anthropic_text("It is B.")))
    conversation = await tk.conversation(tool_agent(anthropic_client, "claude-e2e"))
    turn = await conversation.ask("what is b?", thinking={"effort": "low"})

    assert turn.status == "completed", turn.error
    assert turn.output_text == "It is B."
    first_body, second_body = server.bodies
    assert first_body["model"] == "claude-e2e"
    assert first_body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert first_body["system"][0]["cache_control"] == {"type": "ephemeral"}  # the environment section is dynamic
    assert second_body["messages"][:2] == [
        {"role": "user", "content": [{"type": "text", "text": "what is b?"}]},
        {"role": "assistant", "content": first},  # signed thinking replayed verbatim
    ]
    [result_message] = second_body["messages"][2:]
    assert result_message["role"] == "user"
    [block] = result_message["content"]
    assert block["type"] == "tool_result" and block["tool_use_id"] == "toolu_e2e"
    assert json.loads(block["content"])["answer"] == "B"


async def test_provider_auth_failure_fails_the_turn_without_retries(
    tk: TurnKit, server: ProviderServer, anthropic_client: AnthropicClient
) -> None:
    server.script(anthropic_error(401, "invalid x-api-key", type="authentication_error"))
    turn = await (await tk.conversation(tool_agent(anthropic_client, "claude-e2e"))).ask("hi")
    assert turn.status == "failed"
    assert turn.error is not None and turn.error["class"] == "TurnKit::ModelError"
    # Spec §3.6: "<class>: <message>", the SDK's class and its message, which names the status and the provider's
    # words (its wording varies: anthropic 2.17 says "401 invalid x-api-key (path: …)", earlier "Error code: 401 - …").
    message = turn.error["message"]
    assert message.startswith("AuthenticationError: ") and "401" in message, message
    assert "invalid x-api-key" in message, message
    assert len(server.requests) == 1  # non-retryable: the model activity ran once


async def test_a_provider_bad_request_fails_the_run_and_nothing_tries_it_again(
    tk: TurnKit, server: ProviderServer, openai_client: OpenAIClient
) -> None:
    """T42: the provider answers 400 (the SDK's ``BadRequestError``): the submitted run is ``failed`` with class
    "TurnKit::ModelError" after one HTTP call; a later reconcile repairs nothing and submitting it again is refused,
    so the provider is never asked again."""
    since = utcnow()
    server.script(openai_error(400, "unsupported parameter"))
    run = await tk.run(tool_agent(openai_client, "gpt-e2e"), "hi", wait=False)
    failed = await run.result(timeout=60)
    assert failed.status == "failed" and failed.error is not None
    assert failed.error["class"] == "TurnKit::ModelError"
    assert failed.error["message"].startswith("BadRequestError: "), failed.error
    assert len(server.requests) == 1
    reconciled = await tk.reconcile(since=since, grace=0)
    assert [r for r in reconciled.repairs if run.id in r.ids] == []
    with pytest.raises(turnkit.Error, match="only pending or paused turns can be submitted"):
        await run.perform_later()
    again = await run.refresh()
    assert (again.status, again.error) == ("failed", failed.error)
    assert len(server.requests) == 1


async def test_provider_transient_failure_is_retried_by_the_model_activity(
    tk: TurnKit, server: ProviderServer, openai_client: OpenAIClient
) -> None:
    server.script(openai_error(503, "overloaded", type="server_error"), openai_response(openai_text("Back.")))
    turn = await (await tk.conversation(tool_agent(openai_client, "gpt-e2e"))).ask("hi")
    assert turn.status == "completed", turn.error
    assert turn.output_text == "Back."
    assert len(server.requests) == 2  # the second activity attempt got through


async def test_provider_failing_past_the_last_attempt_fails_the_turn_as_a_model_error(
    tk: TurnKit, server: ProviderServer, openai_client: OpenAIClient
) -> None:
    turnkit.configure(model_max_attempts=2)
    server.script(*[openai_error(503, "overloaded", type="server_error")] * 2)
    turn = await (await tk.conversation(tool_agent(openai_client, "gpt-e2e"))).ask("hi")
    assert turn.status == "failed" and turn.error is not None
    # Spec §3.6: ModelError "<class>: <message>", the SDK's class and the provider's own words (status, message).
    assert set(turn.error) == {"class", "message"} and turn.error["class"] == "TurnKit::ModelError"
    message = turn.error["message"]
    assert message.startswith("InternalServerError: ") and "503" in message, message
    assert "overloaded" in message, message
    assert len(server.requests) == 2
