"""TurnKit's spans on temporalio's ``OpenTelemetryPlugin``; imported only once tracing is on (see
:mod:`turnkit._temporal.tracing`, which keeps OpenTelemetry out of a process that does not trace).

Three spans, named and attributed as the GenAI semantic conventions say:

* ``invoke_agent {agent}``: the turn, started by :class:`TurnTraceInterceptor` around the ``TurnWorkflow`` run, in
  the workflow, with the replay-safe tracer of the plugin's provider (``create_tracer_provider``). Started again on
  replay (same ids: the provider's id generator draws from the workflow's seed; start time the workflow's clock),
  it is ended only by the run that finishes the turn live, so a worker restart, a cache eviction or the Replayer
  never writes it twice, and its duration is the turn's.
* ``chat {model}``: one model call, in the ``turnkit.model`` activity (:func:`model_span`).
* ``execute_tool {name}``: one tool call's activity (:func:`tool_span`).

The activities run in the context the plugin's interceptor carries in their headers, so both are children of the
turn's span; a sub-agent's turn is a child of its parent's, its workflow started in that span's context.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, Final

import opentelemetry.context
from opentelemetry import trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from temporalio import workflow
from temporalio.contrib.opentelemetry import OpenTelemetryInterceptor, ReplaySafeTracerProvider
from temporalio.converter import PayloadConverter
from temporalio.worker import (
    ExecuteWorkflowInput,
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

from turnkit.kernel.errors import ConfigError
from turnkit.kernel.names import TURN_WORKFLOW

if TYPE_CHECKING:
    from turnkit.kernel.payloads import ToolCallInput
    from turnkit.kernel.records import TurnRecord
    from turnkit.model import Result

__all__ = ["TRACER_NAME", "TurnTraceInterceptor", "interceptors", "model_span", "tool_span"]

#: The instrumentation name of TurnKit's tracer (on the global tracer provider, as the plugin's).
TRACER_NAME: Final = "turnkit"

#: The Temporal header the plugin's interceptor carries the context in.
_HEADER: Final = "_tracer-data"
#: The lane's update whose caller a turn's trace starts from.
_SUBMIT: Final = "submit"
#: How many submitted turns' caller contexts a lane keeps in memory (oldest dropped: it joins the lane's trace).
_CARRIERS_KEPT: Final = 1024
#: The lane's activity that starts a turn's workflow (patch ``lane-starts-turns``; older lanes start a child).
_START_TURN: Final = "turnkit.start_turn"

#: The plugin's propagator (W3C trace context and baggage).
_PROPAGATOR: Final = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])

#: ``gen_ai.provider.name`` of TurnKit's own provider clients, by class name.
_PROVIDERS: Final = {"OpenAIClient": "openai", "AnthropicClient": "anthropic"}


def interceptors() -> list[Interceptor]:
    """The interceptor ``OpenTelemetryPlugin`` registers (the context in Temporal headers, no Temporal spans of its
    own), then TurnKit's, in that order (see :class:`_TurnTraceOutbound`). The plugin's other part, passing
    ``opentelemetry`` through the workflow sandbox, is :class:`~turnkit.plugin.TurnKitPlugin`'s."""
    return [OpenTelemetryInterceptor(add_temporal_spans=False), TurnTraceInterceptor()]


def _tracer() -> Tracer:
    return trace.get_tracer(TRACER_NAME)


@contextmanager
def _attached(context: Context) -> Generator[None]:
    """Make ``context`` current for the block (in this asyncio task's contextvars)."""
    token = opentelemetry.context.attach(context)
    try:
        yield
    finally:
        # An evicted workflow's coroutine may be closed by the garbage collector, in another contextvars context,
        # where the token is not valid: skip the detach there rather than have OpenTelemetry log an error.
        if opentelemetry.context.get_current() is context:
            with suppress(ValueError):
                token.var.reset(token)


def _turn_attributes(turn_id: str, conversation_id: str, agent: str) -> dict[str, str]:
    return {"turnkit.turn_id": turn_id, "turnkit.conversation_id": conversation_id, "turnkit.agent": agent}


# -- the turn, in the workflow ---------------------------------------------------------------------------------------


