"""What the dev server does per turn, counted from its own metrics: TurnKit's turn against bare Temporal's.

The dev server's CPU per turn is too noisy on a shared machine to tell a 5-10% difference (the same bare workload
varies by a quarter or more between bursts), but its Prometheus counters are exact: requests per service and operation,
persistence calls, tasks added and processed, timer notifications, payload bytes. :func:`bench.cpu_profile`'s
``--against-bare`` reads them around every burst, and :func:`report` prints the counters whose per-turn medians
differ between the two systems. Labels that name a system's own task queue, workflow type or activity type are
dropped, so the same work under other names counts as the same.
"""

from __future__ import annotations

import re
import statistics
import urllib.request
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Final

from temporalio.testing import WorkflowEnvironment

from bench.peers.serve import temporal_cli
from bench.peers.turnkit_app import SERVER_FLAGS
from turnkit._temporal.devserver import fast_task_loading_args

__all__ = ["PUBLISH_INTERVAL", "counters", "differences", "read_counters", "report", "start_dev_server"]

#: How often the dev server publishes its counters, in seconds (with margin): a burst's counts are complete this long
#: after it ends.
PUBLISH_INTERVAL: Final = 1.5

#: Labels whose values name a system's own queues and types, or a process: dropped before systems are compared.
_OWN_LABELS: Final = re.compile(
    r"(?<=[{,])(taskqueue|task_queue|workflowType|workflow_type|activityType|activity_type|namespace_id|worker_build_id|"
    r'partition|identity|host|instance)="[^"]*",?'
)


async def start_dev_server(metrics_port: int) -> WorkflowEnvironment:
    """A dev server set up as the benches' (TurnKit's search attributes, the tests' fast task loading), publishing its
    counters on ``metrics_port``."""
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        dev_server_extra_args=[*SERVER_FLAGS, *fast_task_loading_args(), "--metrics-port", str(metrics_port)],
        dev_server_log_level="never",
    )


def counters(text: str) -> dict[str, float]:
    """The counters of a Prometheus text exposition (``# TYPE name counter`` only), keyed by name and labels with the
    system-specific labels dropped; series that become equal are summed."""
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ") and line.endswith(" counter")}
    found: defaultdict[str, float] = defaultdict(float)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        if series.split("{", 1)[0] not in names:
            continue
        try:
            found[_OWN_LABELS.sub("", series).replace(",}", "}")] += float(value)
        except ValueError:
            continue
    return dict(found)


def read_counters(port: int) -> dict[str, float]:
    """The dev server's counters now (its ``--metrics-port``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return counters(response.read().decode())


def differences(
    ours: Sequence[Mapping[str, float]], bare: Sequence[Mapping[str, float]], turns: int, *, least: float = 0.05
) -> list[tuple[str, float, float]]:
    """``(counter, ours per turn, bare per turn)`` for each counter whose per-turn medians over the bursts differ by
    more than ``least`` and by more than 5% of the larger, sorted by counter. ``ours`` and ``bare``: each burst's
    increase of every counter; ``turns``: turns per burst."""

    def per_turn(bursts: Sequence[Mapping[str, float]], key: str) -> float:
        return statistics.median(each.get(key, 0.0) for each in bursts) / turns

    keys = sorted({key for each in [*ours, *bare] for key in each})
    rows: list[tuple[str, float, float]] = []
    for key in keys:
        mine, theirs = per_turn(ours, key), per_turn(bare, key)
        gap = abs(mine - theirs)
        if gap > least and gap > 0.05 * max(abs(mine), abs(theirs)):
            rows.append((key, mine, theirs))
    return rows


def report(ours: Sequence[Mapping[str, float]], bare: Sequence[Mapping[str, float]], turns: int) -> None:
    """Print :func:`differences` as a table."""
    rows = differences(ours, bare, turns)
    print(f"\nthe dev server's counters per turn where TurnKit's and bare Temporal's differ ({len(ours)} bursts each):")
    print(f"  {'TurnKit':>10} {'bare':>10}  counter")
    for key, mine, theirs in rows:
        print(f"  {mine:>10.2f} {theirs:>10.2f}  {key}")
    if not rows:
        print("  (none)")
