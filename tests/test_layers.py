"""Layers a newcomer can see (issue 9): no import cycle among ``turnkit``, ``workflows`` and ``activities``; client
code starts and messages workflows by name, never by importing them; the names agree with the definitions."""

from __future__ import annotations

import ast
from pathlib import Path

from temporalio import workflow

from turnkit.workflow_names import DELIVER_SIGNAL, LANE_WORKFLOW, SUBMIT_UPDATE, TURN_WORKFLOW, WAKE_SIGNAL
from workflows.lane import ConversationWorkflow
from workflows.turn import TurnWorkflow

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("turnkit", "workflows", "activities")


def _modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" not in path.parts:
                modules[".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")] = path
    return modules


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Our modules that ``path`` imports at run time (anywhere, functions included; not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
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
            if name:
                found.add(name)
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


def test_our_packages_have_no_import_cycle() -> None:
    """Issue 9: the import cycle across turnkit/, workflows/ and activities/ is gone (and stays gone)."""
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    assert _cycles(graph) == []


def test_client_code_never_imports_the_workflows() -> None:
    """Issue 9: ``ask``, deliveries and repair start and message workflows by their registered names."""
    modules = _modules()
    importers = {
        name
        for name, path in modules.items()
        if name.startswith("turnkit") and any(m.startswith("workflows") for m in _imports(path, modules))
    }
    assert importers == {"turnkit.plugin"}  # the worker's plugin registers them; nothing else needs their code


def test_registered_names_agree_with_the_definitions() -> None:
    lane = workflow._Definition.must_from_class(ConversationWorkflow)  # pyright: ignore[reportPrivateUsage]
    turn = workflow._Definition.must_from_class(TurnWorkflow)  # pyright: ignore[reportPrivateUsage]
    assert (lane.name, turn.name) == (LANE_WORKFLOW, TURN_WORKFLOW)
    assert SUBMIT_UPDATE in lane.updates
    assert {DELIVER_SIGNAL, WAKE_SIGNAL} <= set(lane.signals)
