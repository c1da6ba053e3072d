"""Ask TurnKit agents from your own Temporal workflow, as one of its steps.

Inside a ``@workflow.defn`` of yours, on a worker that has ``TurnKitPlugin(store)``::

    import turnkit.workflow

    draft = await turnkit.workflow.ask(agent="drafter", text="Draft the approval request")
    legal, finance = await asyncio.gather(
        turnkit.workflow.run(agent="legal", task="Review it", input=draft.output_text),
        turnkit.workflow.run(agent="finance", task="Cost it", input=draft.output_text),
    )

The turn runs as TurnKit runs every turn: through its conversation's lane when the conversation exists (one active
turn, FIFO), with its record in the store, its tree's budgets, human controls and the ``principal``'s authorization.
What comes back is a :class:`~turnkit.kernel.asks.TurnResult`; a failed turn is a result too (``status``,
``error_class``), and ``result.raise_for_status()`` makes it an exception.

How, in short (docs/design.md, "A team's workflow asks an agent"): the ids of the turn, its message and a new
conversation come from the workflow's deterministic random source; an activity submits the turn as
``Conversation.ask`` does and registers this workflow as the turn's waiter; the turn's end signals the workflow
``target_finished``, and an activity reads the result. A replay finds each step in the history and starts no second
turn; a retried activity finds what its first attempt wrote. Cancelling the workflow while it awaits a turn cancels
the turn. Only the kernel and temporalio are imported here, so the sandbox passes this module through.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import weakref
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, Final, TypedDict, TypeVar, Unpack

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from turnkit.kernel import errors
from turnkit.kernel.activities import AskCalls
from turnkit.kernel.asks import (
    DEFAULT_OUTPUT_LIMIT,
    MAX_CALLER_WORKFLOW_ID,
    AskReceipt,
    AskTurn,
    ControlAction,
    ControlReceipt,
    ControlTurn,
    FollowAsk,
    TurnResult,
)
from turnkit.kernel.names import TARGET_FINISHED_SIGNAL

__all__ = [
    "DEFAULT_OUTPUT_LIMIT",
    "FOLLOW_POLL",
    "AskOptions",
    "CancelAskedTurns",
    "TurnHandle",
    "TurnResult",
    "ask",
    "get_handle",
    "run",
    "start",
]

#: A turn's end signals the workflow; without a signal (a turn whose workflow was terminated signals nothing) the
#: workflow asks the store again after this long.
FOLLOW_POLL: Final = timedelta(minutes=1)
#: The activities are quick store and client calls; a submission waits out a database or server away for up to a
#: minute each before it gives up and is retried. Retries have no end: every activity here is idempotent.
_ACTIVITY_TIMEOUT: Final = timedelta(minutes=5)
#: A worker killed in the middle of an activity is noticed after this long (the activities heartbeat when slow).
_HEARTBEAT: Final = timedelta(seconds=10)
_RETRY: Final = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30))

_UNSET: Any = object()
_T = TypeVar("_T")
_A = TypeVar("_A")


class _Asks:
    """What one workflow run knows of the turns it asked: those whose end was signalled, and those it has not seen
    end (a cancelled run cancels them)."""

    def __init__(self) -> None:
        self.ended: set[str] = set()
        self.open: dict[str, TurnHandle] = {}


#: Per workflow run, keyed by the run's event loop (one per run, a new one for every replay): this module is shared
#: by every workflow the worker runs, so it keeps nothing at module level that one run could see of another.
_RUNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Asks] = weakref.WeakKeyDictionary()


def _asks() -> _Asks:
    """This run's state; at first use, the ``target_finished`` handler is registered."""
    if not workflow.in_workflow():
        raise errors.Error("turnkit.workflow is for workflow code; elsewhere use Conversation.ask or Agent.run")
    loop = asyncio.get_running_loop()
    asks = _RUNS.get(loop)
    if asks is None:
        asks = _RUNS[loop] = _Asks()
        _listen(asks)
    return asks


