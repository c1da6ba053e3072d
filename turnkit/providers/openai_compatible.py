"""A client for OpenAI-compatible endpoints (OpenRouter, vLLM, Ollama, LiteLLM's proxy) on the Chat Completions
wire format (``POST {base_url}/chat/completions``), through the official ``openai`` SDK.

These servers speak Chat Completions, not OpenAI's Responses API (:class:`~turnkit.providers.OpenAIClient`). An
assistant message that came from such an endpoint is replayed as its raw message (``kind: "openai_chat"``), which
keeps OpenRouter's ``reasoning_details`` for the next call.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import openai
from openai.types.chat import ChatCompletion

from turnkit.kernel.errors import ConfigError, ModelAccessError, ModelError
from turnkit.model import ModelRequest, Result, ToolCall, ToolSpec, Usage
from turnkit.providers._common import (
    ProviderClient,
    SdkErrors,
    build_result,
    count,
    exclusive_usage,
    fully_required,
    join_instructions,
    media_inputs,
    replay_data,
    sdk_options,
    strict_schema,
)
from turnkit.providers.openai import reasoning_effort

__all__ = ["PROVIDER_KIND", "OpenAICompatibleClient"]

#: The ``kind`` of the provider part that holds a response's raw assistant message.
PROVIDER_KIND: Final = "openai_chat"

# The keys of an assistant message that are sent back on replay (others, e.g. "refusal" or "reasoning", some
# servers refuse in a request).
_REPLAYED: Final = ("role", "content", "tool_calls", "reasoning_details")

# What a server without keys gets as the key: the SDK insists on one.
_NO_KEY: Final = "none"

ThinkingStyle = Literal["reasoning_effort", "openrouter", "none"]


class OpenAICompatibleClient(ProviderClient[openai.AsyncOpenAI, ChatCompletion]):
    """A :class:`turnkit.Client` for an OpenAI-compatible Chat Completions endpoint (``chat.completions.create``).

    Example::

        client = OpenAICompatibleClient(base_url="http://localhost:11434/v1")  # Ollama
        agent = turnkit.Agent("helper", model="qwen3:8b", client=client)

    Errors are those of :class:`~turnkit.providers.OpenAIClient`: ``ModelError`` fails the turn,
    ``TransientModelError`` (429, 5xx, no answer) is retried by the model activity after the provider's
    ``retry-after``, and a missing key or model is a ``ModelAccessError``.
    """

    errors = SdkErrors(connection=openai.APIConnectionError, status=openai.APIStatusError, base=openai.OpenAIError)
    provider = "openai_compatible"

    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        client: openai.AsyncOpenAI | None = None,
        provider: str | None = None,
        thinking_style: ThinkingStyle = "reasoning_effort",
        max_retries: int = 0,
        timeout: float | None = None,
        default_headers: Mapping[str, str] | None = None,
        request_options: Mapping[str, Any] | None = None,
    ) -> None:
        """Create the client. Nothing is checked or connected until the first call.

        Args:
            model: Pin this client to one model (the name the endpoint knows); None uses each request's model.
            base_url: The endpoint's base URL, up to ``/v1`` (e.g. ``https://openrouter.ai/api/v1``); required
                unless ``client`` is given.
            api_key: The API key; defaults to ``$api_key_env``. Local servers (vLLM, Ollama) need none.
            api_key_env: The environment variable holding the key; when set, a missing key is a
                ``ModelAccessError`` naming it.
            client: A ready SDK client, used as it is; ``base_url``, ``api_key``, ``max_retries``, ``timeout`` and
                ``default_headers`` are ignored then.
            provider: The name recorded on ``image`` / ``media_analysis`` parts (default ``openai_compatible``).
            thinking_style: How a turn's thinking option is sent: ``reasoning_effort`` (Chat Completions' own
                field), ``openrouter`` (OpenRouter's ``reasoning`` object, with ``max_tokens`` for a budget) or
                ``none`` (not sent).
            max_retries: The SDK's own retries; 0 (the default) leaves retrying to the model activity (issue 11).
            timeout: Seconds per HTTP request; defaults to the SDK's.
            default_headers: Extra headers on every request (e.g. OpenRouter's ``HTTP-Referer``).
            request_options: Extra ``chat.completions.create`` arguments (e.g. ``temperature``, ``extra_body``);
                arguments derived from the request take precedence.
        """
        super().__init__(model, client, request_options)
        if client is None and not base_url:
            raise ValueError("base_url is required (or pass a ready client)")
        self.base_url = base_url or str(client.base_url if client is not None else "")
        self.api_key_env = api_key_env
        self.thinking_style: ThinkingStyle = thinking_style
        if provider:
            self.provider = provider  # pyright: ignore[reportAttributeAccessIssue]
        self._api_key = api_key
        self._sdk_options = sdk_options(
            base_url=base_url, max_retries=max_retries, timeout=timeout, default_headers=default_headers
        )

    def _key(self) -> str | None:
        return self._api_key or (os.environ.get(self.api_key_env) if self.api_key_env else None)

    def _new_sdk(self) -> openai.AsyncOpenAI:
        key = self._key()
        if not key and self.api_key_env:
            raise ModelAccessError(f"{self.api_key_env} is not set")
        return openai.AsyncOpenAI(api_key=key or _NO_KEY, **self._sdk_options)

    async def _send(self, sdk: openai.AsyncOpenAI, params: dict[str, Any]) -> ChatCompletion:
        return await sdk.chat.completions.create(**params)

    def _missing_key(self) -> str | None:
        return self.api_key_env if self.api_key_env and not self._key() else None

    async def _lookup(self, sdk: openai.AsyncOpenAI, model: str) -> None:
        # GET /models: every compatible server has it (vLLM has no GET /models/{id}); the model must be listed.
        listed = [each.id async for each in sdk.models.list()]
        if model not in listed:
            raise ModelAccessError(
                f"model {model} is not available at {self.base_url} (not among its {len(listed)} models)"
            )

    def _result(self, answer: ChatCompletion, request: ModelRequest, model: str) -> Result:
        data = answer.to_dict(mode="json")
        return result_from_completion(data, model=model, structured=request.output_schema is not None)

    def request_params(self, request: ModelRequest, model: str) -> dict[str, Any]:
        """The ``chat.completions.create`` arguments for a request (exposed for inspection and tests)."""
        params: dict[str, Any] = {**self.request_options, "model": model}
        messages = chat_messages(request.messages)
        instructions = join_instructions(request.instructions, request.dynamic_instructions)
        if instructions:
            messages.insert(0, {"role": "system", "content": instructions})
        params["messages"] = messages
        if request.tools:
            params["tools"] = [function_tool(spec) for spec in request.tools]
        if request.output_schema is not None:
            schema = strict_schema(request.output_schema)
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": schema, "strict": fully_required(schema)},
            }
        if request.thinking and self.thinking_style == "reasoning_effort":
            params["reasoning_effort"] = reasoning_effort(request.thinking)
        elif request.thinking and self.thinking_style == "openrouter":
            budget = request.thinking.get("budget")
            reasoning = {"max_tokens": int(budget)} if budget else {"effort": reasoning_effort(request.thinking)}
            params["extra_body"] = {**dict(params.get("extra_body") or {}), "reasoning": reasoning}
        return params


def chat_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Projected messages (behaviour §3.5) as Chat Completions messages.

    Assistant messages with an ``openai_chat`` provider part are replayed as that raw message; others become an
    assistant message with ``tool_calls``. Tool results become ``tool`` messages; user media become ``image_url`` /
    ``file`` content parts (data URLs).
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        content = str(message.get("content") or "")
        if role == "tool":
            out.append({"role": "tool", "tool_call_id": str(message.get("tool_call_id") or ""), "content": content})
        elif role == "assistant":
            replay = replay_data(message, PROVIDER_KIND)
            if replay:
                out.extend(dict(item) for item in replay)
                continue
            assistant: dict[str, Any] = {"role": "assistant", "content": content or None}
            calls = [
                {
                    "id": str(call.get("id") or ""),
                    "type": "function",
                    "function": {
                        "name": str(call.get("name") or ""),
                        "arguments": json.dumps(call.get("arguments") or {}, ensure_ascii=False),
                    },
                }
                for call in message.get("tool_calls") or ()
            ]
            if calls:
                assistant["tool_calls"] = calls
            out.append(assistant)
        elif message.get("media"):
            out.append({"role": "user", "content": user_content(content, message)})
        else:
            out.append({"role": "user", "content": content})
    return out


#: The audio formats Chat Completions' ``input_audio`` takes, by MIME type (OpenAI's audio models, and endpoints
#: that follow them).
AUDIO_FORMATS: Final = {
    "audio/wav": "wav",
    "audio/x-wav": "wav",
    "audio/wave": "wav",
    "audio/mpeg": "mp3",
    "audio/mp3": "mp3",
}


def user_content(text: str, message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A user message with media as Chat Completions content parts: the text, then images and files (data URLs) and
    audio (``input_audio``, wav or mp3, for audio models such as OpenAI's ``gpt-4o-audio-preview``).

    Raises:
        ConfigError: Video, or audio in another format (the message names it).
    """
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for media in media_inputs(message, "Chat Completions", kinds=("image", "document", "audio")):
        url = f"data:{media.mime_type};base64,{media.data}"
        if media.kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif media.kind == "audio":
            audio_format = AUDIO_FORMATS.get(media.mime_type)
            if audio_format is None:
                raise ConfigError(f"Chat Completions takes wav or mp3 audio, not {media.mime_type}")
            parts.append({"type": "input_audio", "input_audio": {"data": media.data, "format": audio_format}})
        else:
            parts.append({"type": "file", "file": {"filename": media.filename or "document.pdf", "file_data": url}})
    return parts


def function_tool(spec: ToolSpec) -> dict[str, Any]:
    """A TurnKit tool as a Chat Completions function tool."""
    function: dict[str, Any] = {"name": spec.name, "parameters": spec.parameters}
    if spec.description:
        function["description"] = spec.description
    return {"type": "function", "function": function}


def result_from_completion(completion: Mapping[str, Any], *, model: str, structured: bool) -> Result:
    """A :class:`Result` from a ``chat.completion`` (JSON).

    Parts, in order (behaviour §3.6): thinking (OpenRouter's ``reasoning``, or ``reasoning_content`` as vLLM and
    DeepSeek send it), text; then the raw assistant message in one ``openai_chat`` provider part; then the
    ``tool_call`` parts.

    Raises:
        ModelError: The completion has no choice.
    """
    choices = completion.get("choices") or []
    if not choices:
        raise ModelError("Chat Completions answer has no choices")
    choice = choices[0]
    message: Mapping[str, Any] = choice.get("message") or {}
    parts: list[dict[str, Any]] = []
    texts: list[str] = []
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if reasoning:
        parts.append({"type": "thinking", "text": str(reasoning), "signature": None, "redacted": False})
    content = message.get("content") or message.get("refusal")
    if content:
        texts.append(str(content))
        parts.append({"type": "text", "text": str(content)})
    calls = [
        ToolCall.parse(
            str(call.get("id") or f"call_{index}"),
            str((call.get("function") or {}).get("name") or ""),
            (call.get("function") or {}).get("arguments"),
        ).to_part()
        for index, call in enumerate(message.get("tool_calls") or ())
    ]
    raw = {key: message[key] for key in _REPLAYED if message.get(key) is not None}
    raw.setdefault("role", "assistant")
    return build_result(
        parts,
        calls,
        texts,
        [raw],
        kind=PROVIDER_KIND,
        usage=usage_from(completion.get("usage") or {}),
        model=model,
        finish_reason="tool_calls" if calls else (choice.get("finish_reason") or "stop"),
        structured=structured,
    )


def usage_from(usage: Mapping[str, Any]) -> Usage:
    """Exclusive usage buckets from a Chat Completions ``usage``: cached input is inside ``prompt_tokens`` and
    reasoning inside ``completion_tokens`` (both subtracted); OpenRouter's ``cost`` is kept."""
    buckets = exclusive_usage(
        input_tokens=count(usage, "prompt_tokens"),
        output_tokens=count(usage, "completion_tokens"),
        cached=count(usage, "prompt_tokens_details", "cached_tokens"),
        cache_write=count(usage, "prompt_tokens_details", "cache_write_tokens"),
        thinking=count(usage, "completion_tokens_details", "reasoning_tokens"),
        cache_in_input=True,
    )
    cost = usage.get("cost")
    return buckets.model_copy(update={"cost": float(cost)}) if isinstance(cost, int | float) else buckets
