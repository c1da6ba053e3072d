"""Root-tree budget counters on turns and the request id of assistant responses on messages (issue 9).

Budget checks read the root turn's running totals instead of summing the tree, and a retried model call finds its
committed response by ``(turn_uid, request_uid)`` instead of listing the turn's messages. Existing rows are
backfilled from the records they summarise (behaviour §6.3), so an upgraded database checks budgets as before.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 18:10:00
"""

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("turnkit_turns", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tree_iterations", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("tree_tool_executions", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(
            sa.Column("tree_tool_executions_by_name", _JSON, nullable=False, server_default=sa.text("'{}'"))
        )
        batch_op.add_column(sa.Column("tree_cost", sa.Numeric(14, 6), nullable=False, server_default="0"))
    with op.batch_alter_table("turnkit_messages", schema=None) as batch_op:
        batch_op.add_column(sa.Column("request_uid", sa.String(length=64), nullable=True))
        batch_op.create_index("ix_turnkit_messages_turn_request", ["turn_uid", "request_uid"], unique=False)
    _backfill()


def downgrade() -> None:
    with op.batch_alter_table("turnkit_messages", schema=None) as batch_op:
        batch_op.drop_index("ix_turnkit_messages_turn_request")
        batch_op.drop_column("request_uid")
    with op.batch_alter_table("turnkit_turns", schema=None) as batch_op:
        batch_op.drop_column("tree_cost")
        batch_op.drop_column("tree_tool_executions_by_name")
        batch_op.drop_column("tree_tool_executions")
        batch_op.drop_column("tree_iterations")


def _backfill() -> None:
    """The counters of every root from its tree's records, and ``request_uid`` of every assistant response (and
    automatic compaction summary).

    The rules are those of ``turnkit._engine.budget`` at this revision, written out here so that the migration does not
    change when that module does.
    """
    bind = op.get_bind()
    turns = sa.table(
        "turnkit_turns",
        sa.column("uid", sa.String),
        sa.column("root_turn_uid", sa.String),
        sa.column("options", _JSON),
        sa.column("cost", sa.Numeric(14, 6)),
        sa.column("tree_iterations", sa.Integer),
        sa.column("tree_tool_executions", sa.Integer),
        sa.column("tree_tool_executions_by_name", _JSON),
        sa.column("tree_cost", sa.Numeric(14, 6)),
    )
    executions = sa.table(
        "turnkit_tool_executions",
        sa.column("turn_uid", sa.String),
        sa.column("tool_name", sa.String),
        sa.column("status", sa.String),
        sa.column("error", _JSON),
    )
    messages = sa.table(
        "turnkit_messages",
        sa.column("id", sa.Integer),
        sa.column("role", sa.String),
        sa.column("kind", sa.String),
        sa.column("metadata", _JSON),
        sa.column("request_uid", sa.String),
    )
    roots: dict[str, dict[str, Any]] = {}
    root_of: dict[str, str] = {}
    rows = bind.execute(sa.select(turns.c.uid, turns.c.root_turn_uid, turns.c.options, turns.c.cost)).all()
    for uid, root, options, cost in rows:
        root_of[uid] = root
        totals = roots.setdefault(root, {"iterations": 0, "tools": 0, "by_name": {}, "cost": Decimal(0)})
        state = (options or {}).get("state") or {}
        totals["iterations"] += int(state.get("iterations", 0) or 0)
        totals["cost"] += Decimal(str(cost or 0))
    counted = bind.execute(
        sa.select(executions.c.turn_uid, executions.c.tool_name, executions.c.status, executions.c.error)
    ).all()
    for turn_uid, tool_name, status, error in counted:
        details = (error or {}).get("details") or {}
        if status == "cancelled" or (isinstance(details, dict) and details.get("budget_denied")):
            continue
        root = root_of.get(turn_uid)
        if root is None or root not in roots:
            continue
        totals = roots[root]
        totals["tools"] += 1
        totals["by_name"][tool_name] = totals["by_name"].get(tool_name, 0) + 1
    for root, totals in roots.items():
        bind.execute(
            sa.update(turns)
            .where(turns.c.uid == root)
            .values(
                tree_iterations=totals["iterations"],
                tree_tool_executions=totals["tools"],
                tree_tool_executions_by_name=totals["by_name"],
                tree_cost=totals["cost"],
            )
        )
    responses = bind.execute(
        sa.select(messages.c.id, messages.c.kind, messages.c.metadata).where(messages.c.role == "assistant")
    ).all()
    for id_, kind, metadata in responses:
        metadata = metadata or {}
        if kind == "context_summary":
            compaction = metadata.get("compaction")
            request_id = compaction.get("request_id") if isinstance(compaction, dict) else None
        else:
            request_id = metadata.get("request_id")
        if request_id:
            bind.execute(sa.update(messages).where(messages.c.id == id_).values(request_uid=str(request_id)))
