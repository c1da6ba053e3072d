"""Your activities as tools: :func:`activity_tool` makes an existing ``@activity.defn`` a tool of an agent.

::

    class OrderQuery(BaseModel):
        order_id: str

    @activity.defn(name="orders.lookup")
    async def lookup_order(query: OrderQuery) -> Order:
        '''Look up an order by its id.'''

    agent = turnkit.Agent(
        "support",
        tools=[turnkit.activity_tool(lookup_order, task_queue="orders", recovery="replay_safe")],
    )

The call runs *as that activity*: the turn's workflow schedules ``orders.lookup`` on the ``orders`` queue, where the
team's own worker (which needs no TurnKit) runs it with the timeouts and retries given here. Around it, two store
calls of TurnKit's open the call's execution (tool budgets, the authorization hook, the control boundary) and record
its result, so the call is a tool execution like any other and the recovery rules hold: an ``at_most_once`` tool has
one attempt and a lost one is recorded ``interrupted``; a ``replay_safe`` one is retried by its retry policy.

Unlike a ``@tool`` function's, the arguments and the result of an activity tool cross the turn's history (they are
the activity's input and output): keep them small, and pass ids for anything large (docs/design.md, "Your activities
as tools").
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, ClassVar, Literal, cast

from pydantic import BaseModel
from temporalio import activity
from temporalio.common import RetryPolicy

from turnkit.kernel.errors import ToolError
from turnkit.kernel.payloads import ActivityTarget, CallPolicy
from turnkit.tools import Recovery, Terminal, Tool, check_task_queue, is_valid_tool_name, tool

__all__ = ["ActivityTool", "activity_tool"]

#: A replay-safe activity tool given no retry policy: TurnKit's tool defaults (5 attempts, 1 s to 30 s apart).
DEFAULT_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30), maximum_attempts=5
)


class ActivityTool(Tool):
    """A tool that runs as an application's own Temporal activity (built by :func:`activity_tool`).

    The model's arguments are validated here (the ``Arguments`` model comes from the activity's signature) and sent
    as the activity's arguments; what the activity returns is the tool's result.
    """

    activity_type: ClassVar[str] = ""
    """The activity's registered name: what the turn schedules."""
    activity_task_queue: ClassVar[str | None] = None
    """The queue the activity is scheduled on (a worker of the team's that registers it); None: the turn's queue."""
    schedule_to_close_timeout: ClassVar[float | None] = None
    heartbeat_timeout: ClassVar[float | None] = None
    retry_policy: ClassVar[RetryPolicy] = DEFAULT_RETRY
    """The retries of a replay-safe tool (an at-most-once one has a single attempt)."""
    parameters: ClassVar[tuple[str, ...] | None] = None
    """The activity's parameters in order, one argument each; None: its one parameter is a pydantic model whose
    fields are the arguments."""

    @property
    def reads_context(self) -> bool:
        """The activity gets only the arguments."""
        return False

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """Not run in this process: the turn's workflow schedules the activity itself.

        Raises:
            ToolError: Always.
        """
        raise ToolError(f"tool {self.name} runs as the activity {self.activity_type!r}, scheduled by its turn")

    def activity_args(self, arguments: Mapping[str, Any]) -> list[Any]:
        """The activity's arguments (JSON values, in parameter order) for the model's ``arguments``.

        Raises:
            ToolValidationError: The arguments are invalid.
        """
        validated = self.validate_arguments(arguments)
        if self.parameters is None:
            return [validated]
        return [validated[name] for name in self.parameters]

    def call_policy(self) -> CallPolicy:
        """How the turn's workflow dispatches a call: the activity, its queue, timeouts and retries."""
        replay_safe = self.recovery == "replay_safe"
        retry = self.retry_policy
        initial = retry.initial_interval.total_seconds()
        maximum = retry.maximum_interval.total_seconds() if retry.maximum_interval else 100 * initial
        return CallPolicy(
            kind="activity",
            at_most_once=not replay_safe,
            timeout=self.timeout,
            max_attempts=retry.maximum_attempts if replay_safe else 1,
            initial_retry_interval=initial,
            maximum_retry_interval=maximum,
            task_queue=self.activity_task_queue,
            activity=ActivityTarget(
                activity_type=self.activity_type,
                schedule_to_close=self.schedule_to_close_timeout,
                heartbeat=self.heartbeat_timeout,
                backoff_coefficient=retry.backoff_coefficient,
                non_retryable_error_types=list(retry.non_retryable_error_types or ()),
            ),
        )


