"""Retry settings of the workflows' store activities: one definition for the lane and the turn.

Store writes are quick and idempotent, so they are safe to retry for as long as the database is away; a write the
database rejects fails at once instead (``TurnKit::StoreError`` is non-retryable, see ``activities/store_failures``).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

__all__ = ["STORE_RETRY", "STORE_TIMEOUT"]

STORE_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10))
STORE_TIMEOUT = timedelta(seconds=30)
