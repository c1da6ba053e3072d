"""Real worker processes for crash tests: start one, kill it with SIGKILL, start another.

Also the :func:`crash_dir` fixture (made visible to every test by ``tests/conftest.py``), where the worker apps'
traces go (``tests/crash_app.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

if TYPE_CHECKING:
    from tests.engine import Engine

ROOT = Path(__file__).resolve().parent.parent


@pytest_asyncio.fixture
async def crash_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Path]:
    """A directory for the worker apps' traces, named to them (and to worker processes started after) by
    ``$TURNKIT_CRASH_DIR``."""
    monkeypatch.setenv("TURNKIT_CRASH_DIR", str(tmp_path))
    yield tmp_path


class WorkerProcess:
    """``python worker.py --app <module>`` as a child process on the test's task queue and database."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.ready_line = ""
        self._stdout: list[bytes] = []  # what it printed up to its ready line
        self._readers: list[asyncio.Task[bytes]] = []

    @classmethod
    async def start(
        cls,
        *,
        app: str,
        address: str,
        task_queue: str,
        database_url: str,
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
        extra_args: tuple[str, ...] = (),
        stderr: bool = False,
        program: tuple[str, ...] = (str(ROOT / "worker.py"),),
    ) -> WorkerProcess:
        """Start the worker and wait for its ready line; ``extra_args`` go to ``worker.py`` (``--only tools``).
        With ``stderr``, everything it writes is kept for :meth:`output` (else its stderr is the test's).
        ``program``: Python's arguments that run a worker (``("-m", "turnkit.cli", "worker")``: ``turnkit worker``)."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *program,
            "--app",
            app,
            "--address",
            address,
            "--task-queue",
            task_queue,
            "--database-url",
            database_url,
            "--grace",
            "1",
            *extra_args,
            cwd=str(cwd),  # worker.py's own directory (ROOT) is on its import path, whatever the working directory
            env={**os.environ, "TURNKIT_LOG_LEVEL": "WARNING", **(env or {})},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE if stderr else None,
        )
        worker = cls(process)
        if stderr:
            assert process.stderr is not None
            worker._readers.append(asyncio.create_task(process.stderr.read()))  # drained as it comes: never blocks
        worker.ready_line = await worker._wait_ready()
        if stderr:
            assert process.stdout is not None
            worker._readers.append(asyncio.create_task(process.stdout.read()))
        return worker

    async def output(self) -> tuple[str, str]:
        """``(stdout, stderr)`` of a worker started with ``stderr=True``, once it has exited."""
        assert self.process.returncode is not None and len(self._readers) == 2
        err, out = await asyncio.gather(*self._readers)
        return (b"".join(self._stdout) + out).decode(), err.decode()

    @classmethod
    async def for_engine(
        cls,
        engine: Engine,
        *,
        app: str,
        task_queue: str | None = None,
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
        extra_args: tuple[str, ...] = (),
    ) -> WorkerProcess:
        """:meth:`start` on ``engine``'s dev server and database, on its task queue unless ``task_queue`` is given."""
        return await cls.start(
            app=app,
            address=engine.temporal_address,
            task_queue=task_queue or engine.tk.task_queue,
            database_url=engine.database_url,
            env=env,
            cwd=cwd,
            extra_args=extra_args,
        )

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self.process.pid

    async def _wait_ready(self, timeout: float = 60.0) -> str:
        assert self.process.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                line = await self.process.stdout.readline()
                if not line:
                    raise RuntimeError(f"worker exited before it was ready (code {await self.process.wait()})")
                self._stdout.append(line)
                if line.startswith(b"worker ready"):
                    return line.decode().strip()
                if line.startswith(b"{") and str(json.loads(line).get("message", "")).startswith("worker ready"):
                    return line.decode().strip()  # --log-format json

    async def kill(self) -> None:
        """SIGKILL: no shutdown, no cleanup, exactly like a lost machine."""
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()

    async def stop(self) -> int:
        """SIGTERM (graceful shutdown); returns the exit code."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.process.wait(), 30)
