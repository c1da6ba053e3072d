"""Layers a newcomer can see: the workflow side loads only the kernel (checked in a fresh interpreter, package
``__init__``s included); no import cycle in ``turnkit`` (each module's packages count as imported, since their
``__init__`` runs first); client code starts and messages workflows by name, never by importing them; the names and
the activity declarations agree with what a worker registers; ``turnkit.__all__`` is the application API only."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio import workflow

import turnkit
from tests.sources import parse
from turnkit._activities import build_activities
from turnkit._workflows.lane import ConversationWorkflow
from turnkit._workflows.turn import TurnWorkflow
from turnkit.kernel.activities import declared_activities
from turnkit.kernel.names import DELIVER_SIGNAL, LANE_WORKFLOW, SUBMIT_UPDATE, TURN_WORKFLOW, WAKE_SIGNAL

ROOT = Path(__file__).resolve().parent.parent

#: What no workflow module may load, directly or through a package ``__init__``: I/O libraries and provider SDKs.
HEAVY = ("sqlalchemy", "alembic", "asyncpg", "aiosqlite", "openai", "anthropic", "google.genai", "httpx", "mcp")


def _heavy(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded if any(m == h or m.startswith(f"{h}.") for h in HEAVY))


def _modules() -> dict[str, Path]:
    """Every module of the installed package ``turnkit`` (its ``_workflows`` and ``_activities`` links followed)."""
    modules: dict[str, Path] = {}
    for directory, _, files in os.walk(ROOT / "turnkit", followlinks=True):
        base = Path(directory)
        if "migrations" in base.parts or "__pycache__" in base.parts:
            continue
        for file in files:
            if file.endswith(".py"):
                path = base / file
                name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                modules[name] = path
    return modules


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Our modules that ``path`` imports at run time (anywhere, functions included; not under TYPE_CHECKING)."""
    tree = parse(path.read_text(), str(path))
    typing_only = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
        for statement in branch.body
        for node in ast.walk(statement)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            # Importing a.b.c runs a/__init__.py and a/b/__init__.py first: those are imports too.
            while name:
                if name in modules:
                    found.add(name)
                name = name.rpartition(".")[0]
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    return components


def test_turnkit_has_no_import_cycle() -> None:
    """Module-level and function-level imports alike, package ``__init__``s included."""
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    assert _cycles(graph) == []


def test_workflow_code_imports_only_the_kernel() -> None:
    """What ``workflows/`` imports of TurnKit, statically: the kernel, and each other."""
    modules = _modules()
    imported = {
        other
        for name, path in modules.items()
        if name.startswith("turnkit._workflows")
        for other in _imports(path, modules)
        if not other.startswith(("turnkit._workflows", "turnkit.kernel")) and other != "turnkit"
    }
    assert imported == set()


LOADED_BY = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_by(*modules: str) -> set[str]:
    """The modules a fresh interpreter holds after importing ``modules`` (run outside the checkout)."""
    done = subprocess.run(
        [sys.executable, "-c", LOADED_BY, *modules], capture_output=True, text=True, cwd="/", check=True, timeout=60
    )
    import json

    return set(json.loads(done.stdout))


@pytest.mark.parametrize(
    "entry",
    [
        "turnkit._workflows",
        "turnkit._workflows.turn",
        "turnkit._workflows.lane",
        "turnkit._workflows.requests",
        "turnkit.kernel.activities",
        "turnkit.workflow",
    ],
)
def test_the_workflow_side_loads_only_the_kernel(entry: str) -> None:
    """At run time, in a fresh interpreter: importing a workflow module (TurnKit's, or ``turnkit.workflow``, which a
    team's workflows import) leaves no SQLAlchemy, database driver, provider SDK or HTTP client in ``sys.modules``,
    and of TurnKit only the kernel and the workflow modules themselves."""
    loaded = _loaded_by(entry)
    assert _heavy(loaded) == []
    ours = {m for m in loaded if m.split(".")[0] == "turnkit"}
    allowed = ("turnkit.kernel", "turnkit._workflows", "turnkit._lazy", "turnkit.workflow")
    assert sorted(m for m in ours if m != "turnkit" and not m.startswith(allowed)) == []


def test_import_turnkit_loads_nothing_until_a_name_is_used() -> None:
    """``import turnkit`` (which every ``turnkit.*`` import runs first, the sandbox's too) loads no other module of
    TurnKit; its names load on first use."""
    loaded = _loaded_by("turnkit")
    assert sorted(m for m in loaded if m.startswith("turnkit.")) == ["turnkit._lazy"]
    assert _heavy(loaded) == []


def test_client_code_never_imports_the_workflows() -> None:
    """``ask``, deliveries and repair start and message workflows by their registered names."""
    modules = _modules()
    importers = {
        name
        for name, path in modules.items()
        if not name.startswith("turnkit._workflows")
        and any(m.startswith("turnkit._workflows") for m in _imports(path, modules))
    }
    assert importers == {"turnkit.plugin"}  # the worker's plugin registers them; nothing else needs their code


def test_a_worker_registers_every_declared_activity() -> None:
    """Each activity a workflow calls by method reference (:mod:`turnkit.kernel.activities`) has an implementation
    registered under its name, and no other named activity exists (the tool activity is the one dynamic one)."""
    declared = set(declared_activities())
    registered: set[str] = set()
    dynamic = 0
    for fn in build_activities(None):  # type: ignore[arg-type]  # the registry only: no activity runs here
        definition = getattr(fn, "__temporal_activity_definition")
        if definition.name is None:
            dynamic += 1
        else:
            registered.add(definition.name)
    assert registered == declared
    assert dynamic == 1


def test_the_public_api_is_the_application_api() -> None:
    """Every name in ``turnkit.__all__`` resolves; the engine's services are not among them."""
    for name in turnkit.__all__:
        assert getattr(turnkit, name) is not None, name
    assert not {"Store", "settings", "Settings", "resolve_agent", "registered_agents"} & set(turnkit.__all__)
    assert sorted(name for name in turnkit.__all__ if name.startswith("_")) == []


def test_registered_names_agree_with_the_definitions() -> None:
    lane = workflow._Definition.must_from_class(ConversationWorkflow)  # pyright: ignore[reportPrivateUsage]
    turn = workflow._Definition.must_from_class(TurnWorkflow)  # pyright: ignore[reportPrivateUsage]
    assert (lane.name, turn.name) == (LANE_WORKFLOW, TURN_WORKFLOW)
    assert SUBMIT_UPDATE in lane.updates
    assert {DELIVER_SIGNAL, WAKE_SIGNAL} <= set(lane.signals)
