"""Real worker processes for crash tests: start one, kill it with SIGKILL, start another."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class WorkerProcess:
    """``python worker.py --app <module>`` as a child process on the test's task queue and database."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.ready_line = ""

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
    ) -> WorkerProcess:
        """Start the worker and wait for its ready line; ``extra_args`` go to ``worker.py`` (``--only tools``)."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(ROOT / "worker.py"),
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
        )
        worker = cls(process)
        worker.ready_line = await worker._wait_ready()
        return worker

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
                if line.startswith(b"worker ready"):
                    return line.decode().strip()

    async def kill(self) -> None:
        """SIGKILL: no shutdown, no cleanup, exactly like a lost machine."""
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()

    async def stop(self) -> int:
        """SIGTERM (graceful shutdown); returns the exit code."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.process.wait(), 30)
