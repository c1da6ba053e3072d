"""What the provider clients share: the client skeleton (SDK construction, one call, error translation), result and
usage assembly, output schemas and parsing, replay of provider parts.

Each provider module keeps only its wire format: request parameters, response parsing, its SDK's classes.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import AsyncGenerator, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from turnkit.kernel.errors import ConfigError, ModelAccessError, ModelError, TransientModelError
from turnkit.media_requests import PaintRequest, ViewMediaRequest, analysis_request, analysis_result
from turnkit.model import ModelRequest, Result, Usage
from turnkit.streaming import DeltaSink, current_sink

__all__ = [
    "ProviderClient",
    "SdkErrors",
    "TransientModelError",
    "build_result",
    "count",
    "exclusive_usage",
    "fully_required",
    "join_instructions",
    "media_inputs",
    "output_data",
    "replay_data",
    "resolve_model",
    "retry_after",
    "retryable_status",
    "sdk_error",
    "sdk_options",
    "strict_schema",
]


_SDK = TypeVar("_SDK")
_Answer = TypeVar("_Answer")


@dataclass(frozen=True)
class SdkErrors:
    """An SDK's exception classes, as :func:`translated_errors` needs them."""

    connection: type[Exception]
    """Raised when no answer came (connection refused or lost, timeout)."""
    status: type[Exception]
    """Raised for an HTTP error answer; it has ``status_code`` and ``response.headers``."""
    base: type[Exception]
    """The SDK's base exception class."""


