"""Programmatic Alembic upgrades, so that ``Store.open()`` brings any database to the current schema.

Alembic's own INFO lines (its plugins, its context, one per migration applied) are not a worker's business at every
start: the ``alembic`` logger is set to WARNING before Alembic is imported, unless the application set its level, and
one line of TurnKit's says what changed.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy.engine import Connection

__all__ = ["alembic_config", "upgrade_to_head"]

_MIGRATIONS = Path(__file__).with_name("migrations")

logger = logging.getLogger("turnkit.store")


def _quiet_alembic() -> None:
    """Alembic logs at INFO from its import on; its level is the application's if it set one."""
    alembic_logger = logging.getLogger("alembic")
    if alembic_logger.level == logging.NOTSET:
        alembic_logger.setLevel(logging.WARNING)


_quiet_alembic()  # before anything imports Alembic through this module

from alembic import command  # noqa: E402
from alembic.config import Config  # noqa: E402
from alembic.runtime.migration import MigrationContext  # noqa: E402


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config for TurnKit's migrations; with ``connection``, migrations run on it."""
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade_to_head(connection: Connection) -> None:
    """Run every pending migration on ``connection`` (inside the caller's transaction)."""
    before = _revision(connection)
    command.upgrade(alembic_config(connection), "head")
    after = _revision(connection)
    if after != before:
        logger.info("store schema upgraded from %s to %s", before or "an empty database", after)


def _revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()
