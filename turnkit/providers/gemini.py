"""A Gemini model client on the Gemini API's ``generateContent``, through the official ``google-genai`` SDK.

Assistant messages that came from this API are replayed as their raw candidate parts (``kind: "gemini"``), so
thought signatures go back unchanged, as Gemini requires while a tool loop continues. Tool and output schemas are
converted to the OpenAPI subset Gemini accepts (:func:`gemini_schema`).
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import re
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Final

import httpx
from google.genai import errors as genai_errors
from google.genai import types
from google.genai.client import Client as GenaiClient

from turnkit.kernel.errors import ConfigError, ModelAccessError, ModelError
from turnkit.media_requests import PaintRequest
from turnkit.model import ModelRequest, Result, ToolCall, ToolSpec, Usage
from turnkit.providers._common import (
    ProviderClient,
    SdkErrors,
    build_result,
    join_instructions,
    replay_data,
    resolve_model,
    retry_after,
    retryable_status,
    sdk_error,
)

__all__ = ["KEY_VARIABLES", "PROVIDER_KIND", "GeminiClient", "gemini_schema"]

#: The ``kind`` of the provider part that holds a candidate's raw parts.
PROVIDER_KIND: Final = "gemini"

#: The environment variables an API key is read from, in order.
KEY_VARIABLES: Final = ("GEMINI_API_KEY", "GOOGLE_API_KEY")

# A thinking option with only an effort still needs a budget (Gemini 2.5 Flash accepts 0-24576 thinking tokens).
_EFFORT_BUDGETS: Final = {"minimal": 512, "low": 1024, "medium": 8192, "high": 24576}

# The effort names Gemini 3's thinking_level takes.
_LEVELS: Final = frozenset({"MINIMAL", "LOW", "MEDIUM", "HIGH"})

# The keywords of Gemini's OpenAPI schema subset (types.Schema) that TurnKit passes on; anything else a JSON schema
# may hold ($schema, additionalProperties, oneOf, const, examples, ...) is converted or dropped by gemini_schema.
_KEPT: Final = frozenset(
    {
        "description",
        "format",
        "title",
        "nullable",
        "default",
        "example",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "minProperties",
        "maxProperties",
        "minimum",
        "maximum",
        "pattern",
        "propertyOrdering",
    }
)
# A recursive $ref is cut off at this depth (Gemini schemas cannot refer to themselves).
_MAX_DEPTH: Final = 12


class GeminiClient(ProviderClient[GenaiClient, types.GenerateContentResponse]):
    """A :class:`turnkit.Client` for Gemini models (``client.aio.models.generate_content``).

    Example::

        agent = turnkit.Agent("helper", model="gemini-2.5-flash", client=GeminiClient())

    Provider failures raise :class:`~turnkit.kernel.errors.ModelError` (the turn fails), or
    :class:`~turnkit.kernel.errors.TransientModelError` for rate limits, 5xx answers and connection problems (the model
    activity retries them, after the provider's ``retry-after`` header or its ``RetryInfo`` delay). A missing API key
    or model raises :class:`~turnkit.kernel.errors.ModelAccessError`. ``chat`` makes one ``generateContent`` call and
    returns text, thinking (thought summaries) and tool-call parts, plus the candidate's raw parts as a provider part.
    ``paint`` generates images with an image model (``response_modalities=["IMAGE"]``). ``validate`` looks the model
    up (``models.get``).
    """

    errors = SdkErrors(connection=httpx.TransportError, status=genai_errors.APIError, base=genai_errors.APIError)
    provider = "gemini"

    def __init__(
        self,
        model: str | None = None,
        *,
        client: GenaiClient | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        api_version: str | None = None,
        timeout: float | None = None,
        include_thoughts: bool = True,
        request_options: Mapping[str, Any] | None = None,
    ) -> None:
        """Create the client. Nothing is checked or connected until the first call.

        Args:
            model: Pin this client to one model; None uses each request's model (the agent's ``model``, else
                ``settings.default_model``). A ``gemini/`` prefix is dropped.
            client: A ready ``google.genai.Client`` (e.g. for Vertex AI), used as it is, with its own retry options;
                when given, ``api_key``, ``base_url``, ``api_version`` and ``timeout`` are ignored.
            api_key: The API key; defaults to ``GEMINI_API_KEY``, else ``GOOGLE_API_KEY``.
            base_url: The API base URL; defaults to the SDK's (``https://generativelanguage.googleapis.com``).
            api_version: The API version; defaults to the SDK's (``v1beta``).
            timeout: Seconds per HTTP request; defaults to the SDK's.
            include_thoughts: Ask for thought summaries (they become ``thinking`` parts) when a turn has a thinking
                option.
            request_options: Extra ``GenerateContentConfig`` fields (e.g. ``temperature``, ``safety_settings``);
                fields derived from the request take precedence.
        """
        super().__init__(_model_name(model) if model else None, client, request_options)
        self.include_thoughts = include_thoughts
        self._api_key = api_key
        self._base_url = base_url
        self._api_version = api_version
        self._timeout = timeout

    def _key(self) -> str | None:
        return self._api_key or next((os.environ[name] for name in KEY_VARIABLES if os.environ.get(name)), None)

    def _new_sdk(self) -> GenaiClient:
        api_key = self._key()
        if not api_key:
            raise ModelAccessError(f"{KEY_VARIABLES[0]} is not set")
        # attempts=1: the SDK makes one HTTP call; the model activity's retry policy decides (issue 11).
        options = types.HttpOptions(
            base_url=self._base_url,
            api_version=self._api_version,
            timeout=None if self._timeout is None else int(self._timeout * 1000),
            retry_options=types.HttpRetryOptions(attempts=1),
        )
        return GenaiClient(api_key=api_key, vertexai=False, http_options=options)

    async def close(self) -> None:
        """Close the SDK client's async connections."""
        if self._client is not None:
            await self._client.aio.aclose()

    def _missing_key(self) -> str | None:
        return None if self._key() else " or ".join(KEY_VARIABLES)

    def _api_model(self, model: str) -> str:
        return _model_name(model)

    def _errors(self) -> AbstractAsyncContextManager[None]:
        return gemini_errors()

    async def _send(self, sdk: GenaiClient, params: dict[str, Any]) -> types.GenerateContentResponse:
        return await sdk.aio.models.generate_content(**params)

    async def _lookup(self, sdk: GenaiClient, model: str) -> None:
        await sdk.aio.models.get(model=model)

    def request_params(self, request: ModelRequest, model: str) -> dict[str, Any]:
        """The ``models.generate_content`` arguments for a request (exposed for inspection and tests)."""
        config: dict[str, Any] = dict(self.request_options)
        instructions = join_instructions(request.instructions, request.dynamic_instructions)
        if instructions:
            config["system_instruction"] = instructions
        if request.tools:
            config["tools"] = [{"function_declarations": [function_declaration(spec) for spec in request.tools]}]
        if request.thinking:
            config["thinking_config"] = {
                **thinking_config(request.thinking, model),
                "include_thoughts": self.include_thoughts,
            }
        if request.output_schema is not None:
            config["response_mime_type"] = "application/json"
            config["response_schema"] = gemini_schema(request.output_schema)
        params: dict[str, Any] = {"model": model, "contents": contents(request.messages)}
        if config:
            params["config"] = config
        return params

    def _result(self, answer: types.GenerateContentResponse, request: ModelRequest, model: str) -> Result:
        data = answer.model_dump(mode="json", exclude_none=True)
        return result_from_response(data, model=model, structured=request.output_schema is not None)

    async def paint(self, request: PaintRequest) -> Result:
        """Generate an image with a Gemini image model (behaviour §3.6): ``generateContent`` with
        ``response_modalities=["IMAGE"]``; the reference ``input_images`` go in with the prompt.

        Returns:
            One ``image`` part (base64 ``data``) per image in the answer, and the call's usage.

        Raises:
            ConfigError: A ``mask`` was given (Gemini edits from the prompt and the reference images).
            ModelError: The answer has no candidate (see :meth:`chat` for the other errors).
        """
        if request.mask:
            raise ConfigError("GeminiClient.paint takes no mask: describe the edit in the prompt")
        model = _model_name(resolve_model(None, request.model))
        parts: list[dict[str, Any]] = [{"text": request.prompt}]
        parts += [_inline(ref) for ref in request.input_images]
        config: dict[str, Any] = {**request.params, "response_modalities": ["IMAGE"]}
        if request.size and "image_config" not in config:
            config["image_config"] = {"aspect_ratio": request.size}
        sdk = self.sdk
        async with gemini_errors():
            answer = await self._send(
                sdk, {"model": model, "contents": [{"role": "user", "parts": parts}], "config": config}
            )
        return image_result(answer.model_dump(mode="json", exclude_none=True), model=model)


