"""``turnkit db upgrade | current``: the store's Alembic migrations, for operators who migrate before deploying.

``upgrade`` is what :meth:`Store.open` does on every start (the same code, serialised across processes on
PostgreSQL); ``current`` reads the database's revision without changing anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from turnkit.store.migrate import alembic_config
from turnkit.store.store import Store

__all__ = ["Revisions", "current", "head_revision", "upgrade"]


@dataclass(frozen=True)
class Revisions:
    """The database's revision (None: not migrated yet) and the newest one this code knows."""

    current: str | None
    head: str

    @property
    def up_to_date(self) -> bool:
        """Whether the database is at the head revision."""
        return self.current == self.head


def head_revision() -> str:
    """The newest migration shipped with this version of TurnKit."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "TurnKit ships at least one migration"
    return head


async def current(url: str | None) -> Revisions:
    """The revisions of the store at ``url`` (default: the embedded SQLite file), read-only."""
    store = await Store.open(url, migrate=False)
    try:
        async with store.engine.connect() as conn:
            revision = await conn.run_sync(_revision)
    finally:
        await store.close()
    return Revisions(revision, head_revision())


async def upgrade(url: str | None) -> Revisions:
    """Run every pending migration on the store at ``url``; returns the revisions before and after as
    ``(before, after)`` in a :class:`Revisions` (``current``: before, ``head``: after)."""
    before = (await current(url)).current
    store = await Store.open(url, migrate=False)
    try:
        await store.migrate()
    finally:
        await store.close()
    return Revisions(before, (await current(url)).current or head_revision())


def _revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()
