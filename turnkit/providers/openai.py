"""An OpenAI model client on the Responses API, through the official ``openai`` SDK.

The request carries the whole projected history every time (no ``previous_response_id``): TurnKit's store is the
source of truth, so a turn can move between workers and models. Assistant messages that came from this API are
replayed as their raw ``output`` items, which keeps reasoning items and call ids intact.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, Final

import openai
from openai.types.responses import Response

from turnkit.kernel.errors import ConfigError, ModelAccessError, ModelError, TransientModelError
from turnkit.media_requests import PaintRequest
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
    resolve_model,
    sdk_options,
    strict_schema,
    translated_errors,
)
from turnkit.streaming import DeltaSink

__all__ = ["PROVIDER_KIND", "OpenAIClient"]

#: The ``kind`` of the provider part that holds a response's raw ``output`` items.
PROVIDER_KIND: Final = "openai_responses"

# A thinking option with only a token budget still needs an effort level: the smallest whose usual spend covers it.
_BUDGET_EFFORTS: Final = ((2048, "low"), (8192, "medium"))
_LARGEST_EFFORT: Final = "high"

# OpenAI accepts at most 16 metadata entries, keys up to 64 characters and values up to 512.
_METADATA_LIMITS: Final = (16, 64, 512)


class OpenAIClient(ProviderClient[openai.AsyncOpenAI, Response]):
    """A :class:`turnkit.Client` for OpenAI models on the Responses API (``client.responses.create``).

    Example::

        agent = turnkit.Agent("helper", model="gpt-5-mini", client=OpenAIClient())

    Provider failures raise :class:`~turnkit.kernel.errors.ModelError` (the turn fails), or
    :class:`~turnkit.kernel.errors.TransientModelError` for rate limits, 5xx answers and connection problems (the model
    activity retries them). A missing API key or model raises :class:`~turnkit.kernel.errors.ModelAccessError`.
    ``chat`` makes one Responses API call and returns text, thinking and tool-call parts, plus the raw output items
    as a provider part; a response that did not complete raises ``ModelError``.
    """

    errors = SdkErrors(connection=openai.APIConnectionError, status=openai.APIStatusError, base=openai.OpenAIError)
    provider = "openai"

    def __init__(
        self,
        model: str | None = None,
        *,
        client: openai.AsyncOpenAI | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = 0,
        timeout: float | None = None,
        reasoning_summary: str | None = None,
        request_options: Mapping[str, Any] | None = None,
    ) -> None:
        """Create the client. Nothing is checked or connected until the first call.

        Args:
            model: Pin this client to one model; None uses each request's model (the agent's ``model``, else
                ``settings.default_model``).
            client: A ready SDK client, used as it is (with its own ``max_retries``); when given, ``api_key``,
                ``base_url``, ``max_retries`` and ``timeout`` are ignored.
            api_key: The API key; defaults to ``OPENAI_API_KEY``.
            base_url: The API base URL (an OpenAI-compatible endpoint); defaults to the SDK's.
            max_retries: The SDK's own retries inside one model activity attempt; 0 (the default) leaves retrying
                to the model activity's retry policy, which honours the provider's ``retry-after`` (issue 11).
            timeout: Seconds per HTTP request; defaults to the SDK's.
            reasoning_summary: ``"auto"``, ``"concise"`` or ``"detailed"`` to ask for reasoning summaries (they
                become ``thinking`` parts) when a turn has a thinking option.
            request_options: Extra ``responses.create`` arguments (e.g. ``store``, ``max_output_tokens``,
                ``service_tier``); arguments derived from the request take precedence.
        """
        super().__init__(model, client, request_options)
        self.reasoning_summary = reasoning_summary
        self._sdk_options = sdk_options(api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout)

    def _new_sdk(self) -> openai.AsyncOpenAI:
        try:
            return openai.AsyncOpenAI(**self._sdk_options)
        except openai.OpenAIError as err:  # no api_key and no OPENAI_API_KEY
            raise ModelAccessError(f"{type(err).__name__}: {err}") from err

    def _missing_key(self) -> str | None:
        return None if self._sdk_options.get("api_key") or os.environ.get("OPENAI_API_KEY") else "OPENAI_API_KEY"

    async def _lookup(self, sdk: openai.AsyncOpenAI, model: str) -> None:
        await sdk.models.retrieve(model)

    async def _send(self, sdk: openai.AsyncOpenAI, params: dict[str, Any]) -> Response:
        return await sdk.responses.create(**params)

    async def _stream(self, sdk: openai.AsyncOpenAI, params: dict[str, Any], sink: DeltaSink) -> Response | None:
        # The stream's last event carries the whole response, as the same call without streaming returns it. (One
        # `==` per event type: that is what narrows the SDK's union of event classes.)
        final: Response | None = None
        stream = await sdk.responses.create(**params, stream=True)
        async with stream:
            async for event in stream:
                if event.type == "response.output_text.delta":
                    sink.text(event.delta)
                elif (
                    event.type == "response.reasoning_summary_text.delta"
                    or event.type == "response.reasoning_text.delta"
                ):
                    sink.thinking(event.delta)
                elif (
                    event.type == "response.completed"
                    or event.type == "response.incomplete"
                    or event.type == "response.failed"
                ):
                    final = event.response
                elif event.type == "error":
                    raise _stream_error(event.code, event.message)
        return final

    def _result(self, answer: Response, request: ModelRequest, model: str) -> Result:
        if answer.status != "completed":
            raise ModelError(_incomplete_message(answer.to_dict(mode="json")))
        usage = answer.usage.to_dict(mode="json") if answer.usage is not None else {}
        return result_from_output(
            [item.to_dict(mode="json") for item in answer.output],
            usage,
            model=model,
            structured=request.output_schema is not None,
        )

    async def paint(self, request: PaintRequest) -> Result:
        """Generate one image (behaviour §3.6): with ``images.generate`` from the prompt alone, or with
        ``images.edit`` when ``input_images`` (reference images, the first one edited) or a ``mask`` (its transparent
        area is what changes) are given. Returns an ``image`` part with the base64 ``data`` (or the ``url`` the API
        answered with), the revised prompt, and the call's usage.

        Raises:
            ConfigError: A ``mask`` without ``input_images`` (a mask applies to the image it edits).
            ModelError: The provider refused the request (see :meth:`chat` for the other errors).
        """
        if request.mask is not None and not request.input_images:
            raise ConfigError("OpenAIClient.paint: a mask needs the image it edits; give input_images too")
        params = image_params(request)
        sdk = self.sdk
        async with translated_errors(self.errors):
            if request.input_images:
                answer = await sdk.images.edit(**params, **edit_files(request))
            else:
                answer = await sdk.images.generate(**params)
        return image_result(answer.to_dict(mode="json"), model=params["model"])

    def request_params(self, request: ModelRequest, model: str) -> dict[str, Any]:
        """The ``responses.create`` arguments for a request (exposed for inspection and tests)."""
        params: dict[str, Any] = {**self.request_options, "model": model, "input": input_items(request.messages)}
        instructions = join_instructions(request.instructions, request.dynamic_instructions)
        if instructions:
            params["instructions"] = instructions
        if request.tools:
            params["tools"] = [function_tool(spec) for spec in request.tools]
        if request.output_schema is not None:
            schema = strict_schema(request.output_schema)
            params["text"] = {
                "format": {"type": "json_schema", "name": "output", "schema": schema, "strict": fully_required(schema)}
            }
        if request.thinking:
            reasoning: dict[str, Any] = {"effort": reasoning_effort(request.thinking)}
            if self.reasoning_summary:
                reasoning["summary"] = self.reasoning_summary
            params["reasoning"] = reasoning
        metadata = _metadata(request.metadata)
        if metadata:
            params["metadata"] = metadata
        return params


def input_items(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Projected messages (behaviour §3.5) as Responses API input items.

    Assistant messages with an ``openai_responses`` provider part are replayed as those raw output items; others
    become an assistant message plus ``function_call`` items. Tool results become ``function_call_output`` items.
    """
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        content = str(message.get("content") or "")
        if role == "tool":
            items.append(
                {"type": "function_call_output", "call_id": str(message.get("tool_call_id") or ""), "output": content}
            )
        elif role == "assistant":
            replay = replay_data(message, PROVIDER_KIND)
            if replay is not None:
                items.extend(replay)
                continue
            if content:
                items.append({"role": "assistant", "content": content})
            for call in message.get("tool_calls") or ():
                items.append(
                    {
                        "type": "function_call",
                        "call_id": str(call.get("id") or ""),
                        "name": str(call.get("name") or ""),
                        "arguments": json.dumps(call.get("arguments") or {}, ensure_ascii=False),
                    }
                )
        elif message.get("media"):
            items.append({"role": "user", "content": user_content(content, message)})
        else:
            items.append({"role": "user", "content": content})
    return items


