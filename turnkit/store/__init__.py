"""The TurnKit record store: SQLAlchemy models, migrations and the async store."""

from __future__ import annotations

from turnkit.store.store import DEFAULT_DATABASE_URL, Store, StoreTx

__all__ = ["DEFAULT_DATABASE_URL", "Store", "StoreTx"]
