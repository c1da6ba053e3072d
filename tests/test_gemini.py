"""The Gemini client, through the official ``google-genai`` SDK, against a local server speaking Gemini's REST wire
format (``POST /v1beta/models/{model}:generateContent``, ``GET /v1beta/models/{model}``).

Nothing reaches the internet: the SDK is pointed at :class:`tests.provider_server.ProviderServer` with ``base_url``.
The last tests run real turns on the Temporal dev server with it.
"""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from tests.provider_server import ProviderServer, gemini_call, gemini_error, gemini_response
from tests.test_providers import HISTORY, LOOKUP, OUTPUT_SCHEMA, replay_histories, request, tool_agent
from turnkit.kernel.errors import ModelAccessError, ModelError
from turnkit.media_requests import PaintRequest, ViewMediaRequest
from turnkit.providers import GeminiClient, TransientModelError
from turnkit.providers.gemini import gemini_schema
from turnkit.runtime import TurnKit

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n-image-bytes").decode()
# A thought signature as the API sends it (standard base64 with + and /).
SIGNATURE = base64.b64encode(b"\xfb\xff\xfe-signature").decode()


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as running:
        yield running


@pytest_asyncio.fixture
async def gemini(server: ProviderServer) -> AsyncIterator[GeminiClient]:
    client = GeminiClient(api_key="g-test", base_url=server.url)
    yield client
    await client.close()


