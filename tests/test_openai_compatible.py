"""OpenAI-compatible endpoints (OpenRouter, vLLM, Ollama, LiteLLM's proxy) on Chat Completions, the routing of a
model by its prefix, and ``validate`` on each client.

Every SDK is pointed at :class:`tests.provider_server.ProviderServer`, which speaks Chat Completions
(``POST /v1/chat/completions``, ``GET /v1/models``) and Gemini's ``GET /v1beta/models/{model}``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator

import openai
import pytest
import pytest_asyncio

import turnkit
from tests.provider_server import ProviderServer, chat_call, chat_completion, chat_error
from tests.test_providers import HISTORY, LOOKUP, OUTPUT_SCHEMA, replay_histories, request, tool_agent
from turnkit.kernel.errors import ConfigError, ModelAccessError, ModelError
from turnkit.media import MediaInput
from turnkit.providers import (
    AnthropicClient,
    GeminiClient,
    OpenAIClient,
    OpenAICompatibleClient,
    RoutingClient,
    TransientModelError,
    client_for,
)
from turnkit.providers.routing import OPENROUTER_BASE_URL, Route, route
from turnkit.runtime import TurnKit

PNG = base64.b64encode(b"\x89PNG-bytes").decode()


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as running:
        yield running


@pytest_asyncio.fixture
async def compatible(server: ProviderServer) -> AsyncIterator[OpenAICompatibleClient]:
    client = OpenAICompatibleClient(base_url=f"{server.url}/v1", api_key="sk-local")
    yield client
    await client.close()


def models_list(*names: str) -> dict[str, object]:
    return {"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "x"} for n in names]}


async def test_chat_completions_request_mapping(server: ProviderServer, compatible: OpenAICompatibleClient) -> None:
    server.script(chat_completion('{"answer": 1, "sources": []}'))
    image = {
        "role": "user",
        "content": "and this?",
        "media": [{"kind": "image", "mime_type": "image/png", "data": PNG}],
    }
    await compatible.chat(
        request(
            messages=[*HISTORY, image],
            tools=[LOOKUP],
            instructions="Stable part.",
            dynamic_instructions="Dynamic part.",
            output_schema=OUTPUT_SCHEMA,
            thinking={"budget": 3000},
        )
    )
    [sent] = server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-local"
    body = sent.body
    assert body["messages"] == [
        {"role": "system", "content": "Stable part.\n\nDynamic part."},
        {"role": "user", "content": "look up a and b"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "a"}'}},
                {"id": "call_b", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "b"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": '{"answer": "A"}'},
        {"role": "tool", "tool_call_id": "call_b", "content": '{"answer": "B"}'},
        {"role": "assistant", "content": "A and B."},
        {"role": "user", "content": "and c?"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "and this?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            ],
        },
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "lookup", "description": "Look something up.", "parameters": LOOKUP.parameters},
        }
    ]
    response_format = body["response_format"]
    assert response_format["type"] == "json_schema" and response_format["json_schema"]["strict"] is False
    assert response_format["json_schema"]["schema"]["additionalProperties"] is False
    assert body["reasoning_effort"] == "medium"  # a 3000-token budget, as OpenAIClient sizes it


async def test_openrouter_thinking_and_response_mapping(server: ProviderServer) -> None:
    """OpenRouter: the ``reasoning`` request object, its ``reasoning`` answer as thinking, its usage with cached and
    reasoning tokens and its reported cost; the raw message is kept for replay."""
    usage = {
        "prompt_tokens": 100,
        "prompt_tokens_details": {"cached_tokens": 40},
        "completion_tokens": 50,
        "completion_tokens_details": {"reasoning_tokens": 20},
        "total_tokens": 150,
        "cost": 0.0021,
    }
    server.script(
        chat_completion(
            "Let me check.",
            chat_call("call_1", "lookup", {"q": "a"}),
            chat_call("call_2", "lookup", "{not json"),
            reasoning="I should look it up.",
            usage=usage,
        )
    )
    client = client_for("openrouter/qwen/qwen3", base_url=f"{server.url}/v1", api_key="or-key")
    result = await client.chat(request(tools=[LOOKUP], thinking={"budget": 2000}))
    await client.close()

    body = server.bodies[0]
    assert body["model"] == "qwen/qwen3"  # the router's prefix is dropped
    assert body["reasoning"] == {"max_tokens": 2000} and "reasoning_effort" not in body
    assert [p["type"] for p in result.parts] == ["thinking", "text", "provider", "tool_call", "tool_call"]
    assert result.parts[0]["text"] == "I should look it up."
    assert result.parts[2]["kind"] == "openai_chat"
    assert [(c.id, c.arguments, c.arguments_error) for c in result.tool_calls] == [
        ("call_1", {"q": "a"}, None),
        ("call_2", {}, "invalid JSON arguments"),
    ]
    buckets = result.usage
    assert (buckets.input_tokens, buckets.cached_tokens, buckets.output_tokens, buckets.thinking_tokens) == (
        60,
        40,
        30,
        20,
    )
    assert buckets.cost == 0.0021
    assert result.finish_reason == "tool_calls"


async def test_chat_completions_structured_output_and_replay(
    server: ProviderServer, compatible: OpenAICompatibleClient
) -> None:
    raw_call = chat_call("call_c", "lookup", {"q": "c"})
    server.script(
        chat_completion('{"answer": 42, "sources": []}'),
        chat_completion(None, raw_call),
        chat_completion("C"),
    )
    assert (await compatible.chat(request(output_schema=OUTPUT_SCHEMA))).output_data == {"answer": 42, "sources": []}
    stored = (await compatible.chat(request(tools=[LOOKUP]))).parts
    data = next(p["data"] for p in stored if p["type"] == "provider")
    own, _foreign = replay_histories("call_c", own=("openai_chat", data), other=("anthropic", [{"type": "x"}]))
    await compatible.chat(request(messages=own))
    assert server.bodies[2]["messages"][1] == {"role": "assistant", "tool_calls": [raw_call]}  # the raw message


@pytest.mark.parametrize(("status", "retryable"), [(400, False), (401, False), (404, False), (429, True), (502, True)])
async def test_chat_completions_errors(
    server: ProviderServer, compatible: OpenAICompatibleClient, status: int, retryable: bool
) -> None:
    reply = chat_error(status, "nope")
    reply.headers["retry-after"] = "4"
    server.script(reply)
    with pytest.raises((TransientModelError, ModelError)) as caught:
        await compatible.chat(request())
    assert isinstance(caught.value, TransientModelError) is retryable
    if isinstance(caught.value, TransientModelError):
        assert caught.value.retry_after == 4.0  # the model activity's next attempt waits that long
    assert len(server.requests) == 1  # the SDK's own retries are off


async def test_compatible_validate(
    monkeypatch: pytest.MonkeyPatch, server: ProviderServer, compatible: OpenAICompatibleClient
) -> None:
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with pytest.raises(ModelAccessError, match=r"^OPENROUTER_API_KEY is required for meta/llama-3$"):
        await client_for("openrouter/meta/llama-3").validate(model="ignored: the client is pinned")
    assert server.requests == []

    server.script(models_list("served-model"), models_list("served-model"), chat_error(401, "bad key"))
    await compatible.validate(model="served-model")
    with pytest.raises(ModelAccessError, match=r"^model other-model is not available at http://.*/v1"):
        await compatible.validate(model="other-model")
    with pytest.raises(ModelAccessError, match=r"^model served-model is not available: AuthenticationError: .*bad key"):
        await compatible.validate(model="served-model")
    assert [(r.method, r.path) for r in server.requests] == [("GET", "/v1/models")] * 3


async def test_openai_and_anthropic_validate(monkeypatch: pytest.MonkeyPatch, server: ProviderServer) -> None:
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ModelAccessError, match=r"^OPENAI_API_KEY is required for gpt-x$"):
        await OpenAIClient().validate(model="gpt-x")
    with pytest.raises(ModelAccessError, match=r"^ANTHROPIC_API_KEY is required for claude-x$"):
        await AnthropicClient().validate(model="claude-x")
    with pytest.raises(ModelAccessError, match="model is required"):
        await AnthropicClient().validate(model="")
    server.script(
        chat_error(404, "The model `gpt-nope` does not exist"),
        {"type": "model", "id": "claude-x", "display_name": "Claude X", "created_at": "2025-01-01T00:00:00Z"},
    )
    openai_client = OpenAIClient(api_key="sk", base_url=f"{server.url}/v1")
    with pytest.raises(ModelAccessError, match=r"^model gpt-nope is not available: NotFoundError"):
        await openai_client.validate(model="gpt-nope")
    anthropic_client = AnthropicClient(api_key="sk-ant", base_url=server.url)
    await anthropic_client.validate(model="claude-x")
    assert [(r.method, r.path) for r in server.requests] == [
        ("GET", "/v1/models/gpt-nope"),
        ("GET", "/v1/models/claude-x"),
    ]
    await openai_client.close()
    await anthropic_client.close()


# -- routing by prefix -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("openrouter/anthropic/claude-sonnet-4.5", Route("openrouter", "anthropic/claude-sonnet-4.5")),
        ("ollama/qwen3:8b", Route("ollama", "qwen3:8b")),
        ("vllm/meta/llama", Route("vllm", "meta/llama")),
        ("litellm/gpt-4o", Route("litellm", "gpt-4o")),
        ("gemini-2.5-flash", Route("gemini", "gemini-2.5-flash")),
        ("gemini/gemini-2.5-pro", Route("gemini", "gemini-2.5-pro")),
        ("claude-sonnet-4-5", Route("anthropic", "claude-sonnet-4-5")),
        ("anthropic/claude-opus-4", Route("anthropic", "claude-opus-4")),
        ("gpt-5-mini", Route("openai", "gpt-5-mini")),
        ("o3-mini", Route("openai", "o3-mini")),
        ("openai/gpt-4.1", Route("openai", "gpt-4.1")),
    ],
)
def test_route_by_prefix(model: str, expected: Route) -> None:
    assert route(model) == expected


def test_route_refuses_an_unknown_prefix() -> None:
    with pytest.raises(ConfigError, match=r"^no provider for model 'mistral-large': start it with one of openrouter/"):
        route("mistral-large")
    with pytest.raises(ModelAccessError, match="model is required"):
        route(" ")


def test_client_for_builds_the_prefixs_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OLLAMA_BASE_URL", raising=False)
    openrouter = client_for("openrouter/qwen/qwen3")
    assert isinstance(openrouter, OpenAICompatibleClient)
    assert (openrouter.model, openrouter.base_url, openrouter.api_key_env) == (
        "qwen/qwen3",
        OPENROUTER_BASE_URL,
        "OPENROUTER_API_KEY",
    )
    ollama = client_for("ollama/llama3")
    assert isinstance(ollama, OpenAICompatibleClient)
    assert (ollama.model, ollama.base_url, ollama.api_key_env) == ("llama3", "http://localhost:11434/v1", None)
    assert isinstance(client_for("gemini/gemini-2.5-flash"), GeminiClient)
    assert isinstance(client_for("claude-sonnet-4-5"), AnthropicClient)
    assert isinstance(client_for("gpt-5"), OpenAIClient)


async def test_routing_client_sends_each_model_to_its_provider(
    monkeypatch: pytest.MonkeyPatch, server: ProviderServer
) -> None:
    monkeypatch.setenv("OLLAMA_BASE_URL", f"{server.url}/v1")
    server.script(chat_completion("from ollama"), models_list("llama3"))
    router = RoutingClient()
    result = await router.chat(request(model="ollama/llama3"))
    await router.validate(model="ollama/llama3")
    assert result.text == "from ollama"
    assert result.model == "llama3"  # as the provider knows it
    assert server.bodies[0]["model"] == "llama3"
    assert server.requests[0].headers["authorization"] == "Bearer none"  # a local server without keys
    with pytest.raises(ConfigError, match="no provider for model 'mystery'"):
        await router.chat(request(model="mystery"))
    await router.close()


# -- end to end: a real turn ---------------------------------------------------


async def test_compatible_turn_end_to_end(
    tk: TurnKit, server: ProviderServer, compatible: OpenAICompatibleClient
) -> None:
    usage = {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 64}, "completion_tokens": 9}
    server.script(
        chat_completion(None, chat_call("call_e2e", "lookup", {"q": "a"}), usage=usage),
        chat_completion("It is A."),
    )
    conversation = await tk.conversation(tool_agent(compatible, "served-model"))
    turn = await conversation.ask("what is a?")

    assert turn.status == "completed", turn.error
    assert turn.output_text == "It is A."
    [execution] = await turn.tool_executions()
    assert (execution.tool_call_id, execution.status, execution.result) == ("call_e2e", "completed", {"answer": "A"})
    first_body, second_body = server.bodies
    assert first_body["model"] == "served-model" and first_body["messages"][0]["role"] == "system"
    assert [t["function"]["name"] for t in first_body["tools"]] == ["lookup"]
    assistant, result = second_body["messages"][2:]
    assert assistant["tool_calls"][0]["id"] == "call_e2e"
    assert result["role"] == "tool" and result["tool_call_id"] == "call_e2e"
    assert json.loads(result["content"])["answer"] == "A"
    assert (turn.usage.input_tokens, turn.usage.cached_tokens, turn.usage.output_tokens) == (36 + 12, 64, 9 + 7)


async def test_audio_goes_to_chat_completions_and_is_refused_where_no_api_takes_it(
    tk: TurnKit, server: ProviderServer, compatible: OpenAICompatibleClient
) -> None:
    """Issue 39, audio in: a turn's wav audio reaches Chat Completions as ``input_audio`` (OpenAI's audio models take
    it there); a format it has no name for, a video, or audio for the Responses API fails the call with a
    ``ConfigError`` that names the type, and nothing is sent."""
    wav = b"RIFF\x00\x00\x00\x00WAVEfmt " + bytes(64)
    server.script(chat_completion("You said hello."))
    agent = turnkit.Agent("listener", model="audio-model", client=compatible)
    turn = await (await tk.conversation(agent)).ask(
        "what did I say?", media=[MediaInput.bytes(wav, mime_type="audio/wav")]
    )
    assert turn.status == "completed" and turn.output_text == "You said hello.", turn.error
    [sent] = server.bodies
    assert sent["messages"][-1]["content"] == [
        {"type": "text", "text": "what did I say?"},
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}},
    ]

    def heard(mime_type: str) -> dict[str, object]:
        return {
            "role": "user",
            "content": "hear",
            "media": [{"kind": mime_type.split("/")[0], "mime_type": mime_type, "data": "AAAA"}],
        }

    with pytest.raises(ConfigError, match="Chat Completions takes wav or mp3 audio, not audio/ogg"):
        await compatible.chat(request(messages=[heard("audio/ogg")]))
    with pytest.raises(ConfigError, match="Chat Completions does not accept video/mp4 media as input"):
        await compatible.chat(request(messages=[heard("video/mp4")]))
    responses = OpenAIClient(client=openai.AsyncOpenAI(api_key="sk-test", base_url=f"{server.url}/v1", max_retries=0))
    with pytest.raises(
        ConfigError,
        match=r"Responses API does not accept audio/wav media as input: for audio, use OpenAICompatibleClient",
    ):
        await responses.chat(request(messages=[heard("audio/wav")]))
    await responses.close()
    assert len(server.requests) == 1
