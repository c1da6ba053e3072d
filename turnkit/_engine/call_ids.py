"""Tool-call ids unique per turn (issue 8 item 8), while the provider gets back the ids it issued.

The store keys a tool execution by ``(turn_id, tool_call_id)``, so two calls of one turn sharing an id would share
one execution: the second would silently get the first one's result and its tool would never run. Some models and
OpenAI-compatible servers number calls per response (``call_0`` every time), and some send no id at all. On ingest
each such call gets a TurnKit id unique in its turn; the provider's own id is kept on the part as ``provider_id``
and is what the provider sees again when the history is replayed to it (:func:`provider_call_ids`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["provider_call_ids", "unique_call_ids"]


def unique_call_ids(parts: list[dict[str, Any]], taken: Iterable[str], *, start: int = 1) -> list[dict[str, Any]]:
    """``parts`` with every ``tool_call`` id unique among ``taken`` (the turn's ids so far) and each other.

    A call whose id is new keeps it unchanged; a repeated or empty one gets ``<id or "call">_<n>`` (letters, digits,
    ``_`` and ``-`` only, as providers require), the first ``n >= start`` not taken, and its original id as
    ``provider_id``.
    """
    used = {str(i) for i in taken}
    renamed: list[dict[str, Any]] = []
    for part in parts:
        if part.get("type") != "tool_call":
            renamed.append(part)
            continue
        original = str(part.get("id") or "")
        call_id = original
        if not call_id or call_id in used:
            base = original or "call"
            n = start
            while f"{base}_{n}" in used:
                n += 1
            call_id = f"{base}_{n}"
            part = {**part, "id": call_id, "provider_id": original}
        used.add(call_id)
        renamed.append(part)
    return renamed


def provider_call_ids(projected: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Projected messages with the provider's ids in place of TurnKit's, for calls renamed on ingest.

    A call's result is sent with the same id as the call, so the pairing the provider sees is the one it made. A
    call that came without an id keeps TurnKit's (an empty id cannot pair a result).
    """
    mapping: dict[str, str] = {}
    replayed: list[dict[str, Any]] = []
    for message in projected:
        calls = message.get("tool_calls")
        if calls:
            renamed: list[dict[str, Any]] = []
            for call in calls:
                provider_id = call.get("provider_id")
                call = {k: v for k, v in call.items() if k != "provider_id"}
                if provider_id:
                    mapping[str(call.get("id"))] = str(provider_id)
                    call["id"] = provider_id
                renamed.append(call)
            message = {**message, "tool_calls": renamed}
        elif message.get("role") == "tool" and message.get("tool_call_id") in mapping:
            message = {**message, "tool_call_id": mapping[str(message["tool_call_id"])]}
        replayed.append(message)
    return replayed
