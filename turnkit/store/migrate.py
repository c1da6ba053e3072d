"""Programmatic Alembic upgrades, so that ``Store.open()`` brings any database to the current schema."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection

__all__ = ["alembic_config", "upgrade_to_head"]

_MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config for TurnKit's migrations; with ``connection``, migrations run on it."""
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade_to_head(connection: Connection) -> None:
    """Run every pending migration on ``connection`` (inside the caller's transaction)."""
    command.upgrade(alembic_config(connection), "head")