class ProviderClient(Generic[_SDK, _Answer]):
    """The skeleton of a :class:`turnkit.Client` on an official provider SDK; subclasses supply the wire format.

    ``chat`` resolves the model, builds the SDK client on first use, makes exactly one HTTP call (the SDK's own
    retries are off by default: the model activity's retry policy decides, and a provider's ``retry-after``
    becomes its next retry delay, issue 11) and translates SDK errors into TurnKit's.
    """

    errors: ClassVar[SdkErrors]
    """The SDK's exception classes."""
    provider: ClassVar[str] = ""
    """The provider's name, as ``image`` and ``media_analysis`` parts record it."""

    def __init__(self, model: str | None, client: _SDK | None, request_options: Mapping[str, Any] | None) -> None:
        self.model = model or None
        self.request_options: dict[str, Any] = dict(request_options or {})
        self._client = client

    @property
    def sdk(self) -> _SDK:
        """The SDK client: the one given, or one built on first use from the constructor arguments and environment.

        Raises:
            ModelAccessError: No credentials.
        """
        if self._client is None:
            self._client = self._new_sdk()
        return self._client

    def _new_sdk(self) -> _SDK:
        """A new SDK client (raises :class:`ModelAccessError` without credentials)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Close the SDK client's connections, also those of an SDK client that was passed in."""
        if self._client is not None:
            await self._client.close()  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]

    async def chat(self, request: ModelRequest) -> Result:
        """Make one provider call (see the provider class for its API and its errors).

        When the call has a :func:`~turnkit.streaming.current_sink` (a turn's model call, with
        ``settings.stream_model_calls``), it is made with the provider's streaming API: the text and thinking deltas go
        to the sink as they arrive, and the result is built from the complete response the stream ends with, so it is
        the one the same call without streaming returns. A stream that ends before that response (a cut connection) is a
        :class:`TransientModelError`: the model activity retries the call. A client without a streaming path answers
        as without a sink.
        """
        model = self._api_model(resolve_model(self.model, request.model))
        sdk = self.sdk
        params = self.request_params(request, model)
        sink = current_sink()
        async with self._errors():
            answer = await self._send(sdk, params) if sink is None else await self._stream(sdk, params, sink)
        if answer is None:
            raise TransientModelError(f"{type(self).__name__}: the stream ended before the response was complete")
        return self._result(answer, request, model)

    def request_params(self, request: ModelRequest, model: str) -> dict[str, Any]:
        """The SDK call's arguments for a request (exposed for inspection and tests)."""
        raise NotImplementedError

    async def view_media(self, request: ViewMediaRequest) -> Result:
        """Analyse one media item for an objective (behaviour §3.6): one chat call with the media as input.

        Returns:
            One ``media_analysis`` part (its ``media`` without the bytes) and the call's usage.
        """
        answer = await self.chat(analysis_request(request))
        return analysis_result(answer, request, provider=self.provider)

    async def paint(self, request: PaintRequest) -> Result:
        """Generate an image (behaviour §3.6); providers without an image API raise :class:`ConfigError`."""
        raise ConfigError(f"{type(self).__name__} cannot paint: {self.provider} has no image generation API")

    async def validate(self, *, model: str) -> None:
        """Check, with one cheap call that uses no tokens, that this client can call ``model``: the API key is there
        and the provider knows the model (``turnkit worker --validate-models``, ``Agent(validate=True)``).

        Raises:
            ModelAccessError: No model; no API key (no call is made); or the provider refused the key or the model
                (any answer that is not worth retrying). The message names the model.
            TransientModelError: No answer, or a 429 / 5xx answer.
        """
        name = self._api_model(resolve_model(self.model, model))
        missing = self._missing_key() if self._client is None else None
        if missing:
            raise ModelAccessError(f"{missing} is required for {name}")
        sdk = self.sdk
        try:
            async with self._errors():
                await self._lookup(sdk, name)
        except ModelError as err:
            raise ModelAccessError(f"model {name} is not available: {err}") from err

    def _missing_key(self) -> str | None:
        """The environment variable to set when the client has no API key, else None."""
        return None

    def _api_model(self, model: str) -> str:
        """The model as the provider's API names it."""
        return model

    async def _lookup(self, sdk: _SDK, model: str) -> None:
        """The cheap call of :meth:`validate`: it raises the SDK's error when the model is not available."""
        raise NotImplementedError

    def _errors(self) -> AbstractAsyncContextManager[None]:
        """The context that translates the SDK's errors into TurnKit's."""
        return translated_errors(self.errors)

    async def _send(self, sdk: _SDK, params: dict[str, Any]) -> _Answer:
        """The one SDK call."""
        raise NotImplementedError

    async def _stream(self, sdk: _SDK, params: dict[str, Any], sink: DeltaSink) -> _Answer | None:
        """The one SDK call, streamed: deltas to ``sink``; the complete answer, or None when the stream ended
        without it. By default the call is made without streaming (a provider client that has no streaming path)."""
        return await self._send(sdk, params)

    def _result(self, answer: _Answer, request: ModelRequest, model: str) -> Result:
        """The answer as a :class:`Result` (raises :class:`ModelError` for an answer that is not usable)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        """Show the pinned model."""
        return f"{type(self).__name__}(model={self.model!r})"


@asynccontextmanager
async def translated_errors(errors: SdkErrors) -> AsyncGenerator[None]:
    """Translate the SDK exceptions raised inside into TurnKit's (the one place that decides what is retryable).

    Raises:
        TransientModelError: No answer, or an HTTP error worth retrying; it carries the provider's ``retry-after``.
        ModelError: Any other HTTP error, or anything else the SDK raises (invalid arguments, an answer it cannot
            parse): a retry would fail the same way.
        ModelAccessError: The SDK found no credentials only when sending (a ``TypeError`` naming authentication).
    """
    try:
        yield
    except errors.connection as err:
        raise sdk_error(err, retryable=True) from err
    except errors.status as err:
        status: int = err.status_code  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]
        headers: Mapping[str, str] = err.response.headers  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]
        retryable = retryable_status(status, headers)
        raise sdk_error(err, retryable=retryable, retry_after=retry_after(headers) if retryable else None) from err
    except (errors.base, TypeError, ValueError) as err:
        if isinstance(err, TypeError) and "authentication" in str(err):
            raise ModelAccessError(f"{type(err).__name__}: {err}") from err
        raise sdk_error(err, retryable=False) from err


def retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """The delay in seconds a provider asked for before the next attempt, or None when it asked for none.

    ``retry-after-ms`` (milliseconds, OpenAI and Anthropic) wins over ``retry-after`` (seconds, or an HTTP date).
    """
    try:
        millis = headers.get("retry-after-ms")
        if millis is not None and 0 <= float(millis) < _NEVER:
            return float(millis) / 1000
    except ValueError:
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):  # neither seconds nor an HTTP date: no hint
            return None
        if parsed.tzinfo is None:
            return None
        seconds = parsed.timestamp() - (time.time() if now is None else now)
        return max(seconds, 0.0)
    return seconds if 0 <= seconds < _NEVER else None


# A delay past this (or inf, nan) is not a retry hint.
_NEVER = 366 * 24 * 3600.0


def build_result(
    parts: list[dict[str, Any]],
    calls: list[dict[str, Any]],
    texts: list[str],
    raw: Sequence[dict[str, Any]],
    *,
    kind: str,
    usage: Usage,
    model: str,
    finish_reason: str | None,
    structured: bool,
) -> Result:
    """A :class:`Result` in TurnKit's part order (§3.6): the parsed parts as they came, then every raw item in one
    provider part of ``kind`` (replayed on the next call), then the ``tool_call`` parts."""
    if raw:
        parts = [*parts, {"type": "provider", "kind": kind, "data": list(raw)}]
    return Result.build(
        parts=[*parts, *calls],
        usage=usage,
        model=model,
        finish_reason=finish_reason,
        output_data=output_data("".join(texts)) if structured else None,
    )


def exclusive_usage(
    *, input_tokens: int, output_tokens: int, cached: int, cache_write: int, thinking: int, cache_in_input: bool
) -> Usage:
    """Exclusive usage buckets (no token counted twice) from a provider's counts.

    Thinking is always inside the provider's ``output_tokens`` and is subtracted; cache reads and writes are inside
    ``input_tokens`` only when ``cache_in_input`` (OpenAI), not for Anthropic.
    """
    if cache_in_input:
        input_tokens -= cached + cache_write
    return Usage(
        input_tokens=max(input_tokens, 0),
        output_tokens=max(output_tokens - thinking, 0),
        cached_tokens=cached,
        cache_write_tokens=cache_write,
        thinking_tokens=thinking,
    )


def count(usage: Mapping[str, Any], key: str, detail: str | None = None) -> int:
    """A token count of a provider's JSON ``usage`` (``usage[key]``, or ``usage[key][detail]``), 0 when absent."""
    value: Any = usage.get(key)
    if detail is not None:
        value = (value or {}).get(detail)
    return int(value or 0)


