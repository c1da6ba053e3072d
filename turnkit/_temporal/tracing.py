"""Tracing with OpenTelemetry (``pip install 'turnkit[otel]'``): one trace per turn, GenAI attributes on its calls.

Off by default, and free when off: nothing here imports OpenTelemetry until a plugin is built with ``tracing``, and
the activities' :func:`record_model_call` / :func:`record_tool_call` return at once.

On (``TurnKitPlugin(tracing=True)`` or a ``TracerProvider`` / ``Tracer``), two interceptors are registered:

* temporalio's :class:`~temporalio.contrib.opentelemetry.TracingInterceptor`: client calls, workflow steps (zero-
  duration spans, replay-safe) and activity runs become spans, and the context travels in Temporal headers.
* :class:`TurnTraceInterceptor`: a lane runs many turns but carries only the context of the call that started it,
  so without it every turn of a conversation would join the trace of its first ``ask``. It keeps, per submitted
  turn, the context of the ``submit`` update (the caller's ``ask``) and starts the turn's workflow under it: each
  turn is one trace, from the ask through the lane's submit, the turn workflow, its model and tool activities, and
  its sub-agents' turns (children inherit the context). How a turn travels: ``docs/design.md``, "``ask``: from a
  user's text to a running turn".

The model activity's span carries the GenAI semantic-convention attributes (``gen_ai.operation.name`` ``chat``,
model, provider, token counts) and ``turnkit.cost.usd``; a tool activity's span ``execute_tool``, the tool's name
and call id. Both carry ``turnkit.turn_id``, ``turnkit.conversation_id`` and ``turnkit.agent``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Generator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, Final

from temporalio.converter import PayloadConverter
from temporalio.worker import (
    HandleUpdateInput,
    Interceptor,
    StartActivityInput,
    StartChildWorkflowInput,
    StartLocalActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)
from temporalio.workflow import ActivityHandle, ChildWorkflowHandle

from turnkit.kernel.errors import ConfigError, InputError

if TYPE_CHECKING:
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.trace import Tracer, TracerProvider

    from turnkit.kernel.payloads import ToolCallInput
    from turnkit.kernel.records import TurnRecord
    from turnkit.model import Usage

    #: What ``tracing=`` accepts.
    Tracing = bool | TracerProvider | Tracer | None

__all__ = [
    "TRACER_NAME",
    "TurnTraceInterceptor",
    "add_tracing_argument",
    "record_model_call",
    "record_tool_call",
    "tracing_interceptors",
]

#: The instrumentation name of TurnKit's tracer (``tracing=True`` or a ``TracerProvider``).
TRACER_NAME: Final = "turnkit"

#: The Temporal header temporalio's ``TracingInterceptor`` propagates the context in.
_HEADER: Final = "_tracer-data"

#: The lane's update whose caller a turn's trace starts from.
_SUBMIT: Final = "submit"
#: How many submitted turns' caller contexts a lane keeps in memory (oldest dropped: it joins the lane's trace).
_CARRIERS_KEPT: Final = 1024
#: The lane's activity that starts a turn's workflow (patch ``lane-starts-turns``; older lanes start a child).
_START_TURN: Final = "turnkit.start_turn"

# Set once a plugin with tracing is built in this process; until then the activities' hooks cost one global read.
_enabled = False


def tracing_interceptors(tracing: Tracing) -> list[Interceptor]:
    """The interceptors that trace TurnKit with OpenTelemetry (empty when ``tracing`` is off).

    Args:
        tracing: False or None: off. True: the global tracer provider (``opentelemetry.trace``). A
            ``TracerProvider``: its ``turnkit`` tracer. A ``Tracer``: that tracer.

    Raises:
        InputError: ``tracing`` is none of these.
        ConfigError: OpenTelemetry is not installed (``pip install 'turnkit[otel]'``).
    """
    global _enabled
    if tracing is None or tracing is False:
        return []
    try:
        import opentelemetry.trace as otel_trace
        from temporalio.contrib.opentelemetry import TracingInterceptor
    except ImportError as err:
        raise ConfigError(f"tracing needs OpenTelemetry: pip install 'turnkit[otel]' ({err})") from err
    if tracing is True:
        tracer = otel_trace.get_tracer(TRACER_NAME)
    elif isinstance(tracing, otel_trace.TracerProvider):
        tracer = tracing.get_tracer(TRACER_NAME)
    elif isinstance(tracing, otel_trace.Tracer):  # pyright: ignore[reportUnnecessaryIsInstance]
        tracer = tracing
    else:
        raise InputError(f"tracing must be True, False, a TracerProvider or a Tracer, not {type(tracing).__name__}")
    _enabled = True
    # Order matters: temporalio's interceptor is the outer one, so the turn's context (made current by the inner
    # one) is what it writes into the span and the header of the turn's start.
    return [TracingInterceptor(tracer), TurnTraceInterceptor()]


def add_tracing_argument(parser: argparse.ArgumentParser) -> None:
    """Add a worker's ``--tracing`` (default ``$TURNKIT_TRACING``): trace with the global tracer provider."""
    parser.add_argument(
        "--tracing",
        action="store_true",
        default=os.environ.get("TURNKIT_TRACING", "").lower() not in ("", "0", "false", "no"),
        help="trace with OpenTelemetry's global tracer provider, which an --app module sets up (TURNKIT_TRACING=1; "
        "needs the otel extra)",
    )


