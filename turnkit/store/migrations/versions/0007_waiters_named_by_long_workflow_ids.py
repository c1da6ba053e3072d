"""A wait's waiter named by a workflow id of up to 1,000 characters.

A team's workflow that asks an agent (``turnkit.workflow``) is the turn's waiter, named by its workflow id in
``turnkit_waits.turn_uid``; the turn's end signals it by that id. The column held 64 characters, so a workflow whose id
was longer could not ask. It now holds 1,000, Temporal's own default limit on a workflow id. On PostgreSQL a wider
``varchar`` is a change of the catalogue alone (no row is rewritten); SQLite does not enforce a ``varchar``'s length,
and its table is copied anew (batch mode) only so that its declared type matches the models.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-08 01:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("turnkit_waits") as batch:
        batch.alter_column("turn_uid", existing_type=sa.String(64), type_=sa.String(1000), existing_nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("turnkit_waits") as batch:
        batch.alter_column("turn_uid", existing_type=sa.String(1000), type_=sa.String(64), existing_nullable=False)