def sdk_options(**options: Any) -> dict[str, Any]:
    """The SDK client's keyword arguments that were given (None means "the SDK's default")."""
    return {key: value for key, value in options.items() if value is not None}


def sdk_error(err: Exception, *, retryable: bool, retry_after: float | None = None) -> Exception:
    """The TurnKit exception for an SDK error.

    Args:
        err: The SDK's exception.
        retryable: Whether a later attempt may succeed.
        retry_after: Seconds the provider asked to wait before the next attempt (retryable errors only).

    Returns:
        A :class:`TransientModelError` when ``retryable``, else a :class:`~turnkit.kernel.errors.ModelError`; both with
        the message ``"<SDK class>: <message>"``.
    """
    message = f"{type(err).__name__}: {err}"
    return TransientModelError(message, retry_after=retry_after) if retryable else ModelError(message)


def retryable_status(status: int, headers: Mapping[str, str]) -> bool:
    """Whether an HTTP error status is worth retrying, by the rule both official SDKs use for their own retries.

    The provider's ``x-should-retry`` header wins; otherwise 408, 409, 429 and every 5xx are retryable, and other
    4xx answers (bad request, authentication, permission, not found) are not.
    """
    advice = headers.get("x-should-retry")
    if advice in ("true", "false"):
        return advice == "true"
    return status in (408, 409, 429) or status >= 500


def resolve_model(pinned: str | None, requested: str) -> str:
    """The model to call: the client's own model when it has one, else the request's.

    Raises:
        ModelAccessError: Neither names a model.
    """
    model = (pinned or requested or "").strip()
    if not model:
        raise ModelAccessError("model is required")
    return model