def test_gemini_schema_converts_what_gemini_rejects() -> None:
    """Gemini's Schema is an OpenAPI subset: the SDK refuses unknown keywords and the API refuses
    additionalProperties, so TurnKit converts or drops them."""
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "name": {"type": ["string", "null"], "examples": ["x"]},
            "kind": {"const": "thing"},
            "level": {"type": "integer", "enum": [1, 2], "exclusiveMinimum": 0},
            "either": {"oneOf": [{"type": "string"}, {"type": "null"}]},
            "item": {"$ref": "#/$defs/item"},
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        },
        "required": ["name", "missing"],
        "$defs": {"item": {"type": "object", "properties": {"id": {"type": "string"}}, "additionalProperties": False}},
    }
    assert gemini_schema(schema) == {
        "type": "object",
        "properties": {
            "name": {"type": "string", "nullable": True},
            "kind": {"type": "string", "enum": ["thing"]},
            "level": {"type": "string", "format": "enum", "enum": ["1", "2"], "minimum": 0},
            "either": {"type": "string", "nullable": True},
            "item": {"type": "object", "properties": {"id": {"type": "string"}}},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["name"],
    }


async def test_gemini_request_mapping(server: ProviderServer, gemini: GeminiClient) -> None:
    server.script(gemini_response({"text": '{"answer": 1, "sources": []}'}))
    image = {
        "role": "user",
        "content": "what is this?",
        "media": [{"kind": "image", "mime_type": "image/png", "data": PNG}],
    }
    strict_tool = LOOKUP.model_copy(update={"parameters": {**LOOKUP.parameters, "additionalProperties": False}})
    await gemini.chat(
        request(
            model="gemini/gemini-test",
            messages=[*HISTORY, image],
            tools=[strict_tool],
            instructions="Stable part.",
            dynamic_instructions="Dynamic part.",
            output_schema=OUTPUT_SCHEMA,
            thinking={"effort": "low"},
        )
    )

    [sent] = server.requests
    assert sent.path == "/v1beta/models/gemini-test:generateContent"  # the router's gemini/ prefix is dropped
    assert sent.headers["x-goog-api-key"] == "g-test"
    body = sent.body
    assert body["systemInstruction"]["parts"] == [{"text": "Stable part.\n\nDynamic part."}]
    assert body["contents"] == [
        {"role": "user", "parts": [{"text": "look up a and b"}]},
        {
            "role": "model",
            "parts": [
                {"text": "Looking."},
                {"functionCall": {"id": "call_a", "name": "lookup", "args": {"q": "a"}}},
                {"functionCall": {"id": "call_b", "name": "lookup", "args": {"q": "b"}}},
            ],
        },
        {  # both results in one user content, each named after its call
            "role": "user",
            "parts": [
                {"functionResponse": {"id": "call_a", "name": "lookup", "response": {"answer": "A"}}},
                {"functionResponse": {"id": "call_b", "name": "lookup", "response": {"answer": "B"}}},
            ],
        },
        {"role": "model", "parts": [{"text": "A and B."}]},
        {
            "role": "user",
            "parts": [
                {"text": "and c?"},
                {"inlineData": {"mimeType": "image/png", "data": PNG}},
                {"text": "what is this?"},
            ],
        },
    ]
    [declaration] = body["tools"][0]["functionDeclarations"]
    assert declaration["name"] == "lookup" and declaration["description"] == "Look something up."
    assert declaration["parameters"] == {"type": "OBJECT", "properties": {"q": {"type": "STRING"}}, "required": ["q"]}
    config = body["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert "additionalProperties" not in json.dumps(config["responseSchema"])
    assert config["responseSchema"]["properties"]["sources"]["items"]["type"] == "OBJECT"
    # The SDK sends the thinking config's own field names as given (the API reads either spelling).
    thinking = {key.replace("_", "").lower(): value for key, value in config["thinkingConfig"].items()}
    assert thinking == {"thinkingbudget": 1024, "includethoughts": True}


def test_gemini_thinking_options(gemini: GeminiClient) -> None:
    """A budget is a thinking_budget; an effort alone is a Gemini 3 model's thinking_level, else a budget for it."""

    def config(thinking: dict[str, Any], model: str) -> dict[str, Any]:
        return gemini.request_params(request(thinking=thinking), model)["config"]["thinking_config"]

    assert config({"effort": "high"}, "gemini-3-pro-preview") == {"thinking_level": "HIGH", "include_thoughts": True}
    assert config({"effort": "high", "budget": 500}, "gemini-3-pro") == {
        "thinking_budget": 500,
        "include_thoughts": True,
    }
    assert config({"effort": "high"}, "gemini-2.5-flash") == {"thinking_budget": 24576, "include_thoughts": True}
    quiet = GeminiClient(api_key="k", include_thoughts=False)
    assert quiet.request_params(request(thinking={"budget": 0}), "gemini-2.5-flash")["config"]["thinking_config"] == {
        "thinking_budget": 0,
        "include_thoughts": False,
    }


async def test_gemini_response_mapping(server: ProviderServer, gemini: GeminiClient) -> None:
    parts = [
        {"text": "I should look it up.", "thought": True},
        {"text": "Let me check."},
        gemini_call("lookup", {"q": "a"}, signature=SIGNATURE),
        gemini_call("lookup", {"q": "b"}, id="fc-2"),
    ]
    usage = {
        "promptTokenCount": 100,
        "cachedContentTokenCount": 40,
        "candidatesTokenCount": 30,
        "thoughtsTokenCount": 20,
        "totalTokenCount": 150,
    }
    server.script(gemini_response(*parts, usage=usage))
    result = await gemini.chat(request(model="gemini-test", tools=[LOOKUP]))

    assert [p["type"] for p in result.parts] == ["thinking", "text", "provider", "tool_call", "tool_call"]
    assert result.parts[0]["text"] == "I should look it up." and result.parts[0]["redacted"] is False
    assert result.text == "Let me check."
    assert result.parts[2]["kind"] == "gemini" and len(result.parts[2]["data"]) == 4
    assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == [
        ("call_0", "lookup", {"q": "a"}),  # Gemini sent no id: one is made up
        ("fc-2", "lookup", {"q": "b"}),
    ]
    buckets = result.usage
    assert (buckets.input_tokens, buckets.cached_tokens) == (60, 40)  # cached is inside promptTokenCount
    assert (buckets.output_tokens, buckets.thinking_tokens) == (30, 20)  # thoughts are outside candidates
    assert buckets.total_tokens == 150
    assert result.finish_reason == "tool_calls"


async def test_gemini_structured_output_and_blocked_prompt(server: ProviderServer, gemini: GeminiClient) -> None:
    server.script(
        gemini_response({"text": '{"answer": 42, "sources": []}'}),
        {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 3}},
    )
    assert (await gemini.chat(request(output_schema=OUTPUT_SCHEMA))).output_data == {"answer": 42, "sources": []}
    with pytest.raises(ModelError, match="Gemini returned no candidate: SAFETY"):
        await gemini.chat(request())


async def test_gemini_replays_its_own_parts_with_their_signatures(server: ProviderServer, gemini: GeminiClient) -> None:
    raw = [{"text": "thinking about c", "thought": True}, gemini_call("lookup", {"q": "c"}, signature=SIGNATURE)]
    server.script(gemini_response({"text": "ok"}))
    first = await gemini.chat(request())  # the provider part as TurnKit stores it (the SDK's JSON dump)
    server.script(gemini_response(*raw), gemini_response({"text": "C"}), gemini_response({"text": "C"}))
    stored = (await gemini.chat(request())).parts
    data = next(p["data"] for p in stored if p["type"] == "provider")
    own, foreign = replay_histories("call_0", own=("gemini", data), other=("anthropic", [{"type": "text"}]))

    await gemini.chat(request(messages=own))
    await gemini.chat(request(messages=foreign))

    assert first.text == "ok"
    replayed, rebuilt = (body["contents"] for body in server.bodies[2:])
    thought, call = replayed[1]["parts"]
    assert replayed[1]["role"] == "model"
    assert thought == {"text": "thinking about c", "thought": True}
    assert call["functionCall"] == {"name": "lookup", "args": {"q": "c"}}
    # The same signature bytes (the SDK writes bytes as URL-safe base64, which the API reads as well).
    assert base64.urlsafe_b64decode(call["thoughtSignature"]) == base64.b64decode(SIGNATURE)
    # Gemini's call had no id: the answer goes back by name only.
    assert replayed[2] == {
        "role": "user",
        "parts": [{"functionResponse": {"name": "lookup", "response": {"answer": "C"}}}],
    }
    assert rebuilt[1]["parts"][-1] == {"functionCall": {"id": "call_0", "name": "lookup", "args": {"q": "c"}}}
    assert "thoughtSignature" not in json.dumps(rebuilt)


@pytest.mark.parametrize("status", [400, 401, 403, 404])
async def test_gemini_client_errors_are_not_retryable(
    server: ProviderServer, gemini: GeminiClient, status: int
) -> None:
    server.script(gemini_error(status, "nope"))
    with pytest.raises(ModelError, match=f"^ClientError: {status} .*nope") as caught:
        await gemini.chat(request())
    assert not isinstance(caught.value, TransientModelError)
    assert len(server.requests) == 1


async def test_gemini_transient_errors_carry_the_providers_delay(server: ProviderServer, gemini: GeminiClient) -> None:
    """A 429's delay comes from its RetryInfo detail (what Gemini sends), or a retry-after header; a 5xx is retried
    after the policy's backoff; one HTTP call each (the SDK's retries are off)."""
    with_header = gemini_error(429, "quota", code="RESOURCE_EXHAUSTED")
    with_header.headers["retry-after"] = "2"
    server.script(
        gemini_error(429, "quota", code="RESOURCE_EXHAUSTED", retry_delay="3.5s"),
        with_header,
        gemini_error(503, "overloaded", code="UNAVAILABLE"),
    )
    delays: list[float | None] = []
    for _ in range(3):
        with pytest.raises(TransientModelError) as caught:
            await gemini.chat(request())
        delays.append(caught.value.retry_after)
    assert delays == [3.5, 2.0, None]
    assert str(caught.value).startswith("ServerError: 503")
    assert len(server.requests) == 3


async def test_gemini_connection_error_is_retryable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = GeminiClient(api_key="k", base_url=f"http://127.0.0.1:{port}")
    with pytest.raises(TransientModelError, match=r"^ConnectError: "):
        await client.chat(request())
    await client.close()


async def test_gemini_validate(monkeypatch: pytest.MonkeyPatch, server: ProviderServer, gemini: GeminiClient) -> None:
    """``validate`` looks the model up: a missing key needs no call; a refused key or an unknown model is a
    ModelAccessError that names the model."""
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ModelAccessError, match=r"^GEMINI_API_KEY or GOOGLE_API_KEY is required for gemini-test$"):
        await GeminiClient(base_url=server.url).validate(model="gemini-test")
    assert server.requests == []

    server.script(
        {"name": "models/gemini-test", "displayName": "Gemini Test"},
        gemini_error(404, "models/gemini-nope is not found", code="NOT_FOUND"),
        gemini_error(400, "API key not valid", code="INVALID_ARGUMENT"),
    )
    await gemini.validate(model="gemini-test")
    with pytest.raises(ModelAccessError, match=r"^model gemini-nope is not available: ClientError: 404"):
        await gemini.validate(model="gemini-nope")
    with pytest.raises(ModelAccessError, match=r"model gemini-test is not available: .*API key not valid"):
        await gemini.validate(model="gemini/gemini-test")
    assert [(r.method, r.path) for r in server.requests] == [
        ("GET", "/v1beta/models/gemini-test"),
        ("GET", "/v1beta/models/gemini-nope"),
        ("GET", "/v1beta/models/gemini-test"),
    ]


