"""Direct turns: ``ask`` starts a fresh conversation's first turn without the conversation's lane (issue 9).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 00:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Every existing turn was queued by its lane (or started by its parent): false.
    op.add_column("turnkit_turns", sa.Column("direct", sa.Boolean(), server_default=sa.false(), nullable=False))


def downgrade() -> None:
    op.drop_column("turnkit_turns", "direct")
