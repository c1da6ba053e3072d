"""What the provider clients share: error translation, output schemas and parsing, replay of provider parts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from turnkit.errors import ModelAccessError, ModelError, TransientModelError

__all__ = [
    "TransientModelError",
    "fully_required",
    "join_instructions",
    "output_data",
    "replay_data",
    "resolve_model",
    "retryable_status",
    "sdk_error",
    "sdk_options",
    "strict_schema",
]


def sdk_options(**options: Any) -> dict[str, Any]:
    """The SDK client's keyword arguments that were given (None means "the SDK's default")."""
    return {key: value for key, value in options.items() if value is not None}


def sdk_error(err: Exception, *, retryable: bool) -> Exception:
    """The TurnKit exception for an SDK error raised after the SDK's own retries.

    Args:
        err: The SDK's exception.
        retryable: Whether a later attempt may succeed.

    Returns:
        A :class:`TransientModelError` when ``retryable``, else a :class:`~turnkit.errors.ModelError`; both with
        the message ``"<SDK class>: <message>"``.
    """
    message = f"{type(err).__name__}: {err}"
    return TransientModelError(message) if retryable else ModelError(message)


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
    closes them unless the application decided otherwise (spec §3.6). Nested schemas are handled: properties,
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
    are never sent, and nothing is fabricated in their place (spec §3.6).
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
