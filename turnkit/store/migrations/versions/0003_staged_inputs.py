"""Staged submissions: the content of an ``ask`` lives in the store and its ``submit`` update carries an id
(issue 8 item 12).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 19:05:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "turnkit_staged_inputs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("uid", sa.String(length=64), nullable=False),
        sa.Column("conversation_uid", sa.String(length=64), nullable=False),
        sa.Column("content", _JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_turnkit_staged_inputs")),
        sa.UniqueConstraint("uid", name=op.f("uq_turnkit_staged_inputs_uid")),
    )


def downgrade() -> None:
    op.drop_table("turnkit_staged_inputs")