def _propagator() -> TextMapPropagator:
    """The propagator of temporalio's ``TracingInterceptor`` (W3C trace context and baggage), built on the host."""
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])


class TurnTraceInterceptor(Interceptor):
    """Worker interceptor: each turn a lane starts joins the trace of the ``ask`` that submitted it.

    Used after temporalio's ``TracingInterceptor`` (see :func:`tracing_interceptors`). It adds no workflow command,
    so histories replay the same with or without it.
    """

    def __init__(self) -> None:
        """Resolve OpenTelemetry here, on the host: the workflow sandbox then never imports it."""
        import opentelemetry.context

        _TurnTraceInbound.propagator = _propagator()
        _TurnTraceInbound.context = opentelemetry.context

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        """The inbound interceptor of every workflow (it only acts on ``submit`` and the children it names)."""
        return _TurnTraceInbound


class _TurnTraceInbound(WorkflowInboundInterceptor):
    """Remembers each submitted turn's caller context; starts the turn under it (see :class:`_TurnTraceOutbound`)."""

    propagator: Any = None
    context: Any = None

    @contextmanager
    def attached(self, carrier: Mapping[str, str]) -> Generator[None]:
        """Make the carrier's context current for the block (in this workflow task's asyncio task)."""
        context = self.propagator.extract(carrier)
        token = self.context.attach(context)
        try:
            yield
        finally:
            # An evicted workflow's coroutine is closed by the garbage collector, in another contextvars context,
            # where the token is not valid: skip the detach there rather than have OpenTelemetry log an error.
            if self.context.get_current() is context:
                with suppress(ValueError):
                    token.var.reset(token)

    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        """Keep the carriers of submitted turns, by turn id, until the lane starts them.

        Rebuilt on replay (the update handlers run again). A turn started after its lane continued as new has no
        carrier here and joins the lane's trace instead.
        """
        self.turn_carriers: dict[str, Mapping[str, str]] = {}
        super().init(_TurnTraceOutbound(outbound, self))

    async def handle_update_handler(self, input: HandleUpdateInput) -> Any:
        """Run ``submit`` in its caller's context (its activity joins that trace) and remember it for the turn."""
        header = input.headers.get(_HEADER) if input.update == _SUBMIT else None
        if header is None:
            return await super().handle_update_handler(input)
        carrier: Mapping[str, str] = PayloadConverter.default.from_payloads([header])[0] or {}
        with self.attached(carrier):
            ticket = await super().handle_update_handler(input)
        turn_id = getattr(ticket, "turn_id", None)
        if isinstance(turn_id, str) and carrier:
            self.turn_carriers[turn_id] = carrier
            while len(self.turn_carriers) > _CARRIERS_KEPT:  # a started turn's carrier stays (a fallback may use it)
                del self.turn_carriers[next(iter(self.turn_carriers))]
        return ticket


