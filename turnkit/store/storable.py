"""Making values storable: what the store writes is what every backend can hold (issue 8 items 1, 11).

Values that did not come from the application (model output, tool results) are made to fit the store instead of
failing a paid turn: NUL and lone surrogates become U+FFFD, NaN and infinities become ``null`` (what JSON itself does
with them), anything else non-JSON becomes its ``str``. The result is the same on SQLite and PostgreSQL. A structure
that cannot be serialised at all (a circular one) raises :class:`UnstorableValue`.
"""

from __future__ import annotations

import json
import re
from operator import itemgetter
from typing import Any, Final

from turnkit.kernel.errors import StoreError

__all__ = [
    "REPLACEMENT",
    "UNSTORABLE_CHARS",
    "UnstorableValue",
    "json_text",
    "storable",
    "storable_text",
    "stored_json",
    "written_json",
]

#: What replaces a character the store cannot hold (NUL, a lone surrogate).
REPLACEMENT: Final = "\ufffd"

#: NUL (PostgreSQL text and jsonb reject it) and surrogate code points (not encodable as UTF-8; a valid pair is one
#: code point in a Python str, so any surrogate left in a str is a lone one).
UNSTORABLE_CHARS: Final = re.compile("[\x00\ud800-\udfff]")


class UnstorableValue(StoreError, ValueError):
    """A value cannot be stored at all (a circular structure): retrying cannot help."""

    qualified_name = "TurnKit::StoreError"


def storable_text(value: str) -> str:
    """``value`` with NUL and lone surrogates replaced by U+FFFD (the store rejects them on PostgreSQL)."""
    return UNSTORABLE_CHARS.sub(REPLACEMENT, value)


def _nan_to_null(_constant: str) -> None:
    return None


# One encoder and one decoder for every call: ``json.dumps``/``json.loads`` build a new one per call when given
# options, which was a third of this function's CPU (it runs on every JSON column read and written, issue 9).
_ENCODER: Final = json.JSONEncoder(sort_keys=True, default=str)
_DECODER: Final = json.JSONDecoder(parse_constant=_nan_to_null)


#: Nodes a value may have to be copied by :func:`_plain_copy`; a larger one goes through the JSON round trip, which is
#: faster per node (C) but costs ~4-8 µs however small the value (an empty ``usage``, a message's metadata). The two
#: cost the same at ~14 nodes; a value past the budget has paid for the nodes walked (~10 µs, +9% on a 150-node one).
_WALKED: Final = 24


class _NotPlain(Exception):
    """A value :func:`_plain_copy` leaves to the JSON round trip."""