def _model_name(model: str) -> str:
    """The model as the API names it: ``gemini/`` (a router's prefix) and ``models/`` are not part of it."""
    return model.removeprefix("gemini/").removeprefix("models/")


def _transport_errors() -> tuple[type[Exception], ...]:
    """What the SDK raises when no answer came: httpx's transport errors, or aiohttp's, which the SDK uses for its
    async calls when aiohttp is installed."""
    found: list[type[Exception]] = [httpx.TransportError, TimeoutError]
    try:
        aiohttp = importlib.import_module("aiohttp")  # optional: not a dependency of TurnKit
    except ImportError:
        pass
    else:
        found.append(aiohttp.ClientError)
    return tuple(found)


_NO_ANSWER: Final = _transport_errors()


@asynccontextmanager
async def gemini_errors() -> AsyncGenerator[None]:
    """Translate the SDK's exceptions into TurnKit's, by the rule of the other providers (``_common``).

    Raises:
        TransientModelError: No answer (a transport error), or 408/409/429/5xx, with the delay the provider asked
            for: a ``retry-after`` header, else the ``RetryInfo`` delay in the error body.
        ModelError: Any other answer (bad request, key, permission, unknown model), or an argument the SDK refused.
    """
    try:
        yield
    except _NO_ANSWER as err:
        raise sdk_error(err, retryable=True) from err
    except genai_errors.APIError as err:
        headers = _headers(err)
        retryable = retryable_status(int(err.code or 0), headers)
        delay = (retry_after(headers) or _retry_info(err.details)) if retryable else None
        raise sdk_error(err, retryable=retryable, retry_after=delay) from err
    except (ValueError, TypeError) as err:  # the SDK's own checks (pydantic) of what it was given
        raise sdk_error(err, retryable=False) from err


