"""Live delivery of what a model call streams (text and thinking deltas, restarts) from the worker that makes the call
to the clients that watch its turn: the transport under ``Turn.stream()`` and ``Conversation.stream()``.

Nothing here is a record. A live message is an observation sent while the call runs; the store keeps what was
committed (the model's response, written once per request id), and a watcher that misses live messages still gets
every committed event from the store. Delivery is best effort: a publish that fails is logged and dropped, never
failing or slowing the model call beyond one round trip per batch.

Each message names its turn, its conversation, its model call (the request id), the activity attempt and a sequence
number within that attempt, so a consumer can tell a retried call's text from the earlier attempt's (``restart``).

Two transports, one per kind of store (:func:`transport_for`):

* **PostgreSQL**: ``NOTIFY`` through the database, so a client in any process sees a worker's deltas. One channel per
  conversation (``turnkit_live_`` + a hash of its id), and a sub-agent's messages also on its root turn's tree channel
  (:func:`tree_key`); a batch of messages is one ``SELECT pg_notify(...)`` statement (one round trip, in
  autocommit); every payload stays under PostgreSQL's 8000-byte limit (:data:`TEXT_CHUNK`: long deltas are split).
  Only channels that some process watches are sent to: watchers announce themselves on a presence channel
  (:class:`PostgresTransport`), so a turn nobody watches costs no NOTIFY. A process listens on one connection of the
  store's pool (asyncpg's public ``add_listener``), shared by all its subscriptions and its presence, held while it
  subscribes or publishes, and closed when the store closes. PostgreSQL delivers the notifications of different
  transactions in commit order, which :meth:`Subscription.barrier` uses: once the client's own notification comes
  back, everything committed before it has arrived.
* **SQLite** (the embedded default) and any other store: in-process fan-out only. A worker and a client in the same
  process (``make demo``, ``turnkit ask`` with its in-process worker, the tests) see each other's messages; a client
  in another process sees none, and gets the committed events by polling the store (``cross_process`` is False).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import uuid
import weakref
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, cast

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from turnkit.store.store import Store

if TYPE_CHECKING:
    # Only for annotations: asyncpg is the `postgres` extra's, and a SQLite store must import without it.
    import asyncpg

__all__ = [
    "CHANNEL_PREFIX",
    "TEXT_CHUNK",
    "LiveMessage",
    "LocalTransport",
    "PostgresTransport",
    "Subscription",
    "Transport",
    "channel_of",
    "chunked",
    "transport_for",
    "tree_key",
]

logger: Final = logging.getLogger("turnkit.live")

#: Channel names: this prefix and 40 hex digits of the conversation id's SHA-256 (PostgreSQL identifiers are limited to
#: 63 bytes, and a conversation id may be any application string).
CHANNEL_PREFIX: Final = "turnkit_live_"
#: The longest text of one message, in characters. Payloads are JSON with ASCII escapes, where a character takes at
#: most 12 bytes (a surrogate pair): 500 of them and the envelope stay under PostgreSQL's 8000-byte payload limit.
TEXT_CHUNK: Final = 500
#: Messages a subscription holds for a consumer that does not read; past it, new ones are dropped (and counted).
QUEUE_LIMIT: Final = 10_000

LiveKind = Literal["text", "thinking", "restart", "committed", "barrier"]


@dataclass(frozen=True)
class LiveMessage:
    """One live message: a delta of a model call's text or thinking, a ``restart`` (a retried attempt begins: drop
    what earlier attempts of the call streamed), ``committed`` (the call's response is in the store: read it now) or
    a ``barrier`` (see :meth:`Subscription.barrier`)."""

    kind: LiveKind
    conversation_id: str
    turn_id: str = ""
    call_id: str = ""
    """The model call's request id."""
    attempt: int = 1
    seq: int = 0
    """Position within the attempt, from 0."""
    text: str = ""
    root_turn_id: str = ""
    """Set for a sub-agent's turn: its root turn, whose tree channel (:func:`tree_key`) carries the message too, so
    a root turn's stream hears its sub-agents from their first word."""

    def channels(self) -> list[str]:
        """The channels the message goes to: its conversation's, and its root turn's tree channel if it has one."""
        own = [channel_of(self.conversation_id)]
        return [*own, channel_of(tree_key(self.root_turn_id))] if self.root_turn_id else own

    def payload(self) -> str:
        """The message as a NOTIFY payload (ASCII JSON)."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def parse(cls, payload: str) -> LiveMessage | None:
        """A payload read back; None for one that is not a live message (logged)."""
        try:
            data = json.loads(payload)
            return cls(**data)
        except (TypeError, ValueError) as err:
            logger.warning("ignored a live message that does not parse: %s", err)
            return None


def channel_of(conversation_id: str) -> str:
    """The channel of a conversation's live messages."""
    return CHANNEL_PREFIX + hashlib.sha256(conversation_id.encode()).hexdigest()[:40]


def tree_key(root_turn_id: str) -> str:
    """What to subscribe to (in place of a conversation id) for the live messages of a root turn's sub-agents."""
    return f"tree:{root_turn_id}"


def chunked(message: LiveMessage) -> list[LiveMessage]:
    """``message`` split into messages of at most :data:`TEXT_CHUNK` characters of text (the same ``seq``: the
    publisher numbers them after splitting)."""
    if len(message.text) <= TEXT_CHUNK:
        return [message]
    return [replace(message, text=message.text[i : i + TEXT_CHUNK]) for i in range(0, len(message.text), TEXT_CHUNK)]


class Transport(Protocol):
    """Where live messages go: :class:`PostgresTransport` or :class:`LocalTransport`."""

    cross_process: bool
    """Whether a subscriber in another process receives what this process publishes."""

    async def publish(self, messages: Sequence[LiveMessage]) -> int:
        """Send ``messages``, in order, to their channels that someone watches; the number sent (raises on failure;
        callers log and drop)."""
        ...

    async def subscribe(self, conversation_ids: Iterable[str]) -> Subscription:
        """Start receiving the messages of these conversations (close the subscription when done)."""
        ...

    def subscribed(self, conversation_id: str) -> bool:
        """Whether a subscription of this process receives ``conversation_id``'s messages now."""
        ...

    async def listen(self, subscription: Subscription, channels: Iterable[str]) -> None:
        """Deliver these channels' messages to ``subscription`` too (called by :meth:`Subscription.add`)."""
        ...

    async def unsubscribe(self, subscription: Subscription, channels: Iterable[str]) -> None:
        """Stop delivering these channels' messages to ``subscription`` (called by :meth:`Subscription.close`)."""
        ...


class Subscription:
    """Messages of some conversations, as they arrive; iterate it, :meth:`add` conversations, :meth:`close` it."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.channels: set[str] = set()
        self.dropped = 0
        """Messages dropped because the consumer fell :data:`QUEUE_LIMIT` behind."""
        self.lost = False
        """True once the transport stopped delivering (the listener's connection ended): only the store remains."""
        self._queue: deque[LiveMessage] = deque()
        self._arrived = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._barriers: dict[str, asyncio.Future[None]] = {}
        self._closed = False

    def deliver(self, message: LiveMessage) -> None:
        """Hand ``message`` to the consumer (from any thread)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._put(message)
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._put, message)

    def _put(self, message: LiveMessage) -> None:
        if message.kind == "barrier":
            waiter = self._barriers.pop(message.text, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            return
        if len(self._queue) >= QUEUE_LIMIT:
            self.dropped += 1
            return
        self._queue.append(message)
        self._arrived.set()

    def end(self) -> None:
        """The transport will deliver nothing more (the iteration ends after what is queued)."""
        self.lost = True
        self._loop.call_soon_threadsafe(self._arrived.set)

    def put_back(self, messages: Sequence[LiveMessage]) -> None:
        """Return ``messages`` to the front of the queue, in their order (read, but meant for a later reader)."""
        self._queue.extendleft(reversed(messages))
        if messages:
            self._arrived.set()

    async def add(self, conversation_ids: Iterable[str]) -> None:
        """Receive the messages of these conversations too."""
        new = {channel_of(each) for each in conversation_ids} - self.channels
        if new and not self._closed and not self.lost:
            self.channels |= new
            try:
                await self.transport.listen(self, new)
            except Exception as err:  # no listener (the database away): the stream goes on with committed events
                logger.warning("live deltas unavailable, committed events only: %s", err)
                self.lost = True

    async def get(self, timeout: float | None = None) -> LiveMessage | None:
        """The next message; None after ``timeout`` seconds without one, or at once when the transport ended."""
        if await self.wait(timeout):
            return self._queue.popleft()
        return None

    async def wait(self, timeout: float | None = None) -> bool:
        """Whether a message is queued, waiting up to ``timeout`` seconds for one (None: until one comes, or False
        at once when the transport ended)."""
        if not self._queue and self.lost:
            if timeout is not None:
                await asyncio.sleep(timeout)  # nothing will come: the caller's poll goes on at its pace
            return bool(self._queue)
        if not self._queue and timeout != 0:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout)
        return bool(self._queue)

    async def barrier(self, conversation_id: str, timeout: float = 2.0) -> bool:
        """Wait until every message committed before now on ``conversation_id``'s channel has been queued here; False
        when that could not be confirmed within ``timeout`` seconds."""
        if not self.transport.cross_process:
            return True  # in-process delivery is synchronous with the publish
        if self.lost:
            return False  # nothing comes back through a listener that is gone
        token = uuid.uuid4().hex
        waiter = self._loop.create_future()
        self._barriers[token] = waiter
        try:
            await self.transport.publish([LiveMessage("barrier", conversation_id, text=token)])
            await asyncio.wait_for(waiter, timeout)
            return True
        except Exception as err:  # a lost listener or a store away: the caller goes on without the guarantee
            logger.debug("live barrier not confirmed: %s", err)
            return False
        finally:
            self._barriers.pop(token, None)

    def __aiter__(self) -> AsyncIterator[LiveMessage]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[LiveMessage]:
        while (message := await self.get()) is not None:
            yield message

    async def close(self) -> None:
        """Stop receiving (idempotent)."""
        if self._closed:
            return
        self._closed = True
        await self.transport.unsubscribe(self, self.channels)


class _Subscribers:
    """What both transports keep: this process's subscriptions by channel, and their fan-out."""

    def __init__(self) -> None:
        self._subscribers: dict[str, set[Subscription]] = {}

    def subscribed(self, conversation_id: str) -> bool:
        """See :meth:`Transport.subscribed`."""
        return bool(self._subscribers.get(channel_of(conversation_id)))

    async def subscribe(self, conversation_ids: Iterable[str]) -> Subscription:
        """A subscription to these conversations' messages (from this process, or from every process when the
        transport is ``cross_process``)."""
        subscription = Subscription(cast("Transport", self))
        await subscription.add(conversation_ids)
        return subscription

    def _deliver(self, channel: str, message: LiveMessage) -> None:
        for subscription in tuple(self._subscribers.get(channel, ())):
            subscription.deliver(message)


class LocalTransport(_Subscribers):
    """In-process fan-out (the SQLite store): a publish hands each message to this process's subscriptions."""

    cross_process = False

    async def publish(self, messages: Sequence[LiveMessage]) -> int:
        """Queue each message for this process's subscribers of its conversation (all count as sent: handing one to
        no subscriber costs nothing)."""
        for message in messages:
            for channel in message.channels():
                self._deliver(channel, message)
        return len(messages)

    async def listen(self, subscription: Subscription, channels: Iterable[str]) -> None:
        """See :meth:`Transport.listen`."""
        for channel in channels:
            self._subscribers.setdefault(channel, set()).add(subscription)

    async def unsubscribe(self, subscription: Subscription, channels: Iterable[str]) -> None:
        """See :meth:`Transport.unsubscribe`."""
        for channel in channels:
            listeners = self._subscribers.get(channel)
            if listeners is not None:
                listeners.discard(subscription)
                if not listeners:
                    del self._subscribers[channel]


_NOTIFY: Final = text(
    "SELECT pg_notify(c, p) FROM unnest(CAST(:channels AS text[]), CAST(:payloads AS text[])) WITH ORDINALITY "
    "AS m(c, p, n) ORDER BY n"
)

#: The channel of presence: watchers announce the channels they listen to, publishers ask who watches.
PRESENCE_CHANNEL: Final = CHANNEL_PREFIX + "presence"
#: Seconds between a watcher's announcements of what it watches (a publisher that missed one hears the next).
PRESENCE_INTERVAL: Final = 10.0
#: Seconds a publisher believes an announcement: a watcher that ended without saying so (a killed process) stops
#: costing NOTIFYs after this.
PRESENCE_TTL: Final = 3 * PRESENCE_INTERVAL
#: Seconds after a process begins to publish during which it publishes everything: the watchers' answers to its roll
#: call are on their way (a few milliseconds on one network; this leaves room for a loaded machine).
PRESENCE_WARMUP: Final = 2.0
#: Watched channels a publisher keeps before it forgets the expired ones (checked as announcements arrive).
_WATCHED_PRUNE_AT: Final = 10_000
#: Channels per presence announcement: 100 names of 53 bytes keep a payload under PostgreSQL's 8000-byte limit.
_CHANNELS_PER_ANNOUNCEMENT: Final = 100


class PostgresTransport(_Subscribers):
    """``NOTIFY``/``LISTEN`` through the store's PostgreSQL database (see the module docstring).

    **Only what someone watches is sent.** A NOTIFY costs a round trip and the server's work whether or not anyone
    listens, and most turns are watched by nobody. So a process that subscribes announces the channels it listens to
    on :data:`PRESENCE_CHANNEL` (again every :data:`PRESENCE_INTERVAL` seconds, and when asked), and says when it
    stops; a process that publishes listens there from its first publish on, asks who watches (a roll call), and
    sends a message only to channels some process announced within :data:`PRESENCE_TTL` seconds, or that a
    subscription of its own receives. Until it hears presence (its first :data:`PRESENCE_WARMUP` seconds, or after
    its listener's connection was lost) it sends everything, as it would with no presence at all. A watcher that
    subscribes while a call runs gets that call's deltas from its announcement on: the deltas before it were never
    promised (the committed events come from the store).
    """

    cross_process = True

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        # Autocommit: each batch of notifications is sent at once, with no BEGIN and COMMIT around it.
        self._engine = store.engine.execution_options(isolation_level="AUTOCOMMIT")
        self._lock = asyncio.Lock()  # LISTEN and UNLISTEN run one at a time on the listener's connection
        self._connection: AsyncConnection | None = None
        self._driver: asyncpg.Connection | None = None
        self.watcher_id = uuid.uuid4().hex
        """This transport's name in its presence announcements."""
        self.warmup = PRESENCE_WARMUP
        """Seconds after the first publish during which everything is sent (see :data:`PRESENCE_WARMUP`)."""
        self.skipped = 0
        """Messages not sent because no process watched their channels."""
        self._publishing = False  # this process publishes: keep hearing presence while it lives
        self._hearing_since: float | None = None  # when the listener began to hear presence for publishing
        self._watched: dict[str, dict[str, float]] = {}  # channel -> watcher id -> when its announcement expires
        self._announcing: asyncio.Task[None] | None = None  # a watcher's periodic announcements
        self._tasks: set[asyncio.Task[None]] = set()  # answers to roll calls and closings, in flight
        store.on_close(self.close)

    async def publish(self, messages: Sequence[LiveMessage]) -> int:
        """Send each of ``messages`` to the channels of its that someone watches, all in one statement (they arrive
        in this order); the number of messages sent."""
        if not messages:
            return 0
        if not self._publishing and not all(self._subscribers.get(c) for m in messages for c in m.channels()):
            await self._hear_presence()  # not for a subscription's own barrier: a watcher is no publisher
        pairs: list[tuple[str, str]] = []
        sent = 0
        for message in messages:
            channels = [channel for channel in message.channels() if self._watching(channel)]
            if channels:
                payload = message.payload()
                pairs.extend((channel, payload) for channel in channels)
                sent += 1
        self.skipped += len(messages) - sent
        if pairs:
            await self._notify(pairs)
        return sent

    def watched(self, conversation_id: str) -> bool:
        """Whether this process would send ``conversation_id``'s messages now: a subscription of its own receives
        them, some process announced it watches them, or this process does not hear presence (yet)."""
        return self._watching(channel_of(conversation_id))

    async def _notify(self, pairs: Sequence[tuple[str, str]]) -> None:
        async with self._engine.connect() as connection:
            await connection.execute(_NOTIFY, {"channels": [c for c, _ in pairs], "payloads": [p for _, p in pairs]})

    def _watching(self, channel: str) -> bool:
        if self._subscribers.get(channel):
            return True
        loop = asyncio.get_running_loop()
        if self._hearing_since is None or loop.time() - self._hearing_since < self.warmup:
            return True  # presence unknown: send, as without presence
        return self._unexpired(channel, loop.time())

    def _unexpired(self, channel: str, now: float) -> bool:
        """Drop ``channel``'s watchers whose announcement expired by ``now`` (the channel too, if none is left);
        whether any is left."""
        watchers = {w: expires for w, expires in self._watched.get(channel, {}).items() if expires > now}
        if watchers:
            self._watched[channel] = watchers
        else:
            self._watched.pop(channel, None)
        return bool(watchers)

    async def _hear_presence(self) -> None:
        """Begin to publish: listen for presence and ask who watches (after a failure everything is sent, and the next
        publish tries again)."""
        async with self._lock:
            if self._publishing:
                return
            self._publishing = True
            try:
                await self._listener()
                self._hearing_since = asyncio.get_running_loop().time()
                await self._notify([(PRESENCE_CHANNEL, json.dumps({"op": "roll"}))])
            except Exception as err:  # meanwhile everything is sent; the next publish tries again
                self._publishing = False
                logger.warning("live presence unavailable, every live message is sent: %s", err)

    async def listen(self, subscription: Subscription, channels: Iterable[str]) -> None:
        """See :meth:`Transport.listen`; announces the channels new to this process."""
        async with self._lock:
            driver = await self._listener()
            new: list[str] = []
            for channel in channels:
                listeners = self._subscribers.setdefault(channel, set())
                if not listeners:
                    await driver.add_listener(channel, self._received)
                    new.append(channel)
                listeners.add(subscription)
            if new:
                try:
                    await self._announce("watch", new)
                except Exception as err:  # the periodic announcement tries again; deltas may be missed until then
                    logger.warning("live presence not announced: %s", err)
            if self._announcing is None or self._announcing.done():
                self._announcing = asyncio.create_task(self._announce_periodically(), name="turnkit-live-presence")

    async def unsubscribe(self, subscription: Subscription, channels: Iterable[str]) -> None:
        """See :meth:`Transport.unsubscribe`; announces the channels this process no longer watches."""
        async with self._lock:
            gone: list[str] = []
            for channel in channels:
                listeners = self._subscribers.get(channel)
                if listeners is None:
                    continue
                listeners.discard(subscription)
                if not listeners:
                    del self._subscribers[channel]
                    gone.append(channel)
                    if self._driver is not None and not self._driver.is_closed():
                        try:
                            await self._driver.remove_listener(channel, self._received)
                        except Exception as err:  # the connection is going anyway
                            logger.debug("UNLISTEN failed: %s", err)
            if gone:
                try:
                    await self._announce("unwatch", gone)
                except Exception as err:  # publishers forget it after PRESENCE_TTL
                    logger.debug("live presence: unwatch not announced: %s", err)
            if not self._subscribers:
                self._stop_announcing()
                if not self._publishing:
                    await self._release()

    async def close(self) -> None:
        """Stop publishing and listening, and give the listener's connection back (the store's :meth:`~Store.close`
        calls it)."""
        if self._driver is None and self._announcing is None and not self._tasks:
            self._publishing = False
            return  # nothing held (and the lock may belong to an event loop that is gone)
        async with self._lock:
            self._publishing = False
            self._stop_announcing()
            for task in self._tasks:
                task.cancel()
            await self._release()

    async def _announce(self, op: Literal["watch", "unwatch"], channels: Sequence[str]) -> None:
        step = _CHANNELS_PER_ANNOUNCEMENT
        parts = [list(channels[i : i + step]) for i in range(0, len(channels), step)]
        notice = {"op": op, "watcher": self.watcher_id, "ttl": PRESENCE_TTL}
        await self._notify([(PRESENCE_CHANNEL, json.dumps({**notice, "channels": part})) for part in parts])

    async def _announce_periodically(self) -> None:
        while self._subscribers:
            await asyncio.sleep(PRESENCE_INTERVAL)
            await self._answer_roll_call()

    async def _answer_roll_call(self) -> None:
        channels = list(self._subscribers)
        if channels:
            try:
                await self._announce("watch", channels)
            except Exception as err:  # the next announcement may get through
                logger.debug("live presence not announced: %s", err)

    def _stop_announcing(self) -> None:
        task, self._announcing = self._announcing, None
        if task is not None:
            task.cancel()

    async def _listener(self) -> asyncpg.Connection:
        """The process's listening connection: one of the store's pool, held while anyone subscribes or this process
        publishes; it hears presence from the start."""
        if self._driver is not None and not self._driver.is_closed():
            return self._driver
        connection = await self._engine.connect()
        try:
            raw = await connection.get_raw_connection()
            driver = cast("asyncpg.Connection", raw.driver_connection)
            await driver.add_listener(PRESENCE_CHANNEL, self._presence)
        except BaseException:
            # Never left to the garbage collector: a connection that failed here goes back closed (an outage).
            await self._discard(connection)
            raise
        driver.add_termination_listener(self._terminated)
        self._connection, self._driver = connection, driver
        return driver

    async def _release(self) -> None:
        connection, driver = self._connection, self._driver
        self._connection, self._driver = None, None
        self._hearing_since = None
        self._watched.clear()
        if driver is not None:
            driver.remove_termination_listener(self._terminated)
        if connection is not None:
            # Closed, not returned: a pooled connection must not keep LISTEN state for its next user.
            await connection.invalidate()
            await connection.close()

    def _received(self, _connection: object, _pid: int, channel: str, payload: str) -> None:
        message = LiveMessage.parse(payload)
        if message is not None:
            self._deliver(channel, message)

    def _presence(self, _connection: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            notice = json.loads(payload)
            op = notice["op"]
            if op == "roll":
                if self._subscribers:
                    self._spawn(self._answer_roll_call())
                return
            watcher, channels = str(notice["watcher"]), [str(c) for c in notice["channels"]]
            expires = asyncio.get_running_loop().time() + float(notice.get("ttl", PRESENCE_TTL))
        except (KeyError, TypeError, ValueError) as err:
            logger.warning("ignored a live presence notice that does not parse: %s", err)
            return
        if op == "watch" and len(self._watched) > _WATCHED_PRUNE_AT:
            self._forget_expired()  # watchers that ended without an unwatch, on channels nobody published to since
        for channel in channels:
            if op == "watch":
                self._watched.setdefault(channel, {})[watcher] = expires
            elif (watchers := self._watched.get(channel)) is not None:
                watchers.pop(watcher, None)
                if not watchers:
                    del self._watched[channel]

    @staticmethod
    async def _discard(connection: AsyncConnection) -> None:
        with contextlib.suppress(Exception):  # the connection is gone already; only the pool's record is left
            await connection.invalidate()
            await connection.close()

    def _forget_expired(self) -> None:
        now = asyncio.get_running_loop().time()
        for channel in list(self._watched):
            self._unexpired(channel, now)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background, held until it ends (and cancelled by :meth:`close`)."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _terminated(self, _connection: object) -> None:
        # The listener's connection ended (a restart, a network cut): its subscriptions get nothing more live, and
        # presence is unknown until a publish listens again (everything is sent meanwhile).
        logger.warning("the live listener's PostgreSQL connection ended: live deltas stop, committed events go on")
        subscribers, self._subscribers = self._subscribers, {}
        connection, self._connection, self._driver = self._connection, None, None
        if connection is not None:  # given back to the pool as closed, not left to the garbage collector
            self._spawn(self._discard(connection))
        self._hearing_since = None
        self._watched.clear()
        self._publishing = False
        self._stop_announcing()
        for subscription in {s for group in subscribers.values() for s in group}:
            subscription.end()


_postgres: weakref.WeakKeyDictionary[Store, PostgresTransport] = weakref.WeakKeyDictionary()
_local: dict[str, LocalTransport] = {}


def transport_for(store: Store) -> Transport:
    """The live transport of ``store``: PostgreSQL's ``NOTIFY`` (one per store object), else the process's in-process
    fan-out for that database (shared by every store object on the same URL, so a worker and a client of one process
    meet whichever object each holds)."""
    if store.dialect == "postgresql":
        found = _postgres.get(store)
        if found is None:
            found = _postgres[store] = PostgresTransport(store)
        return found
    key = store.engine.url.render_as_string(hide_password=True)
    local = _local.get(key)
    if local is None:
        local = _local[key] = LocalTransport()
    return local