def _listen(asks: _Asks) -> None:
    """Handle ``target_finished``: note the ended turn, then call a handler the workflow defined for that name itself
    (it is kept, not replaced). A signal that came before any handler was buffered by Temporal and arrives now."""
    theirs = workflow.get_signal_handler(TARGET_FINISHED_SIGNAL)
    if theirs is None:

        def noted(turn_id: str) -> None:
            asks.ended.add(turn_id)

        workflow.set_signal_handler(TARGET_FINISHED_SIGNAL, noted)
    elif inspect.iscoroutinefunction(theirs):

        async def noted_then_theirs(turn_id: str) -> None:
            asks.ended.add(turn_id)
            await theirs(turn_id)

        workflow.set_signal_handler(TARGET_FINISHED_SIGNAL, noted_then_theirs)
    else:

        def noted_and_theirs(turn_id: str) -> None:
            asks.ended.add(turn_id)
            theirs(turn_id)

        workflow.set_signal_handler(TARGET_FINISHED_SIGNAL, noted_and_theirs)


def _new_id(prefix: str) -> str:
    """A TurnKit id (``<prefix>_`` and 24 hex characters) from the workflow's deterministic source: a replay, and
    every retry of the activity that uses it, get the same one."""
    return f"{prefix}_{workflow.uuid4().hex[:24]}"


async def _activity(declared: Callable[[Any, _A], Awaitable[_T]], arg: _A, *, task_queue: str, summary: str) -> _T:
    """Run one of TurnKit's activities; a TurnKit error it reports is raised as that error (a cancellation as is)."""
    try:
        return await workflow.execute_activity_method(
            declared,
            arg,
            task_queue=task_queue,
            start_to_close_timeout=_ACTIVITY_TIMEOUT,
            heartbeat_timeout=_HEARTBEAT,
            retry_policy=_RETRY,
            summary=summary,
        )
    except ActivityError as err:
        if is_cancelled_exception(err) or not isinstance(err.cause, ApplicationError):
            raise
        raise _turnkit_error(err.cause) from err


def _turnkit_error(cause: ApplicationError) -> errors.Error:
    """The TurnKit error a non-retryable activity failure names (its type is the error's class name)."""
    cls = getattr(errors, (cause.type or "").removeprefix("TurnKit::"), None)
    if isinstance(cls, type) and issubclass(cls, errors.Error):
        return cls(cause.message)
    return errors.Error(cause.message)


