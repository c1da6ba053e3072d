"""An Anthropic model client on the Messages API, through the official ``anthropic`` SDK.

Assistant messages that came from this API are replayed as their raw content blocks, so thinking blocks keep their
signatures (Anthropic requires them back, unchanged, while a tool loop continues).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Final

import anthropic
from anthropic.types import Message

from turnkit.kernel.errors import ModelAccessError
from turnkit.model import ModelRequest, Result, ToolCall, ToolSpec, Usage
from turnkit.providers._common import (
    ProviderClient,
    SdkErrors,
    build_result,
    count,
    exclusive_usage,
    join_instructions,
    media_inputs,
    replay_data,
    sdk_options,
    strict_schema,
)
from turnkit.streaming import DeltaSink

__all__ = ["DEFAULT_MAX_TOKENS", "PROVIDER_KIND", "AnthropicClient"]

#: The ``kind`` of the provider part that holds a response's raw content blocks.
PROVIDER_KIND: Final = "anthropic"

#: The default ``max_tokens`` of a call.
DEFAULT_MAX_TOKENS: Final = 8192

# A thinking option with only an effort still needs a token budget. Anthropic's minimum budget is 1024. The largest
# keeps budget + answer room under the SDK's limit for non-streaming calls (about 21 000 tokens at its default timeout).
_EFFORT_BUDGETS: Final = {"minimal": 1024, "low": 2048, "medium": 4096, "high": 12288}
_MIN_BUDGET: Final = 1024
# Thinking counts against max_tokens and the budget must stay below it: leave at least this much for the answer.
_ANSWER_TOKENS: Final = 4096

_CACHED: Final = {"type": "ephemeral"}


class AnthropicClient(ProviderClient[anthropic.AsyncAnthropic, Message]):
    """A :class:`turnkit.Client` for Claude models on the Messages API (``client.messages.create``).

    Example::

        agent = turnkit.Agent("helper", model="claude-sonnet-4-5", client=AnthropicClient())

    Provider failures raise :class:`~turnkit.kernel.errors.ModelError` (the turn fails), or
    :class:`~turnkit.kernel.errors.TransientModelError` for rate limits, overload, 5xx answers and connection problems
    (the model activity retries them). A missing API key or model raises
    :class:`~turnkit.kernel.errors.ModelAccessError`. ``chat`` makes one Messages API call and returns text, thinking
    and tool-call parts, plus the raw content blocks as a provider part.
    """

    errors = SdkErrors(
        connection=anthropic.APIConnectionError, status=anthropic.APIStatusError, base=anthropic.AnthropicError
    )
    provider = "anthropic"

    def __init__(
        self,
        model: str | None = None,
        *,
        client: anthropic.AsyncAnthropic | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        max_retries: int = 0,
        timeout: float | None = None,
        prompt_cache: bool = True,
        request_options: Mapping[str, Any] | None = None,
    ) -> None:
        """Create the client. Nothing is checked or connected until the first call.

        Args:
            model: Pin this client to one model; None uses each request's model (the agent's ``model``, else
                ``settings.default_model``).
            client: A ready SDK client, used as it is (with its own ``max_retries``); when given, ``api_key``,
                ``base_url``, ``max_retries`` and ``timeout`` are ignored.
            api_key: The API key; defaults to ``ANTHROPIC_API_KEY`` (or ``ANTHROPIC_AUTH_TOKEN``). For the SDK's
                other credential sources (profiles, credential providers), pass a ready ``client``.
            base_url: The API base URL; defaults to the SDK's.
            max_tokens: The call's token limit; with thinking it is raised, when needed, to the budget plus 4096.
            max_retries: The SDK's own retries inside one model activity attempt; 0 (the default) leaves retrying
                to the model activity's retry policy, which honours the provider's ``retry-after`` (issue 11).
            timeout: Seconds per HTTP request; defaults to the SDK's, which refuses non-streaming requests whose
                ``max_tokens`` could take longer than 10 minutes. Set it to allow large budgets.
            prompt_cache: Send the stable instructions as a cached system block when the request also has dynamic
                instructions (behaviour §3.6); False sends one plain system prompt.
            request_options: Extra ``messages.create`` arguments (e.g. ``temperature``, ``service_tier``);
                arguments derived from the request take precedence.
        """
        super().__init__(model, client, request_options)
        self.max_tokens = max_tokens
        self.prompt_cache = prompt_cache
        self._api_key = api_key
        self._sdk_options = sdk_options(base_url=base_url, max_retries=max_retries, timeout=timeout)

    def _new_sdk(self) -> anthropic.AsyncAnthropic:
        api_key = self._api_key or os.environ.get("ANTHROPIC_API_KEY")
        # The SDK itself only notices missing credentials when a request is sent, as a TypeError.
        if not api_key and not os.environ.get("ANTHROPIC_AUTH_TOKEN"):
            raise ModelAccessError("ANTHROPIC_API_KEY is not set")
        credentials = {"api_key": api_key} if api_key else {}
        return anthropic.AsyncAnthropic(**credentials, **self._sdk_options)

    def _missing_key(self) -> str | None:
        present = self._api_key or os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")
        return None if present else "ANTHROPIC_API_KEY"

    async def _lookup(self, sdk: anthropic.AsyncAnthropic, model: str) -> None:
        await sdk.models.retrieve(model)

    async def _send(self, sdk: anthropic.AsyncAnthropic, params: dict[str, Any]) -> Message:
        return await sdk.messages.create(**params)

    async def _stream(self, sdk: anthropic.AsyncAnthropic, params: dict[str, Any], sink: DeltaSink) -> Message | None:
        # The SDK's stream helper accumulates the events into the message the same call without streaming returns.
        stopped = False
        async with sdk.messages.stream(**params) as stream:
            async for event in stream:
                if event.type == "content_block_delta":
                    if event.delta.type == "text_delta":
                        sink.text(event.delta.text)
                    elif event.delta.type == "thinking_delta":
                        sink.thinking(event.delta.thinking)
                elif event.type == "message_stop":
                    stopped = True
            return await stream.get_final_message() if stopped else None

    def _result(self, answer: Message, request: ModelRequest, model: str) -> Result:
        return result_from_content(
            [block.to_dict(mode="json") for block in answer.content],
            answer.usage.to_dict(mode="json"),
            model=model,
            finish_reason=answer.stop_reason,
            structured=request.output_schema is not None,
        )

    def request_params(self, request: ModelRequest, model: str) -> dict[str, Any]:
        """The ``messages.create`` arguments for a request (exposed for inspection and tests)."""
        params: dict[str, Any] = {
            **self.request_options,
            "model": model,
            "max_tokens": self.max_tokens,
            "messages": message_params(request.messages),
        }
        system = self._system(request)
        if system:
            params["system"] = system
        if request.tools:
            params["tools"] = [tool_param(spec) for spec in request.tools]
        if request.thinking:
            budget = thinking_budget(request.thinking)
            params["thinking"] = {"type": "enabled", "budget_tokens": budget}
            params["max_tokens"] = max(self.max_tokens, budget + _ANSWER_TOKENS)
        if request.output_schema is not None:
            params["output_config"] = {
                "format": {"type": "json_schema", "schema": strict_schema(request.output_schema)}
            }
        return params

    def _system(self, request: ModelRequest) -> str | list[dict[str, Any]]:
        if self.prompt_cache and request.instructions and request.dynamic_instructions:
            # The stable part is identical across a conversation's turns; caching it (and the tools before it)
            # leaves only the per-turn part uncached.
            return [
                {"type": "text", "text": request.instructions, "cache_control": dict(_CACHED)},
                {"type": "text", "text": request.dynamic_instructions},
            ]
        return join_instructions(request.instructions, request.dynamic_instructions)


def message_params(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Projected messages (behaviour §3.5) as Messages API messages.

    Assistant messages with an ``anthropic`` provider part are replayed as those raw content blocks; others become
    a text block plus ``tool_use`` blocks. Tool results become ``tool_result`` blocks in a user message. Consecutive
    messages of one role are merged, because Anthropic expects alternating roles and wants all the results of one
    assistant message's tool calls together in the next user message.
    """
    merged: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        content = str(message.get("content") or "")
        blocks: list[Any]
        if role == "tool":
            role = "user"
            blocks = [
                {"type": "tool_result", "tool_use_id": str(message.get("tool_call_id") or ""), "content": content}
            ]
        elif role == "assistant":
            replay = replay_data(message, PROVIDER_KIND)
            blocks = replay if replay is not None else _assistant_blocks(content, message.get("tool_calls") or ())
        else:
            role = "user"
            blocks = media_blocks(message)  # media first: Anthropic reads an image best before the text about it
            blocks += [{"type": "text", "text": content}] if content else []
        if not blocks:
            continue  # Anthropic rejects empty messages and empty text blocks
        if merged and merged[-1]["role"] == role:
            merged[-1]["content"].extend(blocks)
        else:
            merged.append({"role": role, "content": list(blocks)})
    return merged


