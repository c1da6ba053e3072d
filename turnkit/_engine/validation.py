"""Input rules at the API (issue 8 items 1, 12, 13): what the application may hand TurnKit.

* Validation rejects bad application input with an :class:`~turnkit.kernel.errors.InputError` naming the field,
  *before* anything is sent to Temporal or written: text (no NUL, no lone surrogates, not empty, within
  ``settings.max_input_bytes``), names (agent, model, subject, skill key: within the schema's column sizes, no control
  characters; :mod:`turnkit._engine.names`), keys, ids, and JSON values
  (metadata, context: JSON-serialisable, string keys, no NUL, no NaN). The rules are the same on SQLite and
  PostgreSQL, so an input accepted on one is accepted on the other.
* Values that did not come from the application (model output, tool results) are not rejected but made storable:
  see :mod:`turnkit.store.storable` (re-exported here).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

from turnkit._engine.names import MAX_NAME_CHARS, char_problem, check_name, short_string
from turnkit.config import settings
from turnkit.kernel.errors import InputError
from turnkit.model import Result
from turnkit.store.schema import DeliveryRow
from turnkit.store.storable import REPLACEMENT, UnstorableValue, storable, storable_text

__all__ = [
    "MAX_KEY_CHARS",
    "MAX_NAME_CHARS",
    "REPLACEMENT",
    "UnstorableValue",
    "check_id",
    "check_json",
    "check_key",
    "check_name",
    "check_size",
    "check_text",
    "storable",
    "storable_result",
    "storable_text",
]

#: Delivery and steering keys: the ``String(512)`` column of ``deliveries.key``.
MAX_KEY_CHARS: Final = int(DeliveryRow.__table__.c.key.type.length)  # pyright: ignore[reportAttributeAccessIssue, reportUnknownArgumentType, reportUnknownMemberType]


# -- validation ------------------------------------------------------------------------------------------------------


def check_size(field: str, size: int) -> None:
    """Reject ``size`` bytes of ``field`` above ``settings.max_input_bytes`` (a clear error, never an RPC error)."""
    limit = settings.max_input_bytes
    if limit is not None and size > limit:
        raise InputError(f"{field} is too large: {size} bytes (the limit is {limit} bytes, settings.max_input_bytes)")


def check_text(field: str, value: Any, *, required: bool = True) -> str:
    """A text input: a ``str``, not empty (when ``required``), storable, within the size limit.

    Raises:
        InputError: naming ``field`` and what is wrong with it.
    """
    if not isinstance(value, str):
        raise InputError(f"{field} must be a string, not {type(value).__name__}")
    if required and not value:
        raise InputError(f"{field} is required")
    problem = char_problem(value)
    if problem is not None:
        raise InputError(f"{field} {problem}")
    check_size(field, len(value.encode("utf-8")))
    return value


def check_key(field: str, value: Any) -> str:
    """A delivery or steering key: a non-empty ``str`` of at most :data:`MAX_KEY_CHARS` storable characters."""
    return short_string(field, value, MAX_KEY_CHARS)


def check_id(field: str, value: Any, kind: str) -> str:
    """A record id of ``kind`` (``turn``, ``conv``…): ``<kind>_`` followed by at least one character."""
    if not isinstance(value, str) or not value.startswith(f"{kind}_") or len(value) <= len(kind) + 1:
        raise InputError(f"{field} must be a {kind} id ({kind}_…), not {str(value)[:80]!r}")
    if len(value) > 64 or char_problem(value) is not None:
        raise InputError(f"{field} must be a {kind} id ({kind}_…), not {value[:80]!r}")
    return value


def check_json(field: str, value: Any, *, lenient: bool = False) -> Any:
    """A JSON value given by the application (metadata, context, principal).

    Strict (the default): only JSON types (dict with ``str`` keys, list/tuple, str, int, float, bool, None), no NaN
    or infinity, no NUL or lone surrogate in any string or key, not circular, within the size limit. ``lenient``
    accepts other objects (stored as their ``str``, as TurnKit's JSON normalisation of a principal does).

    Raises:
        InputError: naming ``field`` (and the path inside it) and what is wrong.
    """
    if value is None:
        return None
    _check_json_value(field, value, lenient=lenient, seen=set())
    try:
        encoded = json.dumps(value, default=str if lenient else None, allow_nan=False)
    except (TypeError, ValueError) as err:  # a safety net: _check_json_value should have said why
        raise InputError(f"{field} is not JSON-serialisable: {err}") from None
    check_size(field, len(encoded.encode("utf-8")))
    return value


def _check_json_value(path: str, value: Any, *, lenient: bool, seen: set[int]) -> None:
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InputError(f"{path} must be a finite number (NaN and infinity cannot be stored as JSON)")
        return
    if isinstance(value, str):
        problem = char_problem(value)
        if problem is not None:
            raise InputError(f"{path} {problem}")
        return
    if isinstance(value, Mapping | list | tuple):
        if id(value) in seen:
            raise InputError(f"{path} is circular (it contains itself)")
        seen.add(id(value))
        if isinstance(value, Mapping):
            for key, item in value.items():  # pyright: ignore[reportUnknownVariableType]
                if not isinstance(key, str):
                    raise InputError(f"{path} keys must be strings, not {type(key).__name__}")  # pyright: ignore[reportUnknownArgumentType]
                problem = char_problem(key)
                if problem is not None:
                    raise InputError(f"{path} key {key[:40]!r} {problem}")
                _check_json_value(f"{path}.{key}", item, lenient=lenient, seen=seen)
        else:
            for index, item in enumerate(value):  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
                _check_json_value(f"{path}[{index}]", item, lenient=lenient, seen=seen)
        seen.discard(id(value))
        return
    if not lenient:
        raise InputError(f"{path} must be JSON (a {type(value).__name__} is not)")
    _check_json_value(path, str(value), lenient=lenient, seen=seen)


def storable_result(result: Result) -> Result:
    """A model's answer with everything the store cannot hold made storable (issue 8 item 1).

    A NUL or lone surrogate in the text, thinking or tool-call arguments becomes U+FFFD and NaN becomes null, so the
    answer is persisted (the model was paid for) instead of failing the turn on the database after five calls.
    Tool-call ids and names longer than their columns are cut to :data:`MAX_NAME_CHARS`.
    """
    parts = storable(result.parts)
    for part in parts:
        if part.get("type") == "tool_call":
            # The id and name columns are String(255); a longer one from a provider would fail every write of the
            # call on PostgreSQL (and never on SQLite). Cut them to fit, the same on both.
            for key in ("id", "name"):
                if isinstance(part.get(key), str) and len(part[key]) > MAX_NAME_CHARS:
                    part[key] = part[key][:MAX_NAME_CHARS]
    output_data = None if result.output_data is None else storable(result.output_data)
    if parts == result.parts and output_data == result.output_data:
        return result
    return result.model_copy(update={"parts": parts, "output_data": output_data})
