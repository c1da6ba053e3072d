"""Alembic environment: runs on the connection ``turnkit.store.migrate`` hands over, or on ``sqlalchemy.url``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from turnkit.store.schema import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=target_metadata,
        transactional_ddl=True,
        render_as_batch=True,  # SQLite can only ALTER through table copies
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:  # `alembic -x` / CLI use with a synchronous URL, e.g. for autogenerate
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "sqlite:///.turnkit/alembic.db")
    with engine.begin() as conn:
        _run(conn)
