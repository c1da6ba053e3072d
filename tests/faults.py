"""Real faults for the durability tests: a private PostgreSQL cluster that a test stops and starts, and a Temporal
dev server that a test restarts on its database file (or starts with low history limits).

Never the machine's shared PostgreSQL: :class:`PrivateCluster` runs ``initdb`` into a temporary directory and
``pg_ctl`` on a free port with the server binaries of the installed PostgreSQL (``/usr/lib/postgresql/*/bin``).
PostgreSQL refuses to run as root, so as root the binaries run as the ``postgres`` user.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client

from turnkit._temporal.devserver import die_with_parent, fast_task_loading_args
from turnkit._temporal.search_attributes import dev_server_flags
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import temporal_binary

__all__ = [
    "DevServer",
    "PrivateCluster",
    "dev_server",
    "free_port",
    "postgres_binaries",
    "private_cluster",
]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, below the kernel's ephemeral range.

    Why not ``bind(0)``: that hands out an ephemeral port, and connecting to an ephemeral port before its server
    listens can pair the connection with itself (TCP self-connect: the client's own source port is the one it
    dials), which then hangs in the gRPC handshake.
    """
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free TCP port found between 20000 and 32000")


def postgres_binaries() -> Path | None:
    """The directory holding ``initdb``/``pg_ctl`` of the newest installed PostgreSQL, or ``None``."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parent.parent.name))
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("pg_ctl")
    return Path(found).parent if found else None


@dataclass
class PrivateCluster:
    """A PostgreSQL cluster of the test's own: ``stop()`` is a real outage, ``start()`` the recovery."""

    bindir: Path
    root: Path
    port: int = field(default_factory=free_port)

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def admin_url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str = "postgres") -> str:
        """A SQLAlchemy async URL to ``database`` on this cluster."""
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if os.geteuid() == 0:  # PostgreSQL refuses root
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.datadir), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")

    def start(self) -> None:
        """Start (or restart after :meth:`stop`) the server and wait until it accepts connections."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run("pg_ctl", "-D", str(self.datadir), "-o", options, "-l", str(self.root / "log"), "-w", "start")

    def stop(self) -> None:
        """Stop the server at once (``-m immediate``: open connections break as in a real outage)."""
        self._run("pg_ctl", "-D", str(self.datadir), "-m", "immediate", "-w", "stop")

    def running(self) -> bool:
        with socket.socket() as sock:
            sock.settimeout(0.2)
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            if self.running():
                self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def private_cluster() -> Iterator[PrivateCluster]:
    """A started private cluster, destroyed afterwards. Raises ``RuntimeError`` when no server binaries exist."""
    bindir = postgres_binaries()
    if bindir is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    cluster = PrivateCluster(bindir=bindir, root=Path(tempfile.mkdtemp(prefix="turnkit-pg-")))
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@dataclass
class DevServer:
    """A ``temporal server start-dev`` process of the test's own, with its state in a database file, so that a
    restart keeps every workflow (``restart()``); ``extra`` passes more flags (``--dynamic-config-value ...``).
    TurnKit's search attributes are registered unless ``search_attributes`` is False (a namespace without them)."""

    root: Path
    extra: list[str] = field(default_factory=list[str])
    search_attributes: bool = True
    port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                temporal_binary(),
                "server",
                "start-dev",
                "--ip",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--ui-port",
                str(self.ui_port),
                "--headless",
                "--db-filename",
                str(self.root / "temporal.db"),
                "--log-level",
                "error",
                *fast_task_loading_args(),
                *(dev_server_flags() if self.search_attributes else []),
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent(),  # a killed test run leaves no server behind
        )
        await self.wait_ready()

    async def wait_ready(self, timeout: float = 60.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                # Each attempt is bounded: a connection the server accepted but does not answer must not hang here.
                await asyncio.wait_for(self._ping(), 5)
                return
            except Exception:
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(f"dev server exited with {self.process.returncode}") from None
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.1)

    async def _ping(self) -> None:
        client = await Client.connect(self.address)
        await client.workflow_service.get_system_info(GetSystemInfoRequest())

    def stop(self) -> None:
        """SIGKILL the server (a crash: whatever it had committed to its database file survives)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self.process = None

    async def restart(self) -> None:
        self.stop()
        await self.start()

    async def client(self, plugins: list[TurnKitPlugin] | None = None) -> Client:
        return await Client.connect(self.address, plugins=list(plugins or []))


@contextlib.asynccontextmanager
async def dev_server(*extra: str, search_attributes: bool = True) -> AsyncIterator[DevServer]:
    """A private dev server on a database file in a temporary directory, killed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="turnkit-temporal-"))
    server = DevServer(root=root, extra=list(extra), search_attributes=search_attributes)
    try:
        await server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)