async def test_gemini_view_media_takes_audio(server: ProviderServer, gemini: GeminiClient) -> None:
    """Gemini reads audio and video too (the other clients refuse them): the bytes go inline before the objective."""
    server.script(gemini_response({"text": "A dog barks twice."}))
    audio = base64.b64encode(b"RIFF-wave-bytes").decode()
    media = {"media_id": "media_1", "kind": "audio", "mime_type": "audio/wav", "data": audio}
    result = await gemini.view_media(ViewMediaRequest(media=media, objective="What happens?", model="gemini-test"))
    [analysis] = result.parts
    assert (analysis["type"], analysis["text"], analysis["provider"]) == (
        "media_analysis",
        "A dog barks twice.",
        "gemini",
    )
    assert "data" not in analysis["media"]  # the bytes are not kept in the part
    assert server.bodies[0]["contents"] == [
        {
            "role": "user",
            "parts": [{"inlineData": {"mimeType": "audio/wav", "data": audio}}, {"text": "What happens?"}],
        }
    ]


async def test_gemini_paint(server: ProviderServer, gemini: GeminiClient) -> None:
    """Images out: an image model's inline image parts become ``image`` parts with standard base64 data."""
    server.script(
        gemini_response(
            {"text": "A red square."},
            {"inlineData": {"mimeType": "image/png", "data": PNG}},
            usage={"promptTokenCount": 10, "candidatesTokenCount": 1290},
        )
    )
    reference = {"kind": "image", "mime_type": "image/png", "data": PNG}
    result = await gemini.paint(
        PaintRequest(prompt="a red square", model="gemini-image", size="1:1", input_images=[reference])
    )
    assert result.parts == [
        {
            "type": "image",
            "mime_type": "image/png",
            "data": PNG,
            "model": "gemini-image",
            "provider": "gemini",
            "revised_prompt": "A red square.",
        }
    ]
    assert (result.usage.input_tokens, result.usage.output_tokens) == (10, 1290)
    body = server.bodies[0]
    assert body["contents"][0]["parts"] == [
        {"text": "a red square"},
        {"inlineData": {"mimeType": "image/png", "data": PNG}},
    ]
    assert body["generationConfig"]["responseModalities"] == ["IMAGE"]
    assert body["generationConfig"]["imageConfig"] == {"aspectRatio": "1:1"}


