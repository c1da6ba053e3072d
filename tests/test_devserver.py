"""The embedded dev server never outlives its program (issue 8 item 14).

A real ``python -m turnkit.demo --hold`` runs its job on the embedded defaults (in a temporary directory), then is
stopped as a service manager (SIGTERM), a terminal (SIGINT) or the kernel's OOM killer (SIGKILL) would; its
``temporal server start-dev`` child, found through ``/proc``, must be gone afterwards.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

import turnkit
from tests.workers import ROOT
from turnkit import runtime

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


def _children(pid: int) -> list[int]:
    """Pids whose parent is ``pid``."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as gone: it holds no port and no file)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_until(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


#: ``python -m turnkit.demo`` with SIGINT handled as it is when the demo is started from a terminal. A process
#: inherits an ignored SIGINT (a shell starts background jobs so, and so did the harness that ran this suite in the
#: background), and Python then leaves it ignored: the demo would never see the SIGINT that this test sends it.
_AS_FROM_A_TERMINAL = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('turnkit.demo', run_name='__main__', alter_sys=True)"
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["term", "int", "kill"])
def test_stopping_the_demo_stops_its_dev_server(tmp_path: Path, signum: signal.Signals) -> None:
    """The demo's dev server dies with the demo, however the demo is stopped; SIGTERM and SIGINT exit cleanly."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TEMPORAL_ADDRESS", None)
    env.pop("TURNKIT_DATABASE_URL", None)
    demo = subprocess.Popen(
        [sys.executable, "-c", _AS_FROM_A_TERMINAL, "--hold"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            if "press Ctrl-C to stop" in line:
                break
        else:
            raise AssertionError(f"the demo ended early: {demo.wait()} {demo.stderr.read() if demo.stderr else ''}")
        [server] = [pid for pid in _children(demo.pid) if "temporal" in Path(f"/proc/{pid}/cmdline").read_text()]
        assert _alive(server)
        demo.send_signal(signum)
        code = demo.wait(timeout=60)
        if signum == signal.SIGTERM:
            assert code == 128 + signal.SIGTERM, demo.stderr.read() if demo.stderr else ""
        elif signum == signal.SIGINT:
            assert code == 0, demo.stderr.read() if demo.stderr else ""
        _wait_until(lambda: not _alive(server), 30, f"dev server {server} to exit")
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()


PROGRAM = '''
import asyncio, pathlib, turnkit
from turnkit.testing import ScriptedClient, call_tools

@turnkit.tool(timeout=30)
async def slow_write() -> dict:
    """Write a file after a second."""
    pathlib.Path("started").touch()
    await asyncio.sleep(1.5)
    pathlib.Path("finished").touch()
    return {}

def script(request):
    return "done" if any(m["role"] == "tool" for m in request.messages) else call_tools(("slow_write", {}))

agent = turnkit.register(turnkit.Agent("writer", model="scripted", tools=[slow_write], client=ScriptedClient(script)))

async def main():
    async with turnkit.connect(ui=False) as tk, tk.worker():
        await (await tk.conversation(agent)).ask("write")

if __name__ == "__main__":
    asyncio.run(main())
'''


def test_sigterm_lets_the_worker_drain_before_the_server_stops(tmp_path: Path) -> None:
    """issue 8 item 14: SIGTERM while a tool runs: the worker drains (the tool finishes), then the embedded dev
    server stops and the program exits with 143."""
    (tmp_path / "program.py").write_text(PROGRAM)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TEMPORAL_ADDRESS", None)
    env.pop("TURNKIT_DATABASE_URL", None)
    program = subprocess.Popen([sys.executable, "program.py"], cwd=tmp_path, env=env, stderr=subprocess.PIPE)
    try:
        _wait_until(lambda: (tmp_path / "started").exists() or program.poll() is not None, 60, "the tool to start")
        assert program.poll() is None, program.stderr.read() if program.stderr else ""
        [server] = [pid for pid in _children(program.pid) if "temporal" in Path(f"/proc/{pid}/cmdline").read_text()]
        program.send_signal(signal.SIGTERM)
        assert program.wait(timeout=60) == 128 + signal.SIGTERM, program.stderr.read() if program.stderr else ""
        assert (tmp_path / "finished").exists()  # the running tool was allowed to finish
        _wait_until(lambda: not _alive(server), 30, f"dev server {server} to exit")
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()


async def test_the_embedded_dev_server_starts_again_when_its_port_was_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port found free can be taken before the dev server binds it (the demo's server once exited so under this
    suite: "address already in use"). ``connect()`` then starts it again on new ports and connects; the taken
    port's failure is in ``.turnkit/temporal.log``."""
    monkeypatch.chdir(tmp_path)
    for name in ("TEMPORAL_ADDRESS", "TURNKIT_DATABASE_URL", "TEMPORAL_PROFILE", "TEMPORAL_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    free_port = runtime._free_port  # pyright: ignore[reportPrivateUsage]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = int(holder.getsockname()[1])
        handed = iter([taken])  # the first port handed out is the taken one, then free ones
        monkeypatch.setattr(runtime, "_free_port", lambda: next(handed, None) or free_port())
        async with turnkit.connect(database_url=f"sqlite+aiosqlite:///{tmp_path / 'store.db'}") as tk:
            info = await tk.client.workflow_service.get_system_info(GetSystemInfoRequest())
            address = tk.client.service_client.config.target_host
    assert info.server_version and address != f"127.0.0.1:{taken}"
    assert "address already in use" in (tmp_path / ".turnkit" / "temporal.log").read_text()