def _plain_copy(value: Any, budget: list[int]) -> Any:
    """What the JSON round trip makes of ``value`` when it holds only dicts with ``str`` keys, lists, ``str``,
    ``int``, ``bool``, ``None`` and finite floats (exact types): a copy with sorted keys, strings made storable.
    Raises :class:`_NotPlain` for anything else, or past :data:`_WALKED` nodes (a circular value too)."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _NotPlain
    kind = type(value)
    if kind is str:
        return storable_text(value) if UNSTORABLE_CHARS.search(value) else value
    if kind is int or kind is bool or value is None:
        return value
    if kind is float:
        if value - value != 0:  # NaN and infinities: the JSON path makes them null
            raise _NotPlain
        return value
    if kind is dict:
        copied: dict[str, Any] = {}
        for key in sorted(value):  # a key that is no str (or a mix that cannot sort) raises: the JSON path
            if type(key) is not str:
                raise _NotPlain
            copied[storable_text(key) if UNSTORABLE_CHARS.search(key) else key] = _plain_copy(value[key], budget)
        return copied
    if kind is list:
        return [_plain_copy(item, budget) for item in value]  # pyright: ignore[reportUnknownVariableType]
    raise _NotPlain


def storable(value: Any) -> Any:
    """A JSON copy of ``value`` that every store backend can hold, the same on SQLite and PostgreSQL.

    Keys are sorted and stringified; NaN and infinities become ``null``; NUL and lone surrogates in strings and keys
    become U+FFFD; other objects become their ``str``.

    Raises:
        UnstorableValue: ``value`` cannot be serialised at all (it is circular).
    """
    if not isinstance(value, (dict, list)) or len(value) < _WALKED:  # pyright: ignore[reportUnknownArgumentType]
        try:
            return _plain_copy(value, [_WALKED])
        except (_NotPlain, TypeError):  # TypeError: keys that cannot be sorted together
            pass
    try:
        try:
            encoded = _ENCODER.encode(value)
        except TypeError:
            # Keys of mixed types (1 and "a") cannot be sorted as they are: stringify them first (spec T76).
            encoded = json.dumps(json.loads(json.dumps(value, default=str)), sort_keys=True)
    except (ValueError, RecursionError) as err:
        raise UnstorableValue(f"value cannot be stored: {_short(err)}") from None
    loaded = _DECODER.decode(encoded)
    # json.dumps escapes NUL as \u0000 and surrogates as \udXXX: only then is a walk needed (emoji also match).
    if "\\u0000" in encoded or "\\ud" in encoded:
        return _replace_chars(loaded)
    return loaded


def _sorted_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    pairs.sort(key=itemgetter(0))  # by key only: equal keys keep their order, and the last one wins, as in json.loads
    return dict(pairs)


#: The JSON columns' decoder: keys sorted as they are decoded (PostgreSQL's jsonb gives them in its own order), NaN
#: and infinities null.
_STORED_DECODER: Final = json.JSONDecoder(parse_constant=_nan_to_null, object_pairs_hook=_sorted_object)


def stored_json(text: str) -> Any:
    """A JSON column's value, decoded once into what :func:`storable` makes of it: the store's engines decode every
    JSON column with it, so a record built from a row takes the row's values as they are, instead of walking or
    re-encoding what the driver decoded (every turn row a turn reads or writes carries its options).

    The keys are sorted as each object is built from its pairs, which the decoder does either way.
    """
    return _decoded(_STORED_DECODER, text)


#: The same without sorting: for a store whose texts keep the order they were written in.
_WRITTEN_DECODER: Final = json.JSONDecoder(parse_constant=_nan_to_null)
#: ``json.dumps`` (SQLAlchemy's serializer for a JSON column) with each object's keys sorted.
_TEXT_ENCODER: Final = json.JSONEncoder(sort_keys=True)


def json_text(value: Any) -> str:
    """The text a JSON column of a text store (SQLite) holds for ``value``: ``json.dumps``'s, each object's keys
    sorted, so that :func:`written_json` reads back the canonical form. A record's values come sorted already
    (:func:`storable`); the values the store builds itself (a root's executions counted by tool name) need not."""
    return _TEXT_ENCODER.encode(value)


def written_json(text: str) -> Any:
    """:func:`stored_json` for a JSON column whose text keeps its keys in the order the store wrote them (SQLite's
    JSON is text, written by :func:`json_text`, keys sorted): the same value, without sorting each object's keys
    again.

    Building each object from a list of its pairs, to sort them, makes the decoder call back into Python for every
    object; here the decoder builds the dicts itself.
    """
    return _decoded(_WRITTEN_DECODER, text)


def _decoded(decoder: json.JSONDecoder, text: str) -> Any:
    """``text`` decoded, NUL and lone surrogates replaced as :func:`storable` replaces them."""
    value = decoder.decode(text)
    # The text has NUL escaped as \u0000 and a surrogate as \udXXX (an emoji's pair too): only then is a walk needed.
    if "\\u0000" in text or "\\ud" in text:
        return _replace_chars(value)
    return value


def _replace_chars(value: Any) -> Any:
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable_text(k): _replace_chars(v) for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    if isinstance(value, list):
        return [_replace_chars(v) for v in value]  # pyright: ignore[reportUnknownVariableType]
    return value


def _short(err: BaseException) -> str:
    text = str(err)
    if "ircular" in text:
        return "it is circular (it contains itself)"
    if isinstance(err, RecursionError):
        return "it is nested too deeply"
    return text[:200]