def _headers(err: genai_errors.APIError) -> Mapping[str, str]:
    response: Any = err.response
    headers: Any = getattr(response, "headers", None)
    if headers is None:
        return {}
    return {str(key).lower(): str(value) for key, value in headers.items()}


def _retry_info(details: Any) -> float | None:
    """The ``google.rpc.RetryInfo`` delay of an error body (``"retryDelay": "37s"``), which Gemini sends on 429."""
    error: Any = details.get("error", details) if isinstance(details, dict) else {}
    for detail in error.get("details") or () if isinstance(error, dict) else ():
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("RetryInfo"):
            match = re.fullmatch(r"([0-9.]+)s", str(detail.get("retryDelay", "")))
            if match:
                return float(match.group(1))
    return None


def contents(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Projected messages (behaviour §3.5) as Gemini ``contents``.

    Assistant messages with a ``gemini`` provider part are replayed as those raw parts (thought signatures intact);
    others become a text part plus ``function_call`` parts. Tool results become ``function_response`` parts (named
    after the call they answer) in a user content. Consecutive contents of one role are merged, so the results of one
    assistant message's calls go back together.
    """
    merged: list[dict[str, Any]] = []
    calls: dict[str, tuple[str, str | None]] = {}  # TurnKit call id → (name, the provider's own id or None)
    for message in messages:
        role = message.get("role")
        text = str(message.get("content") or "")
        parts: list[dict[str, Any]]
        if role == "tool":
            role = "user"
            call_id = str(message.get("tool_call_id") or "")
            name, provider_id = calls.get(call_id, ("", call_id or None))
            response: dict[str, Any] = {"name": name, "response": _tool_output(text)}
            if provider_id:
                response["id"] = provider_id
            parts = [{"function_response": response}]
        elif role == "assistant":
            role = "model"
            tool_calls = list(message.get("tool_calls") or ())
            replay = replay_data(message, PROVIDER_KIND)
            if replay is not None:
                parts = [_part(raw) for raw in replay]
                raw_ids = [raw.get("function_call", {}).get("id") for raw in replay if "function_call" in raw]
            else:
                parts = [{"text": text}] if text else []
                parts += [
                    {
                        "function_call": {
                            "id": str(c.get("id") or ""),
                            "name": str(c.get("name") or ""),
                            "args": dict(c.get("arguments") or {}),
                        }
                    }
                    for c in tool_calls
                ]
                raw_ids = [str(c.get("id") or "") for c in tool_calls]
            # Positional: TurnKit may have renamed a call id to keep it unique in the turn; Gemini wants its own.
            for index, call in enumerate(tool_calls):
                own = raw_ids[index] if index < len(raw_ids) else None
                calls[str(call.get("id") or "")] = (str(call.get("name") or ""), own or None)
        else:
            role = "user"
            parts = [_inline(ref) for ref in message.get("media") or ()]
            parts += [{"text": text}] if text else []
        if not parts:
            continue
        if merged and merged[-1]["role"] == role:
            merged[-1]["parts"].extend(parts)
        else:
            merged.append({"role": role, "parts": parts})
    return merged


def _part(raw: Any) -> Any:
    """A replayed raw part (JSON, bytes as base64) as an SDK part: JSON validation decodes the base64 bytes back."""
    if isinstance(raw, dict):
        return types.Part.model_validate_json(json.dumps(raw))
    return raw


def _tool_output(text: str) -> dict[str, Any]:
    """A tool result (a JSON string) as a ``function_response.response`` object: a JSON object as it is, anything else
    under ``output``."""
    try:
        value = json.loads(text)
    except ValueError:
        return {"output": text}
    return value if isinstance(value, dict) else {"output": value}  # pyright: ignore[reportUnknownVariableType]


def _inline(ref: Mapping[str, Any]) -> dict[str, Any]:
    """A media reference with base64 ``data`` as an ``inline_data`` part (images, documents, audio, video)."""
    data = ref.get("data")
    if not data:
        raise ConfigError(f"media {ref.get('media_id')} has no data: only the model activity can send it")
    return {"inline_data": {"mime_type": str(ref.get("mime_type") or ""), "data": base64.b64decode(str(data))}}


def function_declaration(spec: ToolSpec) -> dict[str, Any]:
    """A TurnKit tool as a Gemini function declaration (its schema in Gemini's subset, :func:`gemini_schema`)."""
    declaration: dict[str, Any] = {"name": spec.name}
    if spec.description:
        declaration["description"] = spec.description
    if spec.parameters.get("properties"):
        declaration["parameters"] = gemini_schema(spec.parameters)
    return declaration


def gemini_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON schema converted to the OpenAPI subset Gemini's ``Schema`` accepts.

    ``$ref`` is inlined from ``$defs`` / ``definitions``; ``type: [T, "null"]`` becomes ``type: T`` with
    ``nullable``; ``const`` becomes a one-value ``enum``; ``oneOf`` becomes ``anyOf`` and ``allOf`` is merged;
    ``exclusiveMinimum`` / ``exclusiveMaximum`` become ``minimum`` / ``maximum``; enums become strings. What Gemini
    rejects and cannot be converted is dropped: ``additionalProperties`` (the Gemini API refuses it),
    ``$schema``, ``$id``, ``examples``, ``not``, ``if``/``then``/``else``, ``patternProperties``, ``uniqueItems``...
    """
    defs: dict[str, Any] = {**dict(schema.get("definitions") or {}), **dict(schema.get("$defs") or {})}
    return _convert(schema, defs, 0)


def _convert(schema: Mapping[str, Any], defs: Mapping[str, Any], depth: int) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = defs.get(ref.rsplit("/", 1)[-1])
        if not isinstance(target, Mapping) or depth >= _MAX_DEPTH:
            return {"type": "object", "description": str(schema.get("description") or "")} if depth else {}
        merged = {**dict(target), **{k: v for k, v in schema.items() if k != "$ref"}}  # pyright: ignore[reportUnknownArgumentType]
        return _convert(merged, defs, depth + 1)
    out: dict[str, Any] = {key: value for key, value in schema.items() if key in _KEPT}
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(schema.get(exclusive), int | float) and bound not in out:
            out[bound] = schema[exclusive]
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [str(k) for k in kind if k != "null"]  # pyright: ignore[reportUnknownVariableType]
        if len(kinds) < len(kind):  # pyright: ignore[reportUnknownArgumentType]
            out["nullable"] = True
        if len(kinds) == 1:
            kind = kinds[0]
        elif kinds:
            out["anyOf"] = [{"type": k} for k in kinds]
            kind = None
        else:
            kind = None
    if kind == "null":
        out["nullable"] = True
    elif isinstance(kind, str):
        out["type"] = kind
    if "const" in schema and "enum" not in schema:
        out["enum"] = [str(schema["const"])]
    elif isinstance(schema.get("enum"), list):
        out["enum"] = [str(value) for value in schema["enum"] if value is not None]  # pyright: ignore[reportUnknownVariableType]
        if None in schema["enum"]:
            out["nullable"] = True
    if "enum" in out and out.get("type") != "string":
        # Gemini's enums are strings (the values were made strings above) and need their type.
        if out.get("type") is not None:
            out["format"] = "enum"
        out["type"] = "string"
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        out["properties"] = {
            str(k): _convert(v, defs, depth + 1) for k, v in properties.items() if isinstance(v, Mapping)
        }  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]
        required = [str(r) for r in schema.get("required") or () if r in out["properties"]]  # pyright: ignore[reportUnknownVariableType]
        if required:
            out["required"] = required
        out.setdefault("type", "object")
    items = schema.get("items")
    if isinstance(items, Mapping):
        out["items"] = _convert(items, defs, depth + 1)  # pyright: ignore[reportUnknownArgumentType]
    alternatives = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(alternatives, list):
        options = [_convert(a, defs, depth + 1) for a in alternatives if isinstance(a, Mapping)]  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
        if any(option == {"nullable": True} for option in options):
            out["nullable"] = True
        options = [option for option in options if option != {"nullable": True}]
        if len(options) == 1:
            out = {**options[0], **out}
        elif options:
            out["anyOf"] = options
    for part in schema.get("allOf") or ():
        if isinstance(part, Mapping):
            out = {**_convert(part, defs, depth + 1), **out}  # pyright: ignore[reportUnknownArgumentType]
    return out


def thinking_config(thinking: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The ``thinking_config`` for a thinking option ``{effort?, budget?}``: a budget as ``thinking_budget``; an effort
    alone as ``thinking_level`` on Gemini 3 models (which take levels), else as a budget sized to it."""
    level = str(thinking.get("effort") or "").upper()
    if thinking.get("budget") is None and model.startswith("gemini-3") and level in _LEVELS:
        return {"thinking_level": level}
    return {"thinking_budget": thinking_budget(thinking)}


def thinking_budget(thinking: Mapping[str, Any]) -> int:
    """The ``thinking_budget`` for a thinking option ``{effort?, budget?}``: the budget, else one sized to the effort
    (an unknown effort gets the ``medium`` budget)."""
    budget = thinking.get("budget")
    if budget is not None:
        return int(budget)
    return _EFFORT_BUDGETS.get(str(thinking.get("effort") or "medium"), _EFFORT_BUDGETS["medium"])


def result_from_response(response: Mapping[str, Any], *, model: str, structured: bool) -> Result:
    """A :class:`Result` from a ``GenerateContentResponse`` (JSON, as the SDK dumps it: snake_case keys).

    Parts, in order (behaviour §3.6): text, thinking (parts marked ``thought``) and unknown parts as they come; then
    the candidate's raw parts in one ``gemini`` provider part; then the ``tool_call`` parts. A call without an id
    gets ``call_<n>`` (Gemini often sends none).

    Raises:
        ModelError: No candidate (the prompt was blocked).
    """
    candidates = response.get("candidates") or []
    if not candidates:
        feedback = response.get("prompt_feedback") or {}
        reason = feedback.get("block_reason") or "no candidates"
        raise ModelError(f"Gemini returned no candidate: {reason}")
    candidate = candidates[0]
    raw: list[dict[str, Any]] = list((candidate.get("content") or {}).get("parts") or [])
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    texts: list[str] = []
    for part in raw:
        if "function_call" in part:
            call = part["function_call"]
            call_id = str(call.get("id") or f"call_{len(calls)}")
            calls.append(ToolCall.parse(call_id, str(call.get("name") or ""), call.get("args") or {}).to_part())
        elif part.get("thought"):
            if part.get("text"):
                parts.append(
                    {
                        "type": "thinking",
                        "text": str(part["text"]),
                        "signature": part.get("thought_signature"),
                        "redacted": False,
                    }
                )
        elif part.get("text"):
            texts.append(str(part["text"]))
            parts.append({"type": "text", "text": str(part["text"])})
        else:
            kind = next((key for key in part if key != "thought_signature"), "unknown")
            parts.append({"type": "provider", "kind": kind, "data": part})
    finish = candidate.get("finish_reason")
    return build_result(
        parts,
        calls,
        texts,
        raw,
        kind=PROVIDER_KIND,
        usage=usage_from(response.get("usage_metadata") or {}),
        model=model,
        finish_reason="tool_calls" if calls else (str(finish).lower() if finish else "stop"),
        structured=structured,
    )


def usage_from(usage: Mapping[str, Any]) -> Usage:
    """Exclusive usage buckets from ``usage_metadata``.

    Gemini counts cached input inside ``prompt_token_count`` (it is subtracted) and thoughts outside
    ``candidates_token_count``; tool-use prompt tokens are input.
    """
    prompt = int(usage.get("prompt_token_count") or 0) + int(usage.get("tool_use_prompt_token_count") or 0)
    cached = int(usage.get("cached_content_token_count") or 0)
    return Usage(
        input_tokens=max(prompt - cached, 0),
        output_tokens=int(usage.get("candidates_token_count") or 0),
        cached_tokens=cached,
        thinking_tokens=int(usage.get("thoughts_token_count") or 0),
    )


def image_result(response: Mapping[str, Any], *, model: str) -> Result:
    """A ``generateContent`` answer of an image model as ``image`` parts (base64 ``data``) and usage; text that came
    with the images is kept as each image's ``revised_prompt``."""
    candidates = response.get("candidates") or []
    if not candidates:
        reason = (response.get("prompt_feedback") or {}).get("block_reason") or "no candidates"
        raise ModelError(f"Gemini returned no candidate: {reason}")
    raw = (candidates[0].get("content") or {}).get("parts") or []
    text = "".join(str(p.get("text") or "") for p in raw if not p.get("thought"))
    images: list[dict[str, Any]] = []
    for part in raw:
        inline = part.get("inline_data")
        if not inline or part.get("thought"):
            continue
        image: dict[str, Any] = {
            "type": "image",
            "mime_type": str(inline.get("mime_type") or "image/png"),
            # The SDK dumps bytes as URL-safe base64; TurnKit's image parts hold standard base64.
            "data": base64.b64encode(base64.urlsafe_b64decode(str(inline.get("data") or ""))).decode("ascii"),
            "model": model,
            "provider": "gemini",
        }
        if text:
            image["revised_prompt"] = text
        images.append(image)
    return Result(parts=images, usage=usage_from(response.get("usage_metadata") or {}), model=model)
