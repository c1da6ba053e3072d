"""Alembic migrations for the TurnKit tables."""