class _TurnTraceOutbound(WorkflowOutboundInterceptor):
    """Starts a submitted turn's workflow in its caller's context."""

    def __init__(self, next: WorkflowOutboundInterceptor, inbound: _TurnTraceInbound) -> None:
        super().__init__(next)
        self.inbound = inbound

    async def start_child_workflow(self, input: StartChildWorkflowInput) -> ChildWorkflowHandle[Any, Any]:
        """temporalio's interceptor (next) writes the start's span and header from the context made current here."""
        carrier = self.inbound.turn_carriers.pop(input.id, None)
        if carrier is None:
            return await super().start_child_workflow(input)
        with self.inbound.attached(carrier):
            return await super().start_child_workflow(input)

    def start_local_activity(self, input: StartLocalActivityInput) -> ActivityHandle[Any]:
        """``turnkit.start_turn`` runs in the turn's caller's context, so the turn's workflow starts in its trace."""
        with self._start_turn_context(input.activity, input.args):
            return super().start_local_activity(input)

    def start_activity(self, input: StartActivityInput) -> ActivityHandle[Any]:
        """The same for the regular activity that runs ``turnkit.start_turn`` again after a failed local attempt."""
        with self._start_turn_context(input.activity, input.args):
            return super().start_activity(input)

    @contextmanager
    def _start_turn_context(self, activity: str, args: Sequence[Any]) -> Generator[None]:
        """The caller context of the turn a ``turnkit.start_turn`` call starts (kept for a fallback attempt), made
        current for the block; nothing for any other activity."""
        turn_id = getattr(getattr(args[0], "turn", None), "turn_id", None) if activity == _START_TURN and args else None
        carrier = self.inbound.turn_carriers.get(turn_id) if isinstance(turn_id, str) else None
        if carrier is None:
            yield
            return
        with self.inbound.attached(carrier):
            yield


# -- attributes on the activities' spans ----------------------------------------------------------------------------


def _current_span() -> Any:
    """The activity's recording span, or None (tracing off, or this call not sampled)."""
    if not _enabled:
        return None
    from opentelemetry import trace

    span = trace.get_current_span()
    return span if span.is_recording() else None


def _turn_attributes(turn_id: str, conversation_id: str, agent: str) -> dict[str, str]:
    return {"turnkit.turn_id": turn_id, "turnkit.conversation_id": conversation_id, "turnkit.agent": agent}


def record_model_call(
    turn: TurnRecord, *, request_model: str, response_model: str | None, usage: Usage, cost: float | None
) -> None:
    """Put a model call's GenAI attributes on the current span (the ``turnkit.model`` activity's); a no-op when off.

    Token counts follow the semantic conventions: ``gen_ai.usage.input_tokens`` includes cached and cache-write
    tokens and ``gen_ai.usage.output_tokens`` includes thinking tokens (our usage buckets do not overlap).
    """
    span = _current_span()
    if span is None:
        return
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": request_model,
        "gen_ai.provider.name": _provider_name(turn.agent_name),
        "gen_ai.agent.name": turn.agent_name,
        "gen_ai.conversation.id": turn.conversation_id,
        "gen_ai.usage.input_tokens": usage.input_tokens + usage.cached_tokens + usage.cache_write_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens + usage.thinking_tokens,
        "gen_ai.usage.cache_read.input_tokens": usage.cached_tokens,
        "gen_ai.usage.cache_creation.input_tokens": usage.cache_write_tokens,
        "gen_ai.usage.reasoning.output_tokens": usage.thinking_tokens,
        **_turn_attributes(turn.id, turn.conversation_id, turn.agent_name),
    }
    attributes["gen_ai.system"] = attributes["gen_ai.provider.name"]  # the older name, still read by many backends
    if response_model:
        attributes["gen_ai.response.model"] = response_model
    if cost is not None:
        attributes["turnkit.cost.usd"] = cost
    span.set_attributes(attributes)


def record_tool_call(request: ToolCallInput) -> None:
    """Put a tool call's GenAI attributes on the current span (the ``tool:<name>`` activity's); a no-op when off."""
    span = _current_span()
    if span is None:
        return
    span.set_attributes(
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": request.call.name,
            "gen_ai.tool.call.id": request.call.id,
            **_turn_attributes(request.turn_id, request.conversation_id, request.agent_name),
        }
    )


#: ``gen_ai.provider.name`` of TurnKit's own provider clients, by class name.
_PROVIDERS: Final = {"OpenAIClient": "openai", "AnthropicClient": "anthropic"}


def _provider_name(agent_name: str) -> str:
    """The provider of the agent's client: ``openai``, ``anthropic``, else the client's class name."""
    from turnkit.agent import resolve_agent

    try:
        client = resolve_agent(agent_name).effective_client
    except ConfigError:
        return "unknown"
    name = type(client).__name__
    return str(getattr(client, "provider_name", None) or _PROVIDERS.get(name, name))