class TurnTraceInterceptor(Interceptor):
    """Worker interceptor, after the plugin's: the turn's span, and each turn a lane starts in its own ask's trace.

    It adds no workflow command, so histories replay the same with or without it.
    """

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        """The inbound interceptor of every workflow (it acts on ``TurnWorkflow``, ``submit`` and the turns a lane
        starts).

        Raises:
            ConfigError: the global tracer provider is not replay-safe: a span in a workflow would be written again
                at every replay.
        """
        if not isinstance(trace.get_tracer_provider(), ReplaySafeTracerProvider):
            raise ConfigError(
                "tracing a worker needs a replay-safe global tracer provider: opentelemetry.trace.set_tracer_provider("
                "temporalio.contrib.opentelemetry.create_tracer_provider()), before the worker is built"
            )
        return _TurnTraceInbound


class _TurnTraceInbound(WorkflowInboundInterceptor):
    """The turn's span; the caller context of each submitted turn, kept until the lane starts it."""

    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        """Keep the carriers of submitted turns, by turn id, until the lane starts them.

        Rebuilt on replay (the update handlers run again). A turn started after its lane continued as new has no
        carrier here and joins the lane's trace instead.
        """
        self.turn_carriers: dict[str, Mapping[str, str]] = {}
        super().init(_TurnTraceOutbound(outbound, self))

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        """Run a ``TurnWorkflow`` inside its turn's span (the plugin's interceptor made the caller's context current).

        Ended when the run returns, fails the workflow, is cancelled or continues as new (then the next run's span is
        its child); never when the workflow task fails or the workflow is evicted (its next worker replays it and ends
        it). While history is replayed the replay-safe span does not end at all.
        """
        turn = input.args[0] if input.args else None
        agent = getattr(turn, "agent_name", None)
        if workflow.info().workflow_type != TURN_WORKFLOW or not isinstance(agent, str):
            return await super().execute_workflow(input)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent,
            "gen_ai.conversation.id": str(getattr(turn, "conversation_id", "")),
            **_turn_attributes(str(getattr(turn, "turn_id", "")), str(getattr(turn, "conversation_id", "")), agent),
            "turnkit.root_turn_id": str(getattr(turn, "root_turn_id", "")),
        }
        span = _tracer().start_span(f"invoke_agent {agent}", kind=SpanKind.INTERNAL, attributes=attributes)
        with _attached(trace.set_span_in_context(span)):
            try:
                outcome = await super().execute_workflow(input)
            except workflow.ContinueAsNewError:
                span.set_attribute("turnkit.continued_as_new", True)
                span.end()
                raise
            except asyncio.CancelledError:
                # The workflow was cancelled; an eviction cancels its tasks too, but counts as replay (no end then).
                span.set_status(Status(StatusCode.ERROR, "cancelled"))
                span.set_attribute("error.type", "cancelled")
                span.end()
                raise
            except Exception as err:
                if workflow.is_failure_exception(err):  # the workflow fails; any other error fails only its task
                    span.set_status(Status(StatusCode.ERROR, f"{type(err).__name__}: {err}"))
                    span.set_attribute("error.type", type(err).__name__)
                    span.end()
                raise
            _record_outcome(span, outcome)
            span.end()
            return outcome

    async def handle_update_handler(self, input: HandleUpdateInput) -> Any:
        """Run ``submit`` in its caller's context (the plugin's interceptor made it current) and remember that
        context, empty when the caller had none, for the turn it submits."""
        if input.update != _SUBMIT:
            return await super().handle_update_handler(input)
        header = input.headers.get(_HEADER)
        carrier: Mapping[str, str] = {}
        if header is not None:
            carrier = PayloadConverter.default.from_payloads([header])[0] or {}
        ticket = await super().handle_update_handler(input)
        turn_id = getattr(ticket, "turn_id", None)
        if isinstance(turn_id, str):
            self.turn_carriers[turn_id] = carrier
            while len(self.turn_carriers) > _CARRIERS_KEPT:  # a started turn's carrier stays (a fallback may use it)
                del self.turn_carriers[next(iter(self.turn_carriers))]
        return ticket