def activity_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    task_queue: str | None = None,
    start_to_close_timeout: timedelta = timedelta(minutes=1),
    schedule_to_close_timeout: timedelta | None = None,
    heartbeat_timeout: timedelta | None = None,
    retry_policy: RetryPolicy | None = None,
    recovery: Recovery | Literal["unknown"] = "at_most_once",
    terminal: Terminal = False,
    usage_hint: str = "",
) -> ActivityTool:
    """Make an existing ``@activity.defn`` (a function, or a bound method of an activity class) a tool.

    The arguments come from the activity's signature: a single parameter typed as a pydantic model gives that
    model's fields, several parameters give one argument each (their type hints, defaults and ``Annotated[...,
    Field(description=...)]``, or a Google-style ``Args:`` section). The description is the docstring's first
    paragraph.

    Args:
        fn: The activity (decorated with ``@activity.defn``; not a dynamic activity).
        name: The tool's name; defaults to the function's name.
        description: The tool's description; defaults to the docstring's first paragraph.
        task_queue: The queue the activity runs on (a worker of yours that registers it, with or without TurnKit);
            None: the turn's own queue, whose workers must then register the activity.
        start_to_close_timeout: How long one attempt may take.
        schedule_to_close_timeout: How long all attempts together may take (None: no bound).
        heartbeat_timeout: For an activity that heartbeats: how long without one is a lost attempt.
        retry_policy: A replay-safe tool's retries (default: 5 attempts, 1 s to 30 s apart).
        recovery: ``"at_most_once"`` (one attempt; a lost one is recorded ``interrupted`` and never run again) or
            ``"replay_safe"`` (retried by ``retry_policy``).
        terminal: Whether a completed call ends the turn, and with which message (see :class:`~turnkit.tools.Tool`).
        usage_hint: Prompt hint, rendered as "Use when:".

    Returns:
        The tool, for ``Agent(tools=[...])``.

    Raises:
        TypeError: ``fn`` is not an ``@activity.defn`` function or bound method, or is a dynamic activity.
        ValueError: An invalid name, queue or timeout, an unsupported parameter, or a ``retry_policy`` with more than
            one attempt for an at-most-once tool.
    """
    definition = activity._Definition.from_callable(fn)  # pyright: ignore[reportPrivateUsage]
    if definition is None:
        raise TypeError(f"activity_tool needs an @activity.defn function or bound method, not {fn!r}")
    if definition.name is None:
        raise TypeError("activity_tool cannot schedule a dynamic activity: it has no name of its own")
    parameters = list(inspect.signature(fn).parameters.values())
    if parameters and parameters[0].name == "self" and not inspect.ismethod(fn):
        raise TypeError("activity_tool needs a bound method (instance.method) of an activity class")
    tool_name = name or getattr(fn, "__name__", "")
    if not is_valid_tool_name(tool_name):
        raise ValueError(f"invalid tool name: {tool_name!r} (must match [a-zA-Z_][a-zA-Z0-9_]*); pass name=")
    check_task_queue(tool_name, task_queue)
    recovery = "at_most_once" if recovery == "unknown" else recovery
    if recovery == "at_most_once" and retry_policy is not None and retry_policy.maximum_attempts != 1:
        raise ValueError(
            f"tool {tool_name}: an at-most-once tool runs one attempt; retries need recovery='replay_safe'"
        )
    if start_to_close_timeout <= timedelta(0):
        raise ValueError(f"tool {tool_name}: start_to_close_timeout must be positive")
    retry = retry_policy or DEFAULT_RETRY
    arguments, ordered, summary = _arguments_of(fn, tool_name, parameters)
    namespace: dict[str, Any] = {
        "name": tool_name,
        "description": summary if description is None else description,
        "usage_hint": usage_hint,
        "recovery": recovery,
        "timeout": start_to_close_timeout.total_seconds(),
        # Tool.max_attempts is at least 1; 0 (Temporal's "unlimited") stays in retry_policy.
        "max_attempts": max(retry.maximum_attempts, 1) if recovery == "replay_safe" else 1,
        "initial_retry_interval": retry.initial_interval.total_seconds(),
        "maximum_retry_interval": (retry.maximum_interval or 100 * retry.initial_interval).total_seconds(),
        "terminal": terminal,
        "Arguments": arguments,
        "activity_type": definition.name,
        "activity_task_queue": task_queue,
        "schedule_to_close_timeout": None
        if schedule_to_close_timeout is None
        else schedule_to_close_timeout.total_seconds(),
        "heartbeat_timeout": None if heartbeat_timeout is None else heartbeat_timeout.total_seconds(),
        "retry_policy": retry,
        "parameters": ordered,
        "__module__": getattr(fn, "__module__", __name__),
    }
    cls = cast("type[ActivityTool]", type(f"{_camel_case(tool_name)}ActivityTool", (ActivityTool,), namespace))
    return cls()


def _arguments_of(
    fn: Callable[..., Any], tool_name: str, parameters: list[inspect.Parameter]
) -> tuple[type[BaseModel], tuple[str, ...] | None, str]:
    """The tool's ``Arguments`` model, the activity's parameter order (None: one model parameter) and the docstring's
    summary."""
    hints = typing.get_type_hints(fn, include_extras=True)
    if len(parameters) == 1:
        annotation = hints.get(parameters[0].name)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return annotation, None, _summary(inspect.getdoc(fn) or "")
    # One argument per parameter: the schema @tool builds from a function's signature and docstring.
    built = tool(name=tool_name)(fn)
    return built.Arguments, tuple(each.name for each in parameters), built.description


def _summary(doc: str) -> str:
    """The docstring's first paragraph, on one line."""
    lines: list[str] = []
    for line in doc.splitlines():
        if not line.strip():
            break
        lines.append(line.strip())
    return " ".join(lines)


def _camel_case(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) or "Activity"