class TurnHandle:
    """A turn asked by this workflow: await :meth:`result`, or :meth:`steer`, :meth:`pause`, :meth:`resume` and
    :meth:`cancel` it. From :func:`start`, or :func:`get_handle` for a turn id this workflow kept (e.g. across
    continue-as-new)."""

    def __init__(
        self,
        turn_id: str,
        conversation_id: str,
        *,
        task_queue: str,
        principal: Any = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        result: TurnResult | None = None,
        waiting: bool = False,
    ) -> None:
        self.turn_id = turn_id
        """The turn's id (``turn_…``), also its workflow's id."""
        self.conversation_id = conversation_id
        """Its conversation (``conv_…``): ask again there to continue it."""
        self._task_queue = task_queue
        self._principal = principal
        self._output_limit = output_limit
        self._result = result
        self._waiting = waiting  # this run is the turn's waiter already (start() registered it)

    async def result(self) -> TurnResult:
        """Wait until the turn has ended and return its result (completed, failed or cancelled).

        Cancelling the workflow while it waits here cancels the turn (and its sub-agents' turns), then the
        cancellation goes on.
        """
        asks = _asks()
        try:
            while self._result is None:
                if self._waiting:

                    def ended() -> bool:
                        return self.turn_id in asks.ended

                    # No signal within the poll: the store is asked (and the waiter registered) again.
                    with contextlib.suppress(TimeoutError):
                        await workflow.wait_condition(ended, timeout=FOLLOW_POLL, timeout_summary="turn end")
                follow = FollowAsk(
                    turn_id=self.turn_id,
                    waiter_id=workflow.info().workflow_id,
                    task_queue=self._task_queue,
                    output_limit=self._output_limit,
                )
                self._result = await _activity(
                    AskCalls.follow, follow, task_queue=self._task_queue, summary=f"result of {self.turn_id}"
                )
                self._waiting = True
            asks.open.pop(self.turn_id, None)
        except BaseException as err:
            if is_cancelled_exception(err):
                await _cancel_with_caller(self)
            raise
        return self._result

    async def steer(
        self, text: str, *, key: str | None = None, principal: Any = _UNSET, descendants: str = "retain"
    ) -> list[dict[str, Any]]:
        """Queue ``text`` as human input for the turn's next control boundary (``Turn.steer``); returns the steering
        receipts. ``key`` makes it idempotent (default: a new one); ``principal`` defaults to the one it was asked
        with."""
        key = key if key is not None else _new_id("steer")
        receipt = await self._control("steer", principal, descendants, text=text, key=key)
        return receipt.receipts

    async def pause(self, *, principal: Any = _UNSET, descendants: str = "retain") -> str:
        """Pause the turn at its next control boundary (``Turn.pause``); returns its status."""
        return (await self._control("pause", principal, descendants)).status

    async def resume(self, *, principal: Any = _UNSET, descendants: str = "retain") -> str:
        """Withdraw a pause (``Turn.resume``); returns the turn's status."""
        return (await self._control("resume", principal, descendants)).status

    async def cancel(self, *, principal: Any = _UNSET, descendants: str = "retain") -> str:
        """End the turn ``cancelled`` (``Turn.cancel``); returns its status. :meth:`result` then returns."""
        return (await self._control("cancel", principal, descendants)).status

    async def _control(
        self, action: ControlAction, principal: Any, descendants: str, *, text: str = "", key: str = ""
    ) -> ControlReceipt:
        _asks()
        control = ControlTurn(
            turn_id=self.turn_id,
            action=action,
            principal=self._principal if principal is _UNSET else principal,
            descendants=descendants,
            text=text,
            key=key,
            task_queue=self._task_queue,
        )
        return await _activity(
            AskCalls.control, control, task_queue=self._task_queue, summary=f"{action} {self.turn_id}"
        )


class AskOptions(TypedDict, total=False):
    """The options of :func:`start` and :func:`ask` besides the text, as a typed model (their meaning is on
    :func:`start`)."""

    agent: str | None
    conversation_id: str | None
    principal: Any
    context: dict[str, Any] | None
    metadata: dict[str, Any] | None
    budget: dict[str, Any] | None
    model: str | None
    thinking: dict[str, Any] | None
    output_schema: dict[str, Any] | None
    prompt_mode: str | None
    compact: bool | None
    paused: bool
    callback: str | None
    wait_for: Sequence[str | TurnHandle] | None
    root_turn_id: str | None
    task_queue: str | None
    output_limit: int