def media_blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The media of a projected user message as Messages API ``image`` / ``document`` blocks (base64 sources)."""
    return [
        {
            "type": "image" if media.kind == "image" else "document",
            "source": {"type": "base64", "media_type": media.mime_type, "data": media.data},
        }
        for media in media_inputs(message, "Anthropic")
    ]


def _assistant_blocks(content: str, tool_calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
    for call in tool_calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or ""),
                "name": str(call.get("name") or ""),
                "input": dict(call.get("arguments") or {}),
            }
        )
    return blocks


def tool_param(spec: ToolSpec) -> dict[str, Any]:
    """A TurnKit tool as a Messages API tool."""
    tool: dict[str, Any] = {"name": spec.name, "input_schema": spec.parameters}
    if spec.description:
        tool["description"] = spec.description
    return tool


def thinking_budget(thinking: Mapping[str, Any]) -> int:
    """The ``budget_tokens`` for a thinking option ``{effort?, budget?}``: the budget, else one sized to the effort.

    Unknown efforts get the ``medium`` budget; every budget is raised to Anthropic's minimum of 1024.
    """
    budget = thinking.get("budget")
    if budget is None:
        budget = _EFFORT_BUDGETS.get(str(thinking.get("effort") or "medium"), _EFFORT_BUDGETS["medium"])
    return max(int(budget), _MIN_BUDGET)


def result_from_content(
    blocks: Sequence[dict[str, Any]],
    usage: Mapping[str, Any],
    *,
    model: str,
    finish_reason: str | None,
    structured: bool,
) -> Result:
    """A :class:`Result` from a message's content blocks (JSON dicts) and ``usage``.

    Parts, in order (behaviour §3.6): text, thinking and unknown block types as they come; then every raw block in one
    ``anthropic`` provider part; then the ``tool_call`` parts.
    """
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    texts: list[str] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            text = str(block.get("text") or "")
            if text:
                texts.append(text)
                parts.append({"type": "text", "text": text})
        elif kind == "thinking":
            parts.append(
                {
                    "type": "thinking",
                    "text": block.get("thinking") or "",
                    "signature": block.get("signature"),
                    "redacted": False,
                }
            )
        elif kind == "redacted_thinking":
            parts.append({"type": "thinking", "text": "", "signature": None, "redacted": True})
        elif kind == "tool_use":
            calls.append(
                ToolCall.parse(str(block.get("id") or ""), str(block.get("name") or ""), block.get("input")).to_part()
            )
        else:
            parts.append({"type": "provider", "kind": str(kind), "data": block})
    return build_result(
        parts,
        calls,
        texts,
        blocks,
        kind=PROVIDER_KIND,
        usage=usage_from(usage),
        model=model,
        finish_reason=finish_reason,
        structured=structured,
    )


def usage_from(usage: Mapping[str, Any]) -> Usage:
    """Exclusive usage buckets from a Messages ``usage`` object.

    Anthropic already reports cache reads and writes outside ``input_tokens``; thinking is inside ``output_tokens``
    and is subtracted so that no token is counted twice.
    """
    return exclusive_usage(
        input_tokens=count(usage, "input_tokens"),
        output_tokens=count(usage, "output_tokens"),
        cached=count(usage, "cache_read_input_tokens"),
        cache_write=count(usage, "cache_creation_input_tokens"),
        thinking=count(usage, "output_tokens_details", "thinking_tokens"),
        cache_in_input=False,
    )
