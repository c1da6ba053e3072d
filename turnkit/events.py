"""Lifecycle events (behaviour §3.11), delivered to ``settings.on_event`` after the corresponding store write committed.

A write's events are registered inside its transaction with :func:`announce` (or :func:`announce_message`) and sent
by :meth:`~turnkit.store.store.Store.atomic` once it committed: a rolled-back write announces nothing, and an attempt
that finds the write already committed (a retry) writes nothing and so announces nothing again. Events with no write
behind them (``turn.started`` after the claim, ``model.requested``) are sent with :func:`emit` directly.

Where an event goes (behaviour §3.11): to the turn's own callback if one is registered in this process
(``ask(on_event=...)``, :func:`register_turn_callback`), else, for a sub-agent's turn, to its parent agent's effective
callback (the parent agent's ``on_event``, else ``settings.on_event``), else to its agent's ``on_event``, else to
``settings.on_event``: one of them, never several. ``tool_call.interrupted`` goes to ``settings.on_event`` only. A
turn's agent and parent are read from the store once per process and cached (only when some agent has ``on_event``).

Callbacks run in the worker process that emits the event: a per-turn callback reaches that turn's events when the
turn runs in the process that registered it (a worker in the same process); a turn run by a remote worker reaches the
callbacks registered there (agent-level or global). See docs/design.md "Events".

Events are observations, not durable records: a worker that dies between a commit and its callbacks loses those
events, and the retried attempt does not repeat them. Each callback (sync, or ``async def``) is awaited in turn, so one
emitter's events arrive in order; a sync callback runs in a thread (:mod:`turnkit._engine.callbacks`), never on the
worker's event loop. A callback that raises is logged and ignored: the write it reports has committed, so failing
(and retrying) the activity would only repeat work (this differs from the gem, where the exception propagates).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Generator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from turnkit._engine.callbacks import call_application, require_no_transaction
from turnkit.agent import Agent, registered_agents
from turnkit.config import EventCallback, settings
from turnkit.kernel.errors import InputError, RecordNotFound
from turnkit.kernel.records import MessageRecord
from turnkit.store.store import Store, StoreTx, utcnow

__all__ = [
    "Event",
    "announce",
    "announce_message",
    "check_on_event",
    "client_event",
    "client_events_for",
    "emit",
    "listening",
    "logger",
    "register_turn_callback",
    "unregister_turn_callback",
]

logger: Final = logging.getLogger("turnkit.events")

Callbacks = EventCallback | list[EventCallback] | tuple[EventCallback, ...]

#: Sent only to ``settings.on_event`` (behaviour §3.11: reconciliation's events).
_GLOBAL_ONLY: Final = frozenset({"tool_call.interrupted", "turn.stale"})
#: A turn's last event: its per-turn callback is dropped once it was sent.
_LAST: Final = frozenset({"turn.completed", "turn.failed"})
#: Bound on the per-process tables below (a turn cancelled or run elsewhere never sends its last event here).
_MAX_ENTRIES: Final = 10_000

_turn_callbacks: OrderedDict[str, Callbacks] = OrderedDict()
_routes: OrderedDict[str, tuple[str, str | None]] = OrderedDict()  # turn id -> (agent name, parent's agent name)


@dataclass(frozen=True)
class Event:
    """One lifecycle event: ``type`` such as ``model.completed``, the turn's ids, and a small payload."""

    type: str
    turn_id: str
    conversation_id: str
    payload: dict[str, Any] = field(default_factory=dict)
    created_at: datetime = field(default_factory=utcnow)


def check_on_event(value: Any) -> Callbacks | None:
    """``value`` as an ``on_event`` option: None, a callable or a list of callables.

    Raises:
        InputError: ``"on_event must be a callable or a list of callables"``.
    """
    if value is None or callable(value):
        return value
    if isinstance(value, list | tuple) and all(callable(each) for each in value):  # pyright: ignore[reportUnknownVariableType]
        return tuple(value)  # pyright: ignore[reportUnknownArgumentType]
    raise InputError("on_event must be a callable or a list of callables")


def register_turn_callback(turn_id: str, callback: Callbacks) -> None:
    """Send ``turn_id``'s events emitted in this process to ``callback`` instead of its agent's or the global one."""
    _turn_callbacks[turn_id] = callback
    while len(_turn_callbacks) > _MAX_ENTRIES:
        _turn_callbacks.popitem(last=False)


def unregister_turn_callback(turn_id: str) -> None:
    """Forget ``turn_id``'s per-turn callback (done by itself after the turn's last event)."""
    _turn_callbacks.pop(turn_id, None)


async def _route(store: Store, turn_id: str) -> tuple[str, str | None] | None:
    """``(agent name, parent turn's agent name)`` of a turn, read once (both are fixed when the turn is created)."""
    route = _routes.get(turn_id)
    if route is None:
        try:
            turn = await store.load_turn(turn_id)
            parent = None if turn.parent_turn_id is None else await store.load_turn(turn.parent_turn_id)
        except RecordNotFound:
            return None
        route = (turn.agent_name, None if parent is None else parent.agent_name)
        _routes[turn_id] = route
        while len(_routes) > _MAX_ENTRIES:
            _routes.popitem(last=False)
    return route


