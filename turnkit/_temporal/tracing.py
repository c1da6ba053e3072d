"""Tracing with OpenTelemetry (``pip install 'turnkit[otel]'``) on temporalio's ``OpenTelemetryPlugin``: one trace per
turn, a span as long as the turn, GenAI semantic-convention spans for its model and tool calls.

Off by default, and free when off: nothing here imports OpenTelemetry until a plugin is built with ``tracing=True``,
and the activities' :func:`model_call_span` / :func:`tool_call_span` do nothing.

On, :mod:`turnkit._temporal.turn_spans` registers the plugin's interceptor (the context travels in Temporal headers)
and TurnKit's :class:`~turnkit._temporal.turn_spans.TurnTraceInterceptor`. The spans go to the global tracer
provider, which must be replay-safe where workflows run (``temporalio.contrib.opentelemetry.create_tracer_provider``):

* ``invoke_agent {agent}``: the turn, from the start of its ``TurnWorkflow`` to its end, written once (never again
  on replay); ``gen_ai.operation.name`` ``invoke_agent``, ``gen_ai.agent.name``, ``gen_ai.conversation.id``,
  ``turnkit.turn.status``.
* ``chat {model}``: each model call, its child: ``gen_ai.operation.name`` ``chat``, ``gen_ai.request.model``,
  ``gen_ai.response.model``, ``gen_ai.provider.name`` (and the older ``gen_ai.system``), token counts,
  ``turnkit.cost.usd``.
* ``execute_tool {name}``: each tool call's activity, its child: ``gen_ai.tool.name``, ``gen_ai.tool.call.id``.
* a sub-agent's ``invoke_agent`` span is a child of its parent turn's.

All carry ``turnkit.turn_id``, ``turnkit.conversation_id`` and ``turnkit.agent``. A turn's span is a child of the
span current at its ``ask`` (the root of a trace of its own when there is none). A lane outlives many asks but
carries only the context of the call that started it, so the interceptor keeps, per submitted turn, the context of
its ``submit`` update (the ask's) and starts the turn in it: each turn is its own trace. How a turn travels:
``docs/design.md``, "``ask``: from a user's text to a running turn".
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from turnkit.kernel.errors import ConfigError, InputError

if TYPE_CHECKING:
    from temporalio.worker import Interceptor

    from turnkit.kernel.payloads import ToolCallInput
    from turnkit.kernel.records import TurnRecord
    from turnkit.model import Result

    #: What ``tracing=`` accepts.
    Tracing = bool | None

__all__ = ["add_tracing_argument", "model_call_span", "tool_call_span", "tracing_interceptors"]

# Set once a plugin with tracing is built in this process; until then the activities' hooks cost one global read.
_enabled = False


def tracing_interceptors(tracing: Tracing) -> list[Interceptor]:
    """The interceptors that trace TurnKit with OpenTelemetry (empty when ``tracing`` is off).

    Args:
        tracing: False or None: off. True: traced, into the global tracer provider (as ``OpenTelemetryPlugin``).

    Raises:
        InputError: ``tracing`` is not a bool (a tracer provider is set globally instead).
        ConfigError: OpenTelemetry is not installed (``pip install 'turnkit[otel]'``).
    """
    global _enabled
    if tracing is None or tracing is False:
        return []
    if tracing is not True:
        raise InputError(
            f"tracing must be True or False, not {type(tracing).__name__}: spans go to the global tracer provider, "
            "opentelemetry.trace.set_tracer_provider(temporalio.contrib.opentelemetry.create_tracer_provider())"
        )
    try:
        from turnkit._temporal.turn_spans import interceptors
    except ImportError as err:
        raise ConfigError(f"tracing needs OpenTelemetry: pip install 'turnkit[otel]' ({err})") from err
    _enabled = True
    return interceptors()


def add_tracing_argument(parser: argparse.ArgumentParser) -> None:
    """Add a worker's ``--tracing`` (default ``$TURNKIT_TRACING``): trace into the global tracer provider."""
    parser.add_argument(
        "--tracing",
        action="store_true",
        default=os.environ.get("TURNKIT_TRACING", "").lower() not in ("", "0", "false", "no"),
        help="trace with OpenTelemetry into the global tracer provider, which an --app module sets up with "
        "temporalio.contrib.opentelemetry.create_tracer_provider() (TURNKIT_TRACING=1; needs the otel extra)",
    )


def _ignore(result: Result) -> None:
    """What :func:`model_call_span` gives its block when tracing is off."""


@contextmanager
def model_call_span(turn: TurnRecord, request_model: str) -> Generator[Callable[[Result], None]]:
    """The span ``chat {request_model}`` around one model call, when tracing is on; the block hands the call's
    result to the function it gets (usage, response model, cost)."""
    if not _enabled:
        yield _ignore
        return
    from turnkit._temporal.turn_spans import model_span

    with model_span(turn, request_model) as record:
        yield record


@contextmanager
def tool_call_span(request: ToolCallInput) -> Generator[None]:
    """The span ``execute_tool {name}`` around one tool call's activity, when tracing is on."""
    if not _enabled:
        yield
        return
    from turnkit._temporal.turn_spans import tool_span

    with tool_span(request):
        yield
