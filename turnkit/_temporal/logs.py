"""A worker's logs: plain text, or one JSON object per line (``turnkit worker --log-format json``,
``$TURNKIT_LOG_FORMAT``) with the turn, conversation and workflow it is about.

A JSON line has ``time`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``, then whatever is known where it was
logged: ``workflow_id``, ``run_id``, ``workflow_type``, ``activity``, ``attempt``, ``turn_id``, ``conversation_id``
(and ``exception`` with the traceback). They come from Temporal's loggers (``workflow.logger`` and
``activity.logger`` put their details in the record's ``extra``), from the running activity for any other logger
(TurnKit's own, a tool's), and from the activity's input (:class:`LogIds`: TurnKit's payloads name their turn and
conversation); else a workflow id names its turn (``turn_…``) or conversation (``conv_…``).
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from temporalio import activity, workflow
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from turnkit._temporal.worker_arguments import LOG_FORMATS
from turnkit.kernel.errors import ConfigError

__all__ = [
    "LOG_FORMATS",
    "JsonFormatter",
    "LogIds",
    "configure_logging",
    "json_logging",
    "log_ids",
    "log_line",
]

# The turn and conversation of the running activity, from its input (set by LogIds).
_ids: contextvars.ContextVar[tuple[str | None, str | None]] = contextvars.ContextVar(
    "turnkit_log_ids", default=(None, None)
)
_json = False


def configure_logging(log_format: str | None = None, level: str | None = None) -> None:
    """Set up the root logger for a worker: ``log_format`` (default ``$TURNKIT_LOG_FORMAT``, else ``text``) at
    ``level`` (default ``$TURNKIT_LOG_LEVEL``, else ``INFO``), to stderr.

    Raises:
        ConfigError: ``log_format`` is not one of :data:`LOG_FORMATS`.
    """
    global _json
    chosen = (log_format or os.environ.get("TURNKIT_LOG_FORMAT") or "text").lower()
    if chosen not in LOG_FORMATS:
        raise ConfigError(f"unknown log format {chosen!r}: choose one of {', '.join(LOG_FORMATS)} (TURNKIT_LOG_FORMAT)")
    level = level or os.environ.get("TURNKIT_LOG_LEVEL", "INFO")
    if chosen == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=level, handlers=[handler], force=True)
        # Their details go in fields of their own, not appended to the message as a dict's repr.
        activity.logger.activity_info_on_message = False
        workflow.logger.workflow_info_on_message = False
        _json = True
    else:
        logging.basicConfig(level=level)


def json_logging() -> bool:
    """Whether this process logs JSON (:func:`configure_logging` was asked for it)."""
    return _json


def log_line(message: str, logger: str = "turnkit.worker") -> str:
    """``message`` as the process prints it on stdout: itself, or one JSON line when logs are JSON."""
    if not _json:
        return message
    record = logging.LogRecord(logger, logging.INFO, "", 0, message, None, None)
    return JsonFormatter().format(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(_where(record))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)


def _where(record: logging.LogRecord) -> dict[str, Any]:
    """The ids a record is about: its Temporal details, else the running activity's, and the turn's."""
    found: dict[str, Any] = {}
    details: Mapping[str, Any] | None = getattr(record, "temporal_activity", None)
    if details is None and activity.in_activity():  # another logger (TurnKit's, a tool's) inside an activity
        info = activity.info()
        details = {
            "workflow_id": info.workflow_id,
            "workflow_run_id": info.workflow_run_id,
            "workflow_type": info.workflow_type,
            "activity_type": info.activity_type,
            "attempt": info.attempt,
        }
    if details is not None:
        found["workflow_id"] = details.get("workflow_id")
        found["run_id"] = details.get("workflow_run_id")
        found["workflow_type"] = details.get("workflow_type")
        found["activity"] = details.get("activity_type")
        found["attempt"] = details.get("attempt")
    flow: Mapping[str, Any] | None = getattr(record, "temporal_workflow", None)
    if flow is not None:
        found["workflow_id"] = flow.get("workflow_id")
        found["run_id"] = flow.get("run_id")
        found["workflow_type"] = flow.get("workflow_type")
        found["attempt"] = flow.get("attempt")
    turn_id, conversation_id = _ids.get() if details is not None else (None, None)
    workflow_id = found.get("workflow_id")
    if isinstance(workflow_id, str):
        if turn_id is None and workflow_id.startswith("turn_"):
            turn_id = workflow_id
        if conversation_id is None and workflow_id.startswith("conv_"):
            conversation_id = workflow_id
    if turn_id is not None:
        found["turn_id"] = turn_id
    if conversation_id is not None:
        found["conversation_id"] = conversation_id
    return {key: value for key, value in found.items() if value is not None}


def log_ids(turn_id: str | None, conversation_id: str | None) -> None:
    """Name the turn and conversation the running activity works for, for its JSON log lines (an activity whose input
    the interceptor cannot read: the dynamic tool activity's raw payload)."""
    _ids.set((turn_id, conversation_id))


class LogIds(Interceptor):
    """Keeps the turn and conversation an activity works for (``turn_id``, ``conversation_id`` of its input: every
    TurnKit payload names its turn) where the JSON formatter finds them. On a worker that logs JSON only."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Identified(next)


class _Identified(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        first = input.args[0] if input.args else None
        turn_id = getattr(first, "turn_id", None)
        conversation_id = getattr(first, "conversation_id", None)
        # Not reset afterwards: each activity runs in a task (and context) of its own, and the SDK's line about how
        # the attempt ended, logged after this returns, is about the same turn.
        _ids.set(
            (
                turn_id if isinstance(turn_id, str) else None,
                conversation_id if isinstance(conversation_id, str) else None,
            )
        )
        return await self.next.execute_activity(input)
