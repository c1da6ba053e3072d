"""The TurnKit record store: SQLAlchemy models, migrations and the async store.

Applications read the record through the handles (``turn.messages()``, ``conversation.turns()``…) and ``tk.store``;
they seldom open a :class:`Store` themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from turnkit._lazy import lazy_exports

if TYPE_CHECKING:
    from turnkit.store.store import DEFAULT_DATABASE_URL, Store, StoreTx

__all__ = ["DEFAULT_DATABASE_URL", "Store", "StoreTx"]

__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(__all__, "turnkit.store.store"))