def _effective(agents: dict[str, Agent], name: str | None) -> Callbacks | None:
    """An agent's effective callback: its own ``on_event``, else ``settings.on_event`` (None if not registered)."""
    agent = None if name is None else agents.get(name)
    return None if agent is None else agent.effective_on_event


def listening(turn_id: str) -> bool:
    """Whether an event of ``turn_id`` may reach an application callback (global, the turn's own, an agent's)."""
    return settings.on_event is not None or turn_id in _turn_callbacks or _agent_callbacks()


def _agent_callbacks() -> bool:
    """Some registered agent has its own ``on_event``."""
    return any(agent.on_event is not None for agent in registered_agents().values())


async def _callbacks_for(type: str, turn_id: str, store: Store | None) -> Callbacks | None:
    """The callback(s) that receive this event (see the module docstring)."""
    if type in _GLOBAL_ONLY:
        return settings.on_event
    own = _turn_callbacks.get(turn_id)
    if own is not None:
        return own
    if store is None or not _agent_callbacks():
        return settings.on_event  # no agent-level callback anywhere: no need to know the turn's agent
    route = await _route(store, turn_id)
    if route is None:
        return settings.on_event
    agent_name, parent_agent_name = route
    agents = registered_agents()
    # A sub-agent's turn inherits its parent agent's effective callback (behaviour §4.3 build_child).
    return _effective(agents, parent_agent_name) or _effective(agents, agent_name) or settings.on_event


async def emit(type: str, turn_id: str, conversation_id: str, *, store: Store | None = None, **payload: Any) -> None:
    """Send an event to its callback(s) (see the module docstring), if any; call it after the commit.

    ``store`` lets an agent-level callback be found (the turn's agent is read from it); without it, only a per-turn
    or the global callback can receive the event.
    """
    callback = await _callbacks_for(type, turn_id, store)
    if type in _LAST:
        unregister_turn_callback(turn_id)
    if callback is None:
        return
    require_no_transaction()
    event = Event(type=type, turn_id=turn_id, conversation_id=conversation_id, payload=payload)
    callbacks = callback if isinstance(callback, list | tuple) else [callback]
    for each in callbacks:
        try:
            await call_application(each, event)
        except Exception as err:
            logger.warning("an on_event callback raised on %s for turn %s; ignored", type, turn_id, exc_info=err)


#: The turn whose model call runs in this task, for :func:`client_event`: (turn id, conversation id, store).
_calling_for: ContextVar[tuple[str, str, Store | None] | None] = ContextVar("turnkit_client_events", default=None)


@contextmanager
def client_events_for(turn_id: str, conversation_id: str, store: Store | None) -> Generator[None]:
    """Inside the block (a model client's call for this turn), :func:`client_event` reaches the turn's callbacks."""
    token = _calling_for.set((turn_id, conversation_id, store))
    try:
        yield
    finally:
        _calling_for.reset(token)


async def client_event(type: str, **payload: Any) -> None:
    """Emit an event from inside a model client's call (the gem's client ``on_event``, behaviour §3.6): it is sent
    with the turn's ids to the callback the turn's own events go to (the turn's, its agent's, else
    ``settings.on_event``; see the module docstring), after what the call has committed so far. A custom
    :class:`~turnkit.model.Client` calls it while it answers (say, ``await turnkit.client_event("cache.hit",
    key=...)``). Outside a turn's model call (a standalone ``turnkit.paint``, a test calling the client directly) it
    does nothing. Like every event, it is an observation, not a record: a retried call may send it again.

    Raises:
        InputError: ``type`` is not a non-empty string, or a payload value is not JSON-compatible.
    """
    if not isinstance(type, str) or not type.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
        raise InputError(f"an event type must be a non-empty string, not {type!r}")
    try:
        json.dumps(payload)
    except (TypeError, ValueError) as err:
        raise InputError(f"event {type} has a payload that is not JSON: {err}") from err
    target = _calling_for.get()
    if target is None:
        return
    turn_id, conversation_id, store = target
    await emit(type, turn_id, conversation_id, store=store, **payload)


def announce(tx: StoreTx, type: str, turn_id: str, conversation_id: str, **payload: Any) -> None:
    """Send an event once ``tx`` has committed (never if it rolls back); see the module docstring."""
    if settings.on_event is None and not _turn_callbacks and not _agent_callbacks():
        return  # nobody listens: nothing to send after the commit
    store = tx.store

    async def send() -> None:
        await emit(type, turn_id, conversation_id, store=store, **payload)

    tx.after_commit(send)


def announce_message(tx: StoreTx, message: MessageRecord) -> None:
    """``message.created {message_id, role, kind}`` for a turn's message just written in ``tx`` (behaviour §3.7)."""
    if message.turn_id is not None:
        announce(
            tx,
            "message.created",
            message.turn_id,
            message.conversation_id,
            message_id=message.id,
            role=message.role,
            kind=message.kind,
        )