async def start(
    *,
    text: str,
    agent: str | None = None,
    conversation_id: str | None = None,
    principal: Any = None,
    context: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    budget: dict[str, Any] | None = None,
    model: str | None = None,
    thinking: dict[str, Any] | None = _UNSET,
    output_schema: dict[str, Any] | None = None,
    prompt_mode: str | None = None,
    compact: bool | None = None,
    paused: bool = False,
    callback: str | None = None,
    wait_for: Sequence[str | TurnHandle] | None = None,
    root_turn_id: str | None = None,
    task_queue: str | None = None,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
) -> TurnHandle:
    """Submit a turn for ``text`` and return its handle once it is queued (or running); await ``handle.result()``.

    Without ``conversation_id`` the turn opens a new conversation bound to ``agent`` (its principal and context are
    the conversation's); with one, it is queued there behind the conversation's turns, FIFO (``agent`` then
    overrides the conversation's agent for this turn). The other options are ``Conversation.ask``'s: ``principal``
    (whom the turn acts for: tools and controls are authorised for it), ``context``, ``metadata`` (the message's),
    ``budget`` (limits for the turn's tree), ``model``, ``thinking``, ``output_schema``, ``prompt_mode``,
    ``compact``, ``paused`` (an approval gate until ``handle.resume()``), ``callback`` (a conversation id that
    receives the result), ``wait_for`` (turns whose results it waits for), ``root_turn_id`` (join that turn's tree
    and budgets). ``task_queue``: where the turn runs and its activities are scheduled (default: this workflow's
    queue, whose worker has ``TurnKitPlugin(store)``). ``output_limit``: bytes of output the result carries.

    Raises:
        InputError: Bad input (checked by the activity before anything is written; the workflow fails).
        AuthorizationError, ConfigError, RecordNotFound: A denied ``wait_for`` or ``callback``, an agent the worker
            does not know, a conversation that does not exist.
    """
    return await _start(
        AskTurn(
            caller_workflow_id="",
            caller_run_id="",
            turn_id="",
            message_id="",
            conversation_id=conversation_id or "",
            new_conversation=conversation_id is None,
            agent_name=agent,
            text=text,
            model=model,
            thinking=None if thinking is _UNSET else thinking,
            thinking_set=thinking is not _UNSET,
            output_schema=output_schema,
            prompt_mode=prompt_mode,
            context=context,
            principal=principal,
            message_metadata=metadata,
            callback_conversation_id=callback,
            wait_for=[t.turn_id if isinstance(t, TurnHandle) else t for t in wait_for or ()],
            paused=paused,
            compact=compact,
            budget=budget,
            root_turn_id=root_turn_id,
            task_queue=task_queue or "",
            output_limit=output_limit,
        )
    )


async def ask(*, text: str, **options: Unpack[AskOptions]) -> TurnResult:
    """Ask ``agent`` (a new conversation) or the conversation ``conversation_id``, and wait for the turn's result.

    :func:`start` then ``handle.result()``: the options are :func:`start`'s. Cancelling the workflow meanwhile cancels
    the turn.
    """
    handle = await start(text=text, **options)
    return await handle.result()


async def run(
    *,
    agent: str,
    task: str,
    input: Any = None,
    principal: Any = None,
    context: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    budget: dict[str, Any] | None = None,
    compact: bool | None = None,
    callback: str | None = None,
    root_turn_id: str | None = None,
    task_queue: str | None = None,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
) -> TurnResult:
    """Run ``task`` in a new conversation of ``agent`` and wait for its result, as ``Agent.run`` does.

    ``input`` is checked against the agent's ``input_schema`` (``InputError``, nothing written) and added to the task
    message as JSON; ``metadata`` is the new conversation's. The other options are :func:`start`'s.
    """
    request = AskTurn(
        caller_workflow_id="",
        caller_run_id="",
        turn_id="",
        message_id="",
        conversation_id="",
        new_conversation=True,
        agent_name=agent,
        text=task,
        task=True,
        task_input=input,
        context=context,
        principal=principal,
        conversation_metadata=metadata,
        callback_conversation_id=callback,
        compact=compact,
        budget=budget,
        root_turn_id=root_turn_id,
        task_queue=task_queue or "",
        output_limit=output_limit,
    )
    return await (await _start(request)).result()


def get_handle(
    turn_id: str,
    conversation_id: str,
    *,
    task_queue: str | None = None,
    principal: Any = None,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
) -> TurnHandle:
    """A handle on a turn this workflow asked earlier, e.g. in the run before a continue-as-new (the turn's end
    signals the workflow id, whichever run holds it). Its :meth:`~TurnHandle.result` first asks the store."""
    handle = TurnHandle(
        turn_id,
        conversation_id,
        task_queue=task_queue or workflow.info().task_queue,
        principal=principal,
        output_limit=output_limit,
    )
    _asks().open[turn_id] = handle
    return handle


