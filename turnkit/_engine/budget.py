"""Root-tree budgets (behaviour §6), checked inside the transaction that reserves.

Limits are the **root** turn's snapshot (``options.budget_limits``), and usage is counted over every turn sharing
the root, so parallel children share one budget. Usage is the root row's running totals
(:meth:`~turnkit.store.store.StoreTx.tree_usage`: one row, however long the turn or large the tree), which the store
keeps equal to the sums over the records (behaviour §6.3) by updating them in the transaction of each counted write; the
checks also accept the records themselves (:meth:`TreeUsage.from_records`). Callers hold the root turn's row lock
while they check and write, which makes check-and-reserve atomic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from turnkit._engine.limits import check_limits
from turnkit.config import settings
from turnkit.kernel.records import ToolExecutionRecord, TreeUsage, TurnRecord
from turnkit.kernel.turn_state import BudgetLimits

__all__ = [
    "COST_LIMIT",
    "MAX_DEPTH",
    "MAX_ITERATIONS",
    "MAX_TOOL_EXECUTIONS",
    "check_limits",
    "counts_against_budget",
    "depth_denial",
    "iteration_denial",
    "limit_of",
    "limits_of",
    "spend_denial",
    "tool_execution_denial",
]

MAX_ITERATIONS: Final = "maximum iterations reached"
MAX_TOOL_EXECUTIONS: Final = "maximum tool executions reached"
COST_LIMIT: Final = "cost limit reached"
MAX_DEPTH: Final = "maximum sub-agent depth reached"


def limit_of(root: TurnRecord, name: str) -> Any:
    """One limit of :func:`limits_of` (``max_iterations``, ``max_spend``…), without building the whole set: the
    checks of each model and tool call read one or two limits each."""
    snapshot = root.options.budget_limits
    if snapshot is not None and name in snapshot.model_fields_set:
        return getattr(snapshot, name)
    if name == "max_tool_executions_by_name":
        return {str(k): v for k, v in settings.max_tool_executions_by_name.items()}
    return getattr(settings, name)


def limits_of(root: TurnRecord) -> BudgetLimits:
    """The root's snapshotted limits, with the process settings for any limit it lacks (rows older than a limit)."""
    return BudgetLimits(**{name: limit_of(root, name) for name in BudgetLimits.model_fields})


def iteration_denial(root: TurnRecord, tree: TreeUsage | Sequence[TurnRecord]) -> str | None:
    """The error if one more model request would exceed ``max_iterations`` over the tree, else None."""
    limit = limit_of(root, "max_iterations")
    used = _usage(tree).iterations
    return MAX_ITERATIONS if limit is not None and used >= int(limit) else None


def depth_denial(root: TurnRecord, depth: int) -> str | None:
    """The error if a turn at ``depth`` is deeper than the root's ``max_depth`` (a root is depth 0)."""
    limit = limit_of(root, "max_depth")
    return MAX_DEPTH if limit is not None and depth > int(limit) else None


def counts_against_budget(execution: ToolExecutionRecord) -> bool:
    """Whether an execution uses tool budget: all but cancelled and budget-denied ones (behaviour §6.3)."""
    return execution.counts_against_budget


def tool_execution_denial(
    root: TurnRecord, tree_executions: TreeUsage | Sequence[ToolExecutionRecord], tool_name: str
) -> str | None:
    """The error if one more execution of ``tool_name`` would exceed the tree's limits, else None.

    The usage (or ``tree_executions``) must not include the execution being reserved.
    """
    usage = tree_executions if isinstance(tree_executions, TreeUsage) else TreeUsage.from_records((), tree_executions)
    total_limit = limit_of(root, "max_tool_executions")
    if total_limit is not None and usage.tool_executions >= int(total_limit):
        return MAX_TOOL_EXECUTIONS
    name_limit = limit_of(root, "max_tool_executions_by_name").get(tool_name)
    if name_limit is not None and usage.tool_executions_by_name.get(tool_name, 0) >= int(name_limit):
        return f"maximum executions reached for tool {tool_name}"
    return None


def spend_denial(root: TurnRecord, tree: TreeUsage | Sequence[TurnRecord]) -> str | None:
    """The error if observed spend over the tree is strictly above ``max_spend``, else None."""
    limit = limit_of(root, "max_spend")
    if limit is None:
        return None
    return COST_LIMIT if _usage(tree).cost > float(limit) else None


def _usage(tree: TreeUsage | Sequence[TurnRecord]) -> TreeUsage:
    return tree if isinstance(tree, TreeUsage) else TreeUsage.from_records(tree)