def user_content(text: str, message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A user message with media as Responses content parts: the text (``input_text``), then each image as an
    ``input_image`` data URL and each document as an ``input_file``."""
    content: list[dict[str, Any]] = [{"type": "input_text", "text": text}] if text else []
    # The Responses API takes no audio or video in a message; OpenAI's audio models take audio through Chat
    # Completions, which OpenAICompatibleClient speaks.
    instead = ": for audio, use OpenAICompatibleClient(base_url='https://api.openai.com/v1') with an audio model"
    for media in media_inputs(message, "OpenAI's Responses API", instead=instead):
        url = f"data:{media.mime_type};base64,{media.data}"
        if media.kind == "image":
            content.append({"type": "input_image", "image_url": url, "detail": "auto"})
        else:
            content.append({"type": "input_file", "filename": media.filename or "document.pdf", "file_data": url})
    return content


def image_params(request: PaintRequest) -> dict[str, Any]:
    """The ``images.generate`` / ``images.edit`` arguments for a paint request other than its files: its params, then
    model, prompt, size and ``n=1``."""
    params: dict[str, Any] = {**request.params, "model": resolve_model(None, request.model), "prompt": request.prompt}
    if request.size:
        params["size"] = request.size
    params["n"] = 1
    return params


def edit_files(request: PaintRequest) -> dict[str, Any]:
    """The ``images.edit`` files of a paint request: ``image`` (one file, or a list when there are several reference
    images, which only the GPT image models take) and the optional ``mask``, each ``(filename, bytes, mime_type)``."""
    images = [_upload(each, f"image-{index}") for index, each in enumerate(request.input_images, start=1)]
    files: dict[str, Any] = {"image": images[0] if len(images) == 1 else images}
    if request.mask is not None:
        files["mask"] = _upload(request.mask, "mask")
    return files


def _upload(reference: Mapping[str, Any], stem: str) -> tuple[str, bytes, str]:
    """A media reference with base64 ``data`` as a multipart file: its name (the stored filename, else ``stem`` with
    the type's extension, which the API uses to tell the format), its bytes and its type."""
    mime_type = str(reference.get("mime_type") or "image/png")
    filename = reference.get("filename") or f"{stem}.{mime_type.rsplit('/', 1)[-1]}"
    return str(filename), base64.b64decode(reference["data"]), mime_type


def image_result(answer: Mapping[str, Any], *, model: str) -> Result:
    """An ``images.generate`` answer (JSON) as ``image`` parts and usage."""
    mime_type = f"image/{answer.get('output_format') or 'png'}"
    parts: list[dict[str, Any]] = []
    for image in answer.get("data") or ():
        part: dict[str, Any] = {"type": "image", "mime_type": mime_type, "model": model, "provider": "openai"}
        for source, key in (("b64_json", "data"), ("url", "url"), ("revised_prompt", "revised_prompt")):
            if image.get(source):
                part[key] = image[source]
        parts.append(part)
    usage = answer.get("usage") or {}
    return Result(
        parts=parts,
        usage=Usage(input_tokens=count(usage, "input_tokens"), output_tokens=count(usage, "output_tokens")),
        model=model,
    )


def function_tool(spec: ToolSpec) -> dict[str, Any]:
    """A TurnKit tool as a Responses API function tool.

    ``strict`` is off: TurnKit tools may have optional parameters, which strict mode rejects, and TurnKit validates
    the arguments itself.
    """
    tool: dict[str, Any] = {"type": "function", "name": spec.name, "parameters": spec.parameters, "strict": False}
    if spec.description:
        tool["description"] = spec.description
    return tool


def reasoning_effort(thinking: Mapping[str, Any]) -> str:
    """The reasoning effort for a thinking option ``{effort?, budget?}``: the effort, else one sized to the budget."""
    effort = thinking.get("effort")
    if effort:
        return str(effort)
    budget = int(thinking.get("budget") or 0)
    return next((name for limit, name in _BUDGET_EFFORTS if budget <= limit), _LARGEST_EFFORT)


def result_from_output(
    items: Sequence[dict[str, Any]], usage: Mapping[str, Any], *, model: str, structured: bool
) -> Result:
    """A :class:`Result` from a completed response's ``output`` items (JSON dicts) and ``usage``.

    Parts, in order (behaviour §3.6): text, thinking and unknown item types as they come; then every raw item in one
    ``openai_responses`` provider part; then the ``tool_call`` parts.
    """
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    texts: list[str] = []
    for item in items:
        kind = item.get("type")
        if kind == "message":
            for content in item.get("content") or ():
                text = content.get("text") if content.get("type") == "output_text" else content.get("refusal")
                if text:
                    texts.append(str(text))
                    parts.append({"type": "text", "text": str(text)})
        elif kind == "reasoning":
            pieces = [s.get("text") for s in item.get("summary") or ()] or [
                c.get("text") for c in item.get("content") or ()
            ]
            text = "\n".join(str(piece) for piece in pieces if piece)
            if text:
                parts.append({"type": "thinking", "text": text, "signature": None, "redacted": False})
        elif kind == "function_call":
            call = ToolCall.parse(str(item.get("call_id") or ""), str(item.get("name") or ""), item.get("arguments"))
            calls.append(call.to_part())
        else:
            parts.append({"type": "provider", "kind": str(kind), "data": item})
    return build_result(
        parts,
        calls,
        texts,
        items,
        kind=PROVIDER_KIND,
        usage=usage_from(usage),
        model=model,
        finish_reason="tool_calls" if calls else "stop",
        structured=structured,
    )


def usage_from(usage: Mapping[str, Any]) -> Usage:
    """Exclusive usage buckets from a Responses ``usage`` object.

    OpenAI counts cached (and cache-written) input inside ``input_tokens`` and reasoning inside ``output_tokens``;
    they are subtracted so that no token is counted twice.
    """
    return exclusive_usage(
        input_tokens=count(usage, "input_tokens"),
        output_tokens=count(usage, "output_tokens"),
        cached=count(usage, "input_tokens_details", "cached_tokens"),
        cache_write=count(usage, "input_tokens_details", "cache_write_tokens"),
        thinking=count(usage, "output_tokens_details", "reasoning_tokens"),
        cache_in_input=True,
    )


def _stream_error(code: str | None, message: str) -> Exception:
    """An ``error`` event of a stream: transient for the server's own failures and rate limits, else a ModelError."""
    text = f"OpenAI stream error {code or ''}: {message}".replace("  ", " ")
    transient = code is not None and any(word in code for word in ("server", "rate_limit", "overloaded", "timeout"))
    return TransientModelError(text) if transient else ModelError(text)


def _incomplete_message(response: Mapping[str, Any]) -> str:
    status = response.get("status") or "unknown"
    reason = (response.get("incomplete_details") or {}).get("reason") or (response.get("error") or {}).get("message")
    return f"OpenAI response {status}" + (f": {reason}" if reason else "")


def _metadata(metadata: Mapping[str, Any]) -> dict[str, str]:
    # Behaviour §3.6: the request metadata (turn, conversation and request ids) is forwarded with stringified values.
    entries, key_length, value_length = _METADATA_LIMITS
    pairs = [(str(k)[:key_length], str(v)[:value_length]) for k, v in metadata.items() if v is not None]
    return dict(pairs[:entries])
