"""TurnKit identifiers (behaviour §2.1): ``<prefix>_`` followed by 24 lowercase hex characters."""

from __future__ import annotations

import secrets
from typing import Final, Literal

__all__ = ["PREFIXES", "IdKind", "new_claim_token", "new_id"]

IdKind = Literal["conversation", "message", "turn", "delivery", "tool_execution"]

PREFIXES: Final[dict[str, str]] = {
    "conversation": "conv",
    "message": "msg",
    "turn": "turn",
    "delivery": "delivery",
    "tool_execution": "tool",
}


def new_id(kind: IdKind) -> str:
    """A fresh random id for a record of ``kind`` (12 random bytes, hex-encoded)."""
    return f"{PREFIXES[kind]}_{secrets.token_hex(12)}"


def new_claim_token() -> str:
    """A claim token: 32 hex characters (behaviour §2.1)."""
    return secrets.token_hex(16)
