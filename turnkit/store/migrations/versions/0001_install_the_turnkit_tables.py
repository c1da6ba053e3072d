"""Install the TurnKit tables (behaviour §2.10): conversations, messages, turns, tool executions, deliveries, waits.

Revision ID: 0001
Revises:
Create Date: 2026-11-29 18:43:44.917570
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('turnkit_conversations',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('uid', sa.String(length=64), nullable=False),
    sa.Column('agent_name', sa.String(length=255), nullable=False),
    sa.Column('model', sa.String(length=255), nullable=True),
    sa.Column('subject_type', sa.String(length=255), nullable=True),
    sa.Column('subject_id', sa.String(length=255), nullable=True),
    sa.Column('metadata', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_turnkit_conversations')),
    sa.UniqueConstraint('uid', name=op.f('uq_turnkit_conversations_uid'))
    )
    with op.batch_alter_table('turnkit_conversations', schema=None) as batch_op:
        batch_op.create_index('ix_turnkit_conversations_subject', ['subject_type', 'subject_id'], unique=False)

    op.create_table('turnkit_deliveries',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('uid', sa.String(length=64), nullable=False),
    sa.Column('source_conversation_uid', sa.String(length=64), nullable=False),
    sa.Column('destination_conversation_uid', sa.String(length=64), nullable=False),
    sa.Column('source_turn_uid', sa.String(length=64), nullable=True),
    sa.Column('key', sa.String(length=512), nullable=False),
    sa.Column('payload', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('message_uid', sa.String(length=64), nullable=True),
    sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_turnkit_deliveries')),
    sa.UniqueConstraint('key', name=op.f('uq_turnkit_deliveries_key')),
    sa.UniqueConstraint('uid', name=op.f('uq_turnkit_deliveries_uid'))
    )
    with op.batch_alter_table('turnkit_deliveries', schema=None) as batch_op:
        batch_op.create_index('ix_turnkit_deliveries_destination', ['destination_conversation_uid', 'delivered_at'], unique=False)
        batch_op.create_index('ix_turnkit_deliveries_source', ['source_conversation_uid', 'created_at'], unique=False)
        batch_op.create_index('turnkit_deliveries_on_pending', ['delivered_at', 'created_at'], unique=False)

    op.create_table('turnkit_messages',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('uid', sa.String(length=64), nullable=False),
    sa.Column('conversation_uid', sa.String(length=64), nullable=False),
    sa.Column('turn_uid', sa.String(length=64), nullable=True),
    sa.Column('role', sa.String(length=32), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('sequence', sa.Integer(), nullable=False),
    sa.Column('content', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('tool_execution_uid', sa.String(length=64), nullable=True),
    sa.Column('provider_message_id', sa.String(length=255), nullable=True),
    sa.Column('metadata', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_turnkit_messages')),
    sa.UniqueConstraint('uid', name=op.f('uq_turnkit_messages_uid'))
    )
    with op.batch_alter_table('turnkit_messages', schema=None) as batch_op:
        batch_op.create_index('ix_turnkit_messages_conversation_turn', ['conversation_uid', 'turn_uid'], unique=False)
        batch_op.create_index('ix_turnkit_messages_tool_execution', ['tool_execution_uid'], unique=False)
        batch_op.create_index('ix_turnkit_messages_turn', ['turn_uid'], unique=False)
        batch_op.create_index('uq_turnkit_messages_conversation_sequence', ['conversation_uid', 'sequence'], unique=True)

    op.create_table('turnkit_tool_executions',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('uid', sa.String(length=64), nullable=False),
    sa.Column('turn_uid', sa.String(length=64), nullable=False),
    sa.Column('tool_call_id', sa.String(length=255), nullable=False),
    sa.Column('tool_name', sa.String(length=255), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('arguments', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('result', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('error', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_turnkit_tool_executions')),
    sa.UniqueConstraint('uid', name=op.f('uq_turnkit_tool_executions_uid'))
    )
    with op.batch_alter_table('turnkit_tool_executions', schema=None) as batch_op:
        batch_op.create_index('ix_turnkit_tool_executions_turn_status', ['turn_uid', 'status'], unique=False)
        batch_op.create_index('uq_turnkit_tool_executions_turn_call', ['turn_uid', 'tool_call_id'], unique=True)

    op.create_table('turnkit_turns',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('uid', sa.String(length=64), nullable=False),
    sa.Column('conversation_uid', sa.String(length=64), nullable=False),
    sa.Column('agent_name', sa.String(length=255), nullable=False),
    sa.Column('parent_turn_uid', sa.String(length=64), nullable=True),
    sa.Column('parent_tool_execution_uid', sa.String(length=64), nullable=True),
    sa.Column('root_turn_uid', sa.String(length=64), nullable=False),
    sa.Column('context_message_sequence', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('model', sa.String(length=255), nullable=True),
    sa.Column('options', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('usage', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=False),
    sa.Column('cost', sa.Numeric(precision=14, scale=6), nullable=True),
    sa.Column('error', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('output_text', sa.Text(), nullable=True),
    sa.Column('output_data', sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), 'postgresql'), nullable=True),
    sa.Column('submitted_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('claim_token', sa.String(length=64), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_turnkit_turns')),
    sa.UniqueConstraint('uid', name=op.f('uq_turnkit_turns_uid'))
    )
    with op.batch_alter_table('turnkit_turns', schema=None) as batch_op:
        batch_op.create_index('index_turnkit_turns_on_maintenance', ['status', 'submitted_at', 'updated_at'], unique=False)
        batch_op.create_index('ix_turnkit_turns_conversation', ['conversation_uid'], unique=False)
        batch_op.create_index('ix_turnkit_turns_root', ['root_turn_uid'], unique=False)
        batch_op.create_index('ix_turnkit_turns_status_heartbeat', ['status', 'heartbeat_at'], unique=False)

    op.create_table('turnkit_waits',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('turn_uid', sa.String(length=64), nullable=False),
    sa.Column('target_turn_uid', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_turnkit_waits'))
    )
    with op.batch_alter_table('turnkit_waits', schema=None) as batch_op:
        batch_op.create_index('ix_turnkit_waits_target', ['target_turn_uid'], unique=False)
        batch_op.create_index('uq_turnkit_waits_turn_target', ['turn_uid', 'target_turn_uid'], unique=True)



def downgrade() -> None:
    with op.batch_alter_table('turnkit_waits', schema=None) as batch_op:
        batch_op.drop_index('uq_turnkit_waits_turn_target')
        batch_op.drop_index('ix_turnkit_waits_target')

    op.drop_table('turnkit_waits')
    with op.batch_alter_table('turnkit_turns', schema=None) as batch_op:
        batch_op.drop_index('ix_turnkit_turns_status_heartbeat')
        batch_op.drop_index('ix_turnkit_turns_root')
        batch_op.drop_index('ix_turnkit_turns_conversation')
        batch_op.drop_index('index_turnkit_turns_on_maintenance')

    op.drop_table('turnkit_turns')
    with op.batch_alter_table('turnkit_tool_executions', schema=None) as batch_op:
        batch_op.drop_index('uq_turnkit_tool_executions_turn_call')
        batch_op.drop_index('ix_turnkit_tool_executions_turn_status')

    op.drop_table('turnkit_tool_executions')
    with op.batch_alter_table('turnkit_messages', schema=None) as batch_op:
        batch_op.drop_index('uq_turnkit_messages_conversation_sequence')
        batch_op.drop_index('ix_turnkit_messages_turn')
        batch_op.drop_index('ix_turnkit_messages_tool_execution')
        batch_op.drop_index('ix_turnkit_messages_conversation_turn')

    op.drop_table('turnkit_messages')
    with op.batch_alter_table('turnkit_deliveries', schema=None) as batch_op:
        batch_op.drop_index('turnkit_deliveries_on_pending')
        batch_op.drop_index('ix_turnkit_deliveries_source')
        batch_op.drop_index('ix_turnkit_deliveries_destination')

    op.drop_table('turnkit_deliveries')
    with op.batch_alter_table('turnkit_conversations', schema=None) as batch_op:
        batch_op.drop_index('ix_turnkit_conversations_subject')

    op.drop_table('turnkit_conversations')