# -- end to end: real turns on the Temporal dev server ---------------------------------------------------------------


async def test_gemini_turn_end_to_end(tk: TurnKit, server: ProviderServer, gemini: GeminiClient) -> None:
    first = [{"text": "Need a lookup.", "thought": True}, gemini_call("lookup", {"q": "a"}, signature=SIGNATURE)]
    server.script(
        gemini_response(
            *first,
            usage={
                "promptTokenCount": 100,
                "cachedContentTokenCount": 60,
                "candidatesTokenCount": 10,
                "thoughtsTokenCount": 5,
            },
        ),
        gemini_response({"text": "It is A."}),
    )
    conversation = await tk.conversation(tool_agent(gemini, "gemini-e2e"))
    turn = await conversation.ask("what is a?", thinking={"budget": 256})

    assert turn.status == "completed", turn.error
    assert turn.output_text == "It is A."
    [execution] = await turn.tool_executions()
    assert (execution.tool_name, execution.status, execution.result) == ("lookup", "completed", {"answer": "A"})
    first_body, second_body = server.bodies
    assert server.requests[0].path == "/v1beta/models/gemini-e2e:generateContent"
    assert "Use lookup." in first_body["systemInstruction"]["parts"][0]["text"]
    assert first_body["contents"] == [{"role": "user", "parts": [{"text": "what is a?"}]}]
    # The second call replays the first answer's parts (signature intact), then the result named after its call.
    replayed = second_body["contents"][1]
    signature = base64.urlsafe_b64decode(replayed["parts"][1].pop("thoughtSignature"))
    assert signature == base64.b64decode(SIGNATURE)
    assert replayed == {"role": "model", "parts": [first[0], {"functionCall": first[1]["functionCall"]}]}
    [answer] = second_body["contents"][2]["parts"]
    assert answer["functionResponse"]["name"] == "lookup"
    assert answer["functionResponse"]["response"]["answer"] == "A"
    usage = turn.usage
    assert (usage.input_tokens, usage.cached_tokens) == (40 + 12, 60)
    assert (usage.output_tokens, usage.thinking_tokens) == (10 + 7, 5)