def join_instructions(stable: str, dynamic: str | None) -> str:
    """The whole system prompt: the stable part, a blank line, then the dynamic part (either may be empty)."""
    return "\n\n".join(part for part in (stable, dynamic or "") if part)


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a JSON schema with ``additionalProperties: false`` on every object schema that does not set it.

    Structured-output modes of the providers reject (or loosely enforce) objects that allow extra keys, so TurnKit
    closes them unless the application decided otherwise (behaviour §3.6). Nested schemas are handled: properties,
    items, combinators and definitions.
    """
    return _close(dict(schema))


def _close(schema: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {key: _close_any(value, key) for key, value in schema.items()}
    kind = result.get("type")
    is_object = kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in result
    if is_object and "additionalProperties" not in result:
        result["additionalProperties"] = False
    return result


# Keywords whose value is a schema, a list of schemas, or a name → schema mapping.
_SCHEMA_KEYS = frozenset({"items", "additionalProperties", "not", "contains", "if", "then", "else"})
_SCHEMA_LIST_KEYS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_SCHEMA_MAP_KEYS = frozenset({"properties", "$defs", "definitions", "patternProperties"})


def _close_any(value: Any, key: str) -> Any:
    if key in _SCHEMA_KEYS and isinstance(value, dict):
        return _close(dict(value))  # pyright: ignore[reportUnknownArgumentType]
    if key in _SCHEMA_LIST_KEYS and isinstance(value, list):
        return [_close(dict(v)) if isinstance(v, dict) else v for v in value]  # pyright: ignore[reportUnknownArgumentType]
    if key in _SCHEMA_MAP_KEYS and isinstance(value, dict):
        return {k: _close(dict(v)) if isinstance(v, dict) else v for k, v in value.items()}  # pyright: ignore[reportUnknownArgumentType]
    return value


def fully_required(schema: Mapping[str, Any]) -> bool:
    """Whether every object in a schema requires all of its properties and forbids others.

    That is the shape OpenAI's strict structured-output mode accepts; a schema with optional properties is sent
    non-strict instead of being rejected.
    """
    properties = schema.get("properties")
    if isinstance(properties, dict) and (
        schema.get("additionalProperties") is not False or set(schema.get("required") or ()) != set(properties)  # pyright: ignore[reportUnknownArgumentType]
    ):
        return False
    return all(fully_required(child) for child in _children(schema))


def _children(schema: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    children: list[Mapping[str, Any]] = []
    for key, value in schema.items():
        if key in _SCHEMA_KEYS and isinstance(value, dict):
            children.append(value)  # pyright: ignore[reportUnknownArgumentType]
        elif key in _SCHEMA_LIST_KEYS and isinstance(value, list):
            children.extend(v for v in value if isinstance(v, dict))  # pyright: ignore[reportUnknownArgumentType]
        elif key in _SCHEMA_MAP_KEYS and isinstance(value, dict):
            children.extend(v for v in value.values() if isinstance(v, dict))  # pyright: ignore[reportUnknownArgumentType]
    return children


def output_data(text: str) -> Any:
    """Structured output from the answer's text: the parsed JSON, or None when the text is not JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def replay_data(message: Mapping[str, Any], kind: str) -> list[Any] | None:
    """The raw provider items to send back for a projected assistant message, or None when it has none of ``kind``.

    Only provider parts of the current provider's kind count: another provider's reasoning, signatures or blocks
    are never sent, and nothing is fabricated in their place (behaviour §3.6).
    """
    items: list[Any] = []
    found = False
    for part in message.get("provider_parts") or ():
        if not isinstance(part, Mapping) or part.get("kind") != kind:
            continue
        found = True
        data: Any = part.get("data")
        if isinstance(data, list):
            items.extend(data)  # pyright: ignore[reportUnknownArgumentType]
        elif data is not None:
            items.append(data)
    return items if found else None


@dataclass(frozen=True)
class MediaInputPart:
    """One media item of a projected message, with its bytes (base64), ready for a provider's wire format."""

    kind: str
    """``image`` or ``document``."""
    mime_type: str
    data: str
    """The bytes, base64-encoded."""
    filename: str | None


def media_inputs(
    message: Mapping[str, Any],
    provider: str,
    *,
    kinds: Collection[str] = ("image", "document"),
    instead: str = "",
) -> list[MediaInputPart]:
    """The media of a projected user message (``message["media"]``, completed with ``data`` by the model activity).

    Args:
        message: The projected message.
        provider: Names the API in the refusal.
        kinds: The media kinds the API takes (``image``, ``document``, ``audio``, ``video``).
        instead: Appended to the refusal: where such media can go instead.

    Raises:
        ConfigError: An item has no bytes (a request built without them, such as a preview), or is of a kind
            ``provider`` does not take as input (the message names its type).
    """
    parts: list[MediaInputPart] = []
    for ref in message.get("media") or ():
        mime_type = str(ref.get("mime_type") or "")
        kind = str(ref.get("kind") or "")
        if kind not in kinds:
            raise ConfigError(f"{provider} does not accept {mime_type or kind} media as input{instead}")
        data = ref.get("data")
        if not data:
            raise ConfigError(f"media {ref.get('media_id')} has no data: only the model activity can send it")
        parts.append(MediaInputPart(kind=kind, mime_type=mime_type, data=str(data), filename=ref.get("filename")))
    return parts