def _record_outcome(span: Span, outcome: Any) -> None:
    """The turn's terminal status (a paused or revised outcome has none yet), and its error class."""
    status = getattr(outcome, "status", None)
    if isinstance(status, str) and not getattr(outcome, "paused", False):
        span.set_attribute("turnkit.turn.status", status)
    error_class = getattr(outcome, "error_class", None)
    if isinstance(error_class, str):
        span.set_attribute("error.type", error_class)
        span.set_status(Status(StatusCode.ERROR, error_class))


class _TurnTraceOutbound(WorkflowOutboundInterceptor):
    """Starts a submitted turn in its caller's context.

    Called before the plugin's outbound interceptor (the later a worker interceptor, the earlier its outbound one),
    which writes the context made current here into the header of the turn's start.
    """

    def __init__(self, next: WorkflowOutboundInterceptor, inbound: _TurnTraceInbound) -> None:
        super().__init__(next)
        self.inbound = inbound

    async def start_child_workflow(self, input: StartChildWorkflowInput) -> ChildWorkflowHandle[Any, Any]:
        """A lane of an older release starts its turns as children: in the caller's context too."""
        carrier = self.inbound.turn_carriers.pop(input.id, None)
        if carrier is None:
            return await super().start_child_workflow(input)
        with _attached(_PROPAGATOR.extract(carrier)):
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
        with _attached(_PROPAGATOR.extract(carrier)):
            yield


# -- model and tool calls, in the activities -------------------------------------------------------------------------


@contextmanager
def model_span(turn: TurnRecord, request_model: str) -> Generator[Callable[[Result], None]]:
    """The span ``chat {model}`` of one model call; the block records the call's result with the function it gets.

    Token counts follow the semantic conventions: ``gen_ai.usage.input_tokens`` includes cached and cache-write
    tokens and ``gen_ai.usage.output_tokens`` includes thinking tokens (our usage buckets do not overlap).
    """
    provider = _provider_name(turn.agent_name)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": request_model,
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,  # the older name, still read by many backends
        "gen_ai.agent.name": turn.agent_name,
        "gen_ai.conversation.id": turn.conversation_id,
        **_turn_attributes(turn.id, turn.conversation_id, turn.agent_name),
    }

    def record(result: Result) -> None:
        from turnkit.cost import cost_from_usage

        usage = result.usage
        values: dict[str, Any] = {
            "gen_ai.usage.input_tokens": usage.input_tokens + usage.cached_tokens + usage.cache_write_tokens,
            "gen_ai.usage.output_tokens": usage.output_tokens + usage.thinking_tokens,
            "gen_ai.usage.cache_read.input_tokens": usage.cached_tokens,
            "gen_ai.usage.cache_creation.input_tokens": usage.cache_write_tokens,
            "gen_ai.usage.reasoning.output_tokens": usage.thinking_tokens,
        }
        if result.model:
            values["gen_ai.response.model"] = result.model
        cost = cost_from_usage(usage, result.model or request_model).total
        if cost is not None:
            values["turnkit.cost.usd"] = cost
        span.set_attributes(values)

    with _tracer().start_as_current_span(f"chat {request_model}", kind=SpanKind.CLIENT, attributes=attributes) as span:
        try:
            yield record
        except Exception as err:
            span.set_attribute("error.type", type(err).__name__)
            raise


@contextmanager
def tool_span(request: ToolCallInput) -> Generator[None]:
    """The span ``execute_tool {name}`` of one tool call's activity."""
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": request.call.name,
        "gen_ai.tool.call.id": request.call.id,
        **_turn_attributes(request.turn_id, request.conversation_id, request.agent_name),
    }
    with _tracer().start_as_current_span(f"execute_tool {request.call.name}", attributes=attributes) as span:
        try:
            yield
        except Exception as err:
            span.set_attribute("error.type", type(err).__name__)
            raise


def _provider_name(agent_name: str) -> str:
    """The provider of the agent's client: ``openai``, ``anthropic``, else the client's class name."""
    from turnkit.agent import resolve_agent

    try:
        client = resolve_agent(agent_name).effective_client
    except ConfigError:
        return "unknown"
    name = type(client).__name__
    return str(getattr(client, "provider_name", None) or _PROVIDERS.get(name, name))