async def _start(request: AskTurn) -> TurnHandle:
    """Fill in the ids and the caller, check what the workflow can check, submit; see :func:`start`."""
    _asks()
    info = workflow.info()
    if len(info.workflow_id) > MAX_CALLER_WORKFLOW_ID:
        raise errors.InputError(
            f"turnkit.workflow needs a workflow id of at most {MAX_CALLER_WORKFLOW_ID} characters (a turn's end "
            f"signals its waiter by id, and the store keeps it in a column that size); this one has "
            f"{len(info.workflow_id)}"
        )
    if request.new_conversation and not request.agent_name:
        raise errors.InputError("agent is required for a new conversation (or give conversation_id)")
    if isinstance(request.output_limit, bool) or request.output_limit < 0:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise errors.InputError(f"output_limit must be a non-negative number of bytes, not {request.output_limit!r}")
    request = request.model_copy(
        update={
            "caller_workflow_id": info.workflow_id,
            "caller_run_id": info.run_id,
            "turn_id": _new_id("turn"),
            "message_id": _new_id("msg"),
            "conversation_id": request.conversation_id or _new_id("conv"),
            "task_queue": request.task_queue or info.task_queue,
        }
    )
    submission = asyncio.ensure_future(
        _activity(AskCalls.ask, request, task_queue=request.task_queue, summary=f"ask {request.agent_name or 'agent'}")
    )
    try:
        receipt: AskReceipt = await asyncio.shield(submission)
    except BaseException as err:
        if not is_cancelled_exception(err):
            raise
        # Cancelled while the turn is being submitted: the submission is let finish (it may have written the turn),
        # then the turn is cancelled with the workflow.
        try:
            receipt = await submission
        except Exception:
            raise err from None  # nothing was submitted
        await _cancel_with_caller(_handle(request, receipt))
        raise
    return _handle(request, receipt)


def _handle(request: AskTurn, receipt: AskReceipt) -> TurnHandle:
    handle = TurnHandle(
        receipt.turn_id,
        receipt.conversation_id,
        task_queue=request.task_queue,
        principal=request.principal,
        output_limit=request.output_limit,
        result=receipt.result,
        waiting=True,
    )
    if receipt.result is None:
        _asks().open[handle.turn_id] = handle
    return handle


async def _cancel_with_caller(handle: TurnHandle) -> None:
    """The workflow is being cancelled while its turn runs: cancel the turn with it. A failure is logged, not raised:
    the workflow's cancellation goes on either way."""
    _asks().open.pop(handle.turn_id, None)
    try:
        await handle.cancel(descendants="cascade")  # the whole tree goes with the workflow that asked for it
    except Exception as err:  # a denial, say: the turn then ends on its own
        workflow.logger.warning("could not cancel turn %s with its workflow: %s", handle.turn_id, err)


class CancelAskedTurns(Interceptor):
    """When a workflow's run ends cancelled, cancel the turns it asked and did not see end, also those it started and
    was not awaiting (Temporal cancels only the workflow's main task). ``TurnKitPlugin`` registers it on every worker
    that runs workflows; a run that asked nothing is not touched."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        return _CancelAskedTurnsInbound


class _CancelAskedTurnsInbound(WorkflowInboundInterceptor):
    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        try:
            return await super().execute_workflow(input)
        except BaseException as err:
            # A run dropped from the worker's cache is closed with GeneratorExit and no loop running: it did not end,
            # so its turns go on (the run resumes from history elsewhere) and there is nothing to look up.
            if isinstance(err, GeneratorExit) or not is_cancelled_exception(err):
                raise
            asks = _RUNS.get(asyncio.get_running_loop())
            if asks is not None and asks.open:
                await asyncio.gather(*(_cancel_with_caller(handle) for handle in list(asks.open.values())))
            raise
